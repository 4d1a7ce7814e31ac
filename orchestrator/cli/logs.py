"""`orch logs [CLUSTER_YAML]`: the logs a user needs when something fails, read over SSH. CLI only.

A replica's log (vLLM's engine writes there), an engine worker's by rank, a node's raylet; the
last N lines of each, then with --follow what is written next, until Ctrl-C (exit 0). The files
are found and read by ``workflows/logs.py`` (the doctor's log scan on each node).
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("logs")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--replica", default=None, help="Only this replica (its id, or the start of it) [default: every engine replica].")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="An engine worker's log instead: its rank, 0-based in vLLM's order (GPU layout: vLLM's Ray executor).")  # fmt: skip
@click.option("--raylet", is_flag=True, help="The raylet's log of every node (or of --node) instead of a replica's.")
@click.option("--node", default=None, help="Only what runs on this manifest node.")
@click.option("--model", "model", default=None, help="The served model whose replicas [default: the only one served].")
@click.option("--tail", "tail", type=click.IntRange(min=0, max=1_000_000), default=100, show_default=True, help="Lines shown from the end of each file.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is written next, until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {cluster, logs: [{source, node, path, lines}], errors: [{source, node, error}]} (not with --follow).")  # fmt: skip
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of nodes contacted for the first time.")
@click.pass_context
def logs(ctx: click.Context, cluster_yaml: Path | None, replica: str | None, rank: int | None, raylet: bool, node: str | None,
         model: str | None, tail: int, follow: bool, as_json: bool, accept_new_host_keys: bool) -> None:  # fmt: skip
    """Show the logs a failure is in: a replica's, an engine worker's, a node's raylet.

    \b
    Examples:
      orch logs                          # every engine replica's log, last 100 lines
      orch logs --replica 6t2h --follow  # one replica, then what it writes next
      orch logs --rank 3                 # engine worker rank 3 (GPU layout)
      orch logs --model chat             # several models: the replicas of one
      orch logs --raylet --node w1 --tail 50
    Without CLUSTER_YAML, the one cluster recorded by `orch up`. Exit 4 when a node cannot be
    reached (after what was read), 5 when no cluster is up; Ctrl-C ends --follow with exit 0.
    """
    from orchestrator.cli.output import print_json
    from orchestrator.cli.wiring import known_hosts_path, resolve_manifest
    from orchestrator.errors import UnreachableError, UsageError
    from orchestrator.remote.connect import open_runners
    from orchestrator.serve.ray_io.client import open_serve_client
    from orchestrator.state import StateStore
    from orchestrator.workflows.logs import LogRequest, LogsDeps, find_logs, follow_files

    if raylet and (replica or rank is not None):
        raise UsageError("--raylet shows Ray's own log: it takes no --replica or --rank", hint="e.g. orch logs --raylet --node w1")
    if as_json and follow:
        raise UsageError("--json prints the lines read once: it takes no --follow", hint="orch logs --follow prints the lines as they come")
    state_dir: Path = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, "logs")
    kind = "raylet" if raylet else ("worker" if rank is not None else "replica")
    known_hosts = known_hosts_path(manifest, state_dir)
    deps = LogsDeps(state=StateStore(state_dir), open_runners=lambda m: open_runners(m, known_hosts, accept_new_host_keys),
                    open_serve=open_serve_client)  # fmt: skip
    found = find_logs(manifest, LogRequest(kind=kind, replica=replica, rank=rank, node=node, tail=tail, model=model), deps)
    unreached = [source.target.node for source, _, error in found if error is not None and _unreached(error)]
    files = [t for _, tails, _ in found for t in tails]
    if as_json:
        print_json({"cluster": manifest.name,
                    "logs": [{"source": source.label, "node": t.node, "path": t.path, "lines": list(t.lines)} for source, tails, _ in found for t in tails],
                    "errors": [{"source": source.label, "node": source.target.node, "error": error} for source, _, error in found if error is not None]})  # fmt: skip
    else:
        for source, tails, error in found:
            if error is not None:
                click.echo(f"==> {source.label}: {error}", err=True)
            for t in tails:
                click.echo(f"==> {source.label}: {t.node}:{t.path} <==")
                for line in t.lines:
                    click.echo(line)
    if unreached:
        raise UnreachableError(f"could not read the logs on {', '.join(sorted(set(unreached)))}", hint="see `orch runbook NODE_UNREACHABLE`")
    if follow and files:
        with open_runners(manifest, known_hosts, accept_new_host_keys) as runners:
            try:
                for node_name, line in follow_files(runners, files):
                    click.echo(f"{node_name}: {line}" if len({f.node for f in files}) > 1 else line)
            except KeyboardInterrupt:
                return  # Ctrl-C is how --follow ends


def _unreached(error: str) -> bool:
    """The node's runner could not connect (the messages of remote/ssh.py), rather than no log."""
    return "cannot reach" in error or "refused authentication" in error
