"""`orch status [CLUSTER_YAML]`: nodes and serving. CLI only.

The report is built by ``orchestrator.workflows.status_nodes.status_nodes`` (a ``StatusReport`` from
``orchestrator.status.nodes``), then the serving section (``orchestrator.workflows.status``).
Rendering is one function per section (``render_nodes``, ``render_serving`` in
``cli/status_serving.py``), assembled by ``render_report``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.output import console, print_json
from orchestrator.cli.params import FiniteFloat
from orchestrator.cli.wiring import cluster_deps, resolve_manifest

if TYPE_CHECKING:
    from orchestrator.manifest.model import Manifest
from orchestrator.collective.verdict import recorded_summary

STATE_STYLE = {"ALIVE": "green", "DEAD": "bold red", "MISSING": "red", "UNKNOWN": "yellow"}


def collect(manifest: Manifest, state_dir: Path, accept_new_host_keys: bool = False, capacity_cache: dict | None = None):
    """Nodes from Ray's dashboard, then the serving section (Serve app, revision, engine figures).

    ``capacity_cache`` keeps each replica's start-up KV-cache line across --watch refreshes, so a
    replica's log is read once."""
    from orchestrator.status.serving import node_refs
    from orchestrator.workflows.status import ServingOptions, StatusDeps, gather_serving, start_probe
    from orchestrator.workflows.status_nodes import status_nodes

    deps = cluster_deps(manifest, state_dir, accept_new_host_keys, lambda _m: None)
    serving_deps, options = StatusDeps.from_cluster(deps, capacity_cache), ServingOptions()
    record = deps.state.get_cluster(manifest.name)
    if record is None:
        # never started by orch: no revision, no Serve application; the nodes are still shown
        report = status_nodes(manifest, deps)
        return report.with_section("serving_not_read", f"cluster {manifest.name} was never started by orch")
    # The readiness completion goes out first and answers while the nodes and Serve are read.
    probe = start_probe(manifest, serving_deps, options)
    report = status_nodes(manifest, deps)
    if manifest.head.name in report.nodes.unreachable:
        # every read of the serving section goes through the head: one line, not one per read
        return report.with_section("serving_not_read", "the head does not answer over SSH")
    serving = gather_serving(manifest, serving_deps, node_refs(report.nodes), options, probe)
    return report.with_serving(serving)


def _known(state_dir: Path) -> list[dict[str, Any]]:
    from orchestrator.state import StateStore

    return [{"name": c.name, "state": c.state, "manifest_path": c.manifest_path} for c in StateStore(state_dir).list_clusters()]


def _exit_for(report: Any) -> None:
    """Exit 4 when a node did not answer over SSH (after the whole report was printed), like every
    command that cannot reach a node; otherwise 0, whatever the report says (see "healthy")."""
    from orchestrator.errors import UnreachableError

    unreachable = report.nodes.unreachable
    if unreachable:
        raise UnreachableError(
            f"{len(unreachable)} of {len(report.nodes.rows)} node(s) did not answer over SSH: {', '.join(unreachable)}",
            hint="the report above says why for each; see `orch runbook NODE_UNREACHABLE`",
        )


def render_nodes(section: Any) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title="nodes", title_justify="left")
    # Versions get a column only when they differ between nodes; else one line below.
    seen = {_versions(r.versions) for r in section.rows if r.versions}
    per_node = len(seen) > 1
    for col in ("node", "role", "address", "ray", "ssh", "GPUs", "type"):
        table.add_column(col, no_wrap=True)
    if per_node:
        table.add_column("python/ray/vllm/torch", overflow="fold", min_width=12)
    notes: dict[str, list[str]] = {}  # detail -> nodes: a cause shared by several nodes is said once
    for r in section.rows:
        gpus = "-" if r.gpus_total is None else f"{r.gpus_used or 0:g}/{r.gpus_total:g}"
        if r.gpus_total is not None and round(r.gpus_total) != r.gpus_expected:
            gpus += f" (expected {r.gpus_expected})"
        cells = [
            r.name,
            r.role,
            r.address or r.host,
            f"[{STATE_STYLE.get(r.ray_state, '')}]{r.ray_state}[/]",
            "[green]ok[/]" if r.reachable else "[red]unreachable[/]",
            gpus,
            r.gpu_type or "-",
        ]
        if per_node:
            cells.append("/".join(_versions(r.versions)) if r.versions else "-")
        table.add_row(*cells)
        if r.detail:
            notes.setdefault(r.detail, []).append(r.name)
    total = Text(
        f"cluster: {section.alive}/{len(section.rows)} nodes ALIVE, GPUs {section.gpus_used:g} used of {section.gpus_total:g}"
        f" (expected {sum(r.gpus_expected for r in section.rows)})"
        + (f", ray {section.ray_version}" if section.ray_version else "")
        + ("" if section.healthy else "  [not healthy]")
    )
    parts: list[Any] = [table, total]
    if len(seen) == 1:
        py, ray, vllm, torch = next(iter(seen))
        parts.append(Text(f"versions (every reachable node): python {py}, ray {ray}, vllm {vllm}, torch {torch}"))
    parts += [Text(f"{', '.join(names)}: {detail}") for detail, names in notes.items()]
    if section.dashboard_error:
        parts.append(Text(f"dashboard: {section.dashboard_error}", style="yellow"))
    if section.foreign_nodes:
        parts.append(Text(f"{section.foreign_nodes} other ALIVE Ray node(s) not started by orch"))
    return Group(*parts)


