"""`orch up` and `orch down`: flags, progress display, tables and JSON. CLI only.

The work is done by ``orchestrator.workflows.cluster``; this module builds its real dependencies
(state store, SSH runners with orch's known_hosts, the dashboard through an SSH tunnel), shows
progress on stderr (a spinner on a terminal, plain lines otherwise), and prints results on stdout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from orchestrator.cli.output import console, print_json
from orchestrator.cli.params import FiniteFloat
from orchestrator.cli.wiring import cluster_deps, progress_display
from orchestrator.collective.verdict import summary_line
from orchestrator.preflight.findings import report_json

SEVERITY_STYLE = {"fail": "bold red", "warn": "yellow", "info": "dim"}


def findings_table(findings: list) -> Any:
    """Findings grouped by node (cluster-wide first), two lines each: ``SEVERITY CODE on NODE:
    message`` and ``  hint: ...``. Lines rather than a table, so that neither a narrow window nor
    a log ever cuts a code or a hint."""
    from rich.console import Group
    from rich.text import Text

    from orchestrator.preflight.findings import by_node

    parts: list[Any] = [Text("preflight findings", style="bold")]
    for node, items in by_node(findings).items():
        for f in items:
            parts.append(Text.assemble((f"{f.severity} {f.code}", SEVERITY_STYLE.get(f.severity, "")),
                                       f" on {node or '(cluster)'}: {f.message}"))  # fmt: skip
            if f.hint:
                parts.append(Text(f"  hint: {f.hint}"))
    return Group(*parts)


def nodes_table(states: list, title: str = "Ray nodes") -> Any:
    from rich.table import Table

    from orchestrator.cluster.node_state import current_by_name

    table = Table(title=title, title_justify="left")
    for col in ("node", "address", "state", "GPUs", "node id"):
        table.add_column(col)
    for name, s in sorted(current_by_name(states).items()):
        table.add_row(name, s.address, s.state, f"{s.gpus_total:g}", s.node_id[:12])
    return table


@click.command("up")
@click.argument("cluster_yaml", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--check-only", is_flag=True, help="Run preflight only; start nothing.")
@click.option("--force", is_flag=True, help="Proceed despite preflight warnings (failures always stop).")
@click.option("--dry-run", is_flag=True, help="Print what would change (and the manifest diff) without doing it.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of nodes contacted for the first time.")
@click.option("--timeout", type=FiniteFloat(min=1), default=300.0, show_default=True,
              help="Seconds to wait for every node to be ALIVE after the starts.")  # fmt: skip
@click.option("--skip-collective-check", is_flag=True,
              help="Do not run the all-reduce and all-to-all between the nodes (NCCL/Gloo) before Ray starts.")  # fmt: skip
@click.option("--allow-downtime", is_flag=True,
              help="Accept a change that stops a serving model (a full restart, or a drained node whose replicas have no room elsewhere).")  # fmt: skip
@click.option("--drain-timeout", type=FiniteFloat(min=1), default=600.0, show_default=True,
              help="Seconds Ray and Serve get to move a drained worker's replicas before Ray stops there.")  # fmt: skip
@click.pass_context
def up(ctx: click.Context, cluster_yaml: Path, check_only: bool, force: bool, dry_run: bool, as_json: bool,
       accept_new_host_keys: bool, timeout: float, skip_collective_check: bool, allow_downtime: bool,
       drain_timeout: float) -> None:  # fmt: skip
    """Preflight every node over SSH, then start Ray and wait for all nodes.

    \b
    After the static checks, a short all-reduce between the nodes over their interfaces (NCCL on
    GPU clusters, Gloo on CPU ones) and an all-to-all between every pair of nodes (expert
    parallel's traffic) prove the collective network and record its figures.
    Idempotent: on a healthy cluster with an unchanged manifest it does nothing and says so;
    dead or missing workers are restarted alone. A changed manifest is applied per node while the
    head keeps running: a new worker joins, a removed one is drained (Serve moves its replicas)
    and stopped, a replaced or changed one is drained and restarted alone. A change to the head,
    the Ray port, token auth, the temp dir or the Python restarts every node and needs
    --allow-downtime while a model serves. --dry-run prints the diff and each node's action.
    Exit 3 when preflight stops it, 2 when a gate refuses the change (nothing was changed).
    """
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.workflows.cluster import PreflightStopped, UpOptions
    from orchestrator.workflows.cluster import up as up_workflow

    manifest = load_manifest_file(cluster_yaml)
    state_dir: Path = ctx.obj["state_dir"]
    out = console()
    with progress_display() as progress:
        deps = cluster_deps(manifest, state_dir, accept_new_host_keys, progress)
        options = UpOptions(check_only=check_only, force=force, dry_run=dry_run, timeout=timeout,
                            collective_check=not skip_collective_check, allow_downtime=allow_downtime,
                            drain_timeout=drain_timeout)  # fmt: skip
        try:
            result = up_workflow(manifest, deps, options)
        except PreflightStopped as exc:
            _print_findings(exc.findings, exc.facts, as_json, out, exc.collective)
            raise
    for line in result.warnings:  # on stderr: --json output stays one document
        click.echo(f"warning: {line}", err=True)
    if check_only:
        _print_findings(result.findings, result.facts, as_json, out, result.collective)
        if not as_json:
            out.print(result.message)
        return
    if as_json:
        print_json(result.to_dict())
        return
    if result.findings:
        out.print(findings_table(result.findings))
    if result.plan and result.plan.diff:
        out.print("manifest changes since the last `orch up`:")
        for line in result.plan.diff:
            out.print(f"  {line}", markup=False)
    if result.plan and result.plan.steps:
        out.print("per node:" if result.dry_run else "per node (done):")
        for line in result.plan.steps:
            out.print(f"  {line}", markup=False)
    if result.collective is not None:
        out.print(summary_line(result.collective), markup=False)
    if result.nodes and not result.dry_run:
        out.print(nodes_table(result.nodes))
    out.print(result.message, markup=False)


def _print_findings(findings: list, facts: dict, as_json: bool, out: Any, collective: Any = None) -> None:
    if as_json:
        click.echo(report_json(findings, facts, collective.to_dict() if collective is not None else None))
        return
    if findings:
        out.print(findings_table(findings))
    else:
        out.print("preflight: no findings")
    if collective is not None:
        out.print(summary_line(collective), markup=False)


@click.command("down")
@click.argument("cluster_yaml", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the per-node result as JSON on stdout.")
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of nodes contacted for the first time.")
@click.pass_context
def down(ctx: click.Context, cluster_yaml: Path, as_json: bool, accept_new_host_keys: bool) -> None:
    """Stop Ray (and leftover vLLM) on every node.

    \b
    Nodes are stopped in parallel; only this cluster's processes (tagged with its id, or naming
    its Ray temp dir) of the SSH user. The others are stopped even when a node cannot be reached;
    then the command exits 4 (like every command that cannot reach a node); a node where stopping
    failed makes it exit 5. The cluster is recorded as down only when every node confirmed.
    """
    from rich.table import Table

    from orchestrator.errors import ClusterError
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.workflows.down import down as down_workflow

    manifest = load_manifest_file(cluster_yaml)
    with progress_display() as progress:
        result = down_workflow(manifest, cluster_deps(manifest, ctx.obj["state_dir"], accept_new_host_keys, progress))
    if as_json:
        print_json(result.to_dict())
    else:
        out = console()
        table = Table(title=f"orch down {manifest.name}", title_justify="left")
        for col in ("node", "result", "detail"):
            table.add_column(col, overflow="fold")
        for n in result.nodes:
            verdict = "[green]stopped[/]" if n.ok else ("[yellow]unreachable[/]" if n.unreachable else "[red]failed[/]")
            table.add_row(n.node, verdict, n.detail.removeprefix(f"{n.node}: "))  # the row names the node
        out.print(table)
    unreachable = [n.node for n in result.nodes if n.unreachable]
    failed = [n for n in result.nodes if not n.ok and not n.unreachable]
    if not result.ok and result.was_up:
        click.echo("warning: the cluster stays recorded as up until every node confirms its stop", err=True)
    if unreachable:
        from orchestrator.errors import UnreachableError

        if result.was_up:
            message = f"not reached: {', '.join(unreachable)}; Ray may still run there"
        else:
            message = (f"not reached: {', '.join(unreachable)}; cluster {manifest.name} is not recorded as up "
                       "(never started by orch, or already down), so nothing is known to run there")  # fmt: skip
        raise UnreachableError(message + (f"; stopping also failed on {', '.join(n.node for n in failed)}" if failed else ""),
                               hint="re-run `orch down` once the node answers over SSH; see `orch runbook NODE_UNREACHABLE`")  # fmt: skip
    if failed:
        raise ClusterError(
            f"stopping failed on {', '.join(n.node for n in failed)}: {failed[0].detail}",
            hint="re-run `orch down`; if it persists, log in and stop the processes by hand",
        )
