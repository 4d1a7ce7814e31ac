"""`orch model sync`: flags, per-node progress, the summary and JSON. CLI only.

The work is done by ``orchestrator.workflows.model_sync`` with the dependencies of
``cli.wiring.model_sync_deps``; ``cli.sync_display`` shows its progress and result.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.output import print_json
from orchestrator.cli.params import FiniteFloat
from orchestrator.errors import ModelSyncError


@click.group()
def model() -> None:
    """Model files on the nodes."""


@model.command("sync")
@click.argument("cluster_yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", "model_ref", required=True, help="NAME (a folder of the manifest's model_store) or PATH to a model folder (./NAME for one here; a Hub repo id is refused: download it first).")
@click.option("--from", "source", default="local", show_default=True, help="Where the model is: local (this machine) or a node name.")
@click.option("--dry-run", is_flag=True, help="Say per node which files and bytes would be copied; copy nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--max-rate", type=FiniteFloat(min=0.01), default=None, help="Send at most this many MiB/s (leave room for serving traffic).")
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of nodes contacted for the first time.")
@click.pass_context
def sync(ctx: click.Context, cluster_yaml: Path, model_ref: str, source: str, dry_run: bool, as_json: bool,
         max_rate: float | None, accept_new_host_keys: bool) -> None:  # fmt: skip
    """Copy a model folder to <model_store>/<name> on every node, verified by sha256.

    \b
    The data goes node to node over the manifest's interface (a pipelined chain: the source sends
    it once); files a node already holds are not sent; the model appears at its final path only
    complete and verified (staging folder + rename); an interrupted sync resumes. Exit 3 when a
    node is refused before sending (low disk, a path orch does not own), 1 when a node failed.
    """
    from orchestrator.cli.sync_display import SyncProgress, print_plan, print_summary
    from orchestrator.cli.wiring import model_sync_deps
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.workflows.model_sync import SyncOptions, sync_model

    manifest = load_manifest_file(cluster_yaml)
    deps = model_sync_deps(manifest, ctx.obj["state_dir"], accept_new_host_keys, SyncProgress(not as_json))
    rate = max_rate * (1 << 20) if max_rate else None
    result = sync_model(manifest, deps, SyncOptions(model=model_ref, source=source, dry_run=dry_run, max_rate=rate))
    if as_json:
        print_json(result.to_dict())
    elif dry_run:
        print_plan(result)
    else:
        print_summary(result)
    if not result.ok:
        failed = [n.node for n in result.nodes if not n.verified]
        raise ModelSyncError(f"model sync failed on {', '.join(failed)}", hint="run the same command again: verified files are not sent again")