def _versions(v: Any) -> tuple[str, ...]:
    return tuple(str(x or "-") for x in (v.python, v.ray, v.vllm, v.torch))


def render_report(report: Any) -> Any:
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(f"cluster {report.cluster}", style="bold")]
    recorded = report.recorded or {}
    if not recorded:
        parts.append(Text(f"not started by orch: nothing is recorded about {report.cluster}; `orch up CLUSTER_YAML` starts it"))
    elif recorded.get("state") != "up":
        parts.append(Text(f"recorded as {recorded.get('state')} (`orch down` stopped it); `orch up CLUSTER_YAML` starts it"))
    parts.append(render_nodes(report.nodes))
    for line in report.extra.get("warnings", ()):
        parts.append(Text(f"warning: {line}", style="yellow"))
    collective = report.extra.get("collective")
    if collective:
        parts.append(Text(recorded_summary(collective)))
    if report.serving_healthy is False:
        parts.append(Text(f"not healthy: {report.expected_model} should be served (its revision is recorded as ready)"
                          " and is not", style="bold red"))  # fmt: skip
    if report.serving is not None:
        from orchestrator.cli.status_serving import render_serving

        parts.append(render_serving(report.serving))
    elif report.extra.get("serving_not_read"):
        parts.append(Text(f"serving: not read: {report.extra['serving_not_read']}"))
    return Group(*parts)


@click.command("status")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option("--watch", is_flag=True, help="Refresh until interrupted (Ctrl-C).")
@click.option("--interval", type=FiniteFloat(min=0.5), default=5.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of nodes contacted for the first time.")
@click.pass_context
def status(ctx: click.Context, cluster_yaml: Path | None, as_json: bool, watch: bool, interval: float,
           accept_new_host_keys: bool) -> None:  # fmt: skip
    """Nodes, GPUs, the Serve application, revision, KV cache, latency.

    \b
    Reads Ray's state from the head's dashboard through an SSH tunnel (with the cluster's
    token) and probes every node over SSH; dead and unreachable nodes are shown as such.
    Without CLUSTER_YAML, the one cluster recorded by `orch up` is shown; with none up it says so
    (exit 0, and valid JSON with --json). Exit 0 whenever a report could be made (see "healthy" in
    --json), 4 when a node did not answer over SSH (after the report).
    """
    from orchestrator.errors import ClusterNotUp

    state_dir: Path = ctx.obj["state_dir"]
    try:
        manifest = resolve_manifest(cluster_yaml, state_dir, "status")
    except ClusterNotUp as exc:  # nothing up is an answer, not a failure
        if as_json:
            print_json({"cluster": None, "up": False, "message": exc.message, "clusters": _known(state_dir)})
        else:
            click.echo(f"{exc.message}; `orch up CLUSTER_YAML` starts one, `orch clusters` lists the known ones")
        return
    cache: dict = {}
    if not watch:
        report = collect(manifest, state_dir, accept_new_host_keys, cache)
        if as_json:
            print_json(report.to_dict())
        else:
            console().print(render_report(report))
        _exit_for(report)
        return
    try:
        if as_json:
            while True:
                print_json(collect(manifest, state_dir, accept_new_host_keys, cache).to_dict())
                time.sleep(interval)
        from rich.live import Live

        with Live(console=console(), auto_refresh=False) as live:
            while True:
                live.update(render_report(collect(manifest, state_dir, accept_new_host_keys, cache)), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        return
