"""`orch model sync`: flags, per-node progress, the summary and JSON. CLI only.

The work is done by ``orchestrator.workflows.model_sync``; this module builds its dependencies
(SSH runners with orch's known_hosts, a local runner for ``--from local``), shows step lines and
per-node byte counters on stderr (at most one line per node per second) and prints the result.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.output import print_json
from orchestrator.cli.params import FiniteFloat
from orchestrator.cli.wiring import known_hosts_path
from orchestrator.errors import ModelSyncError, UsageError

PROGRESS_EVERY_S = 1.0


def _size(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds / (1 << 20):,.1f} MiB/s" if seconds > 0 else "-"


class _Progress:
    """Step lines as they come; a node's byte counter at most once per PROGRESS_EVERY_S."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last: dict[str, float] = {}

    def __call__(self, ev: Any) -> None:
        if not self.enabled:
            return
        if ev.node is None:
            click.echo(f"- {ev.message}", err=True)
            return
        now = time.monotonic()
        if ev.received < ev.total and now - self.last.get(ev.node, 0.0) < PROGRESS_EVERY_S:
            return
        self.last[ev.node] = now
        pct = 100.0 * ev.received / ev.total if ev.total else 100.0
        click.echo(f"  {ev.node}: {_size(ev.received)} / {_size(ev.total)} ({pct:.0f}%), {_rate(ev.received, ev.seconds)}", err=True)


def print_plan(result: Any) -> None:
    plan = result.plan
    click.echo(f"model {result.model}: {plan.to_dict()['files']} files, {_size(plan.to_dict()['model_bytes'])} "
              f"from {result.source}:{result.source_path} to {result.final_path}")  # fmt: skip
    for n in plan.nodes:
        if n.problem:
            click.echo(f"  {n.node}: refused: {n.problem}")
        elif n.up_to_date:
            click.echo(f"  {n.node}: up to date")
        else:
            extra = f", {len(n.link)} already there, {len(n.keep)} from an earlier run" if (n.link or n.keep) else ""
            rm = f", removes {len(n.remove)} file(s) not in the source" if n.remove else ""
            click.echo(f"  {n.node}: would receive {len(n.receive)} file(s), {_size(n.receive_bytes)}{extra}{rm}")
            for f in n.receive:
                click.echo(f"    {f.rel} ({_size(f.size)})")
    for p in plan.problems:
        click.echo(f"  refused: {p}")
    if plan.chain:
        click.echo(f"chain: {' -> '.join([result.source, *plan.chain])}, {_size(plan.stream_bytes)} sent once")


def print_summary(result: Any) -> None:
    if result.action == "noop":
        click.echo(f"nothing to do: {result.final_path} matches the source on every node ({len(result.nodes)})")
        return
    secs = result.seconds
    click.echo(f"{result.action}: {_size(result.sent_bytes)} sent from {result.source} in {secs:.1f} s "
              f"({_rate(result.sent_bytes, secs)}); {result.final_path}")  # fmt: skip
    for n in result.nodes:
        mark = "ok " if n.verified else "FAILED"
        detail = f"{_size(n.written_bytes)} written, {_rate(n.written_bytes, n.seconds)}" if n.action == "synced" else n.action
        click.echo(f"  {mark} {n.node}: {detail}" + (f": {n.error}" if n.error else ""))


@click.group()
def model() -> None:
    """Model files on the nodes."""


@model.command("sync")
@click.argument("cluster_yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", "model_ref", required=True, help="NAME (a folder of the manifest's model_store) or PATH to a model folder.")
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
    from orchestrator.manifest.load import load_manifest_file

    manifest = load_manifest_file(cluster_yaml)
    result = run_sync(manifest, ctx.obj["state_dir"], model_ref, source, dry_run, max_rate, accept_new_host_keys, progress=not as_json)
    if as_json:
        print_json(result.to_dict())
    elif dry_run:
        print_plan(result)
    else:
        print_summary(result)
    if not result.ok:
        failed = [n.node for n in result.nodes if not n.verified]
        raise ModelSyncError(f"model sync failed on {', '.join(failed)}", hint="run the same command again: verified files are not sent again")


def run_sync(manifest: Any, state_dir: Path, model_ref: str, source: str, dry_run: bool, max_rate: float | None,
             accept_new_host_keys: bool, progress: bool = True) -> Any:  # fmt: skip
    """The sync workflow with its real dependencies (also used by `orch rollout --sync-model`)."""
    from orchestrator.remote.connect import open_runners
    from orchestrator.remote.local import LocalRunner
    from orchestrator.workflows.model_sync import SyncDeps, SyncOptions, sync_model

    if not model_ref.strip():
        raise UsageError("--model is empty", hint="--model NAME or --model /path/to/model")
    known_hosts = known_hosts_path(manifest, state_dir)
    deps = SyncDeps(
        open_runners=lambda m: open_runners(m, known_hosts, accept_new_host_keys),
        local=LocalRunner("local"),
        local_python=sys.executable,
        progress=_Progress(progress),
    )
    rate = max_rate * (1 << 20) if max_rate else None
    return sync_model(manifest, deps, SyncOptions(model=model_ref, source=source, dry_run=dry_run, max_rate=rate))
