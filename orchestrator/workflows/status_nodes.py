"""The nodes part of `orch status` (``status_nodes``): every node probed over SSH in parallel while
the head's dashboard is read through the tunnel. Does I/O through the cluster workflow's deps
(``workflows.cluster.ClusterDeps``): SSH runners, the dashboard client, the state store."""

from __future__ import annotations

from typing import Any

from orchestrator.cluster.exposure import exposure_warnings
from orchestrator.errors import ClusterError, RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.nodes import probes
from orchestrator.nodes.facts import Versions
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.status.nodes import StatusReport, build_nodes_section
from orchestrator.workflows.cluster import ClusterDeps


def probe_versions(runner: Runner, manifest: Manifest) -> Versions:
    """Reachability and software versions of one node in one short command."""
    node = manifest.node(runner.node)
    res = runner.run(probes.versions_argv(node.python_bin(manifest)), timeout=60).check(node.name)
    return probes.parse_versions(res.stdout)


def status_nodes(manifest: Manifest, deps: ClusterDeps) -> StatusReport:
    """The nodes part of `orch status`: every node probed over SSH (in parallel) while the head's
    dashboard is read through the tunnel. Dead or unreachable nodes are shown as such."""
    name, head = manifest.name, manifest.head
    record = deps.state.get_cluster(name)
    token = deps.state.read_token(name)
    with deps.open_runners(manifest) as runners:
        dash: dict[str, Any] = {}

        def read_head(r: Runner) -> Versions:
            versions = probe_versions(r, manifest)
            try:
                with deps.open_dashboard(r, manifest.ray.dashboard_port, token) as client:
                    dash["states"] = client.nodes_with_usage()
                    dash["ray_version"] = client.ray_version()
            except (ClusterError, RemoteError) as exc:
                dash["error"] = exc.message
            return versions

        outcomes = fan_out(
            list(runners.values()), lambda r: read_head(r) if r.node == head.name else probe_versions(r, manifest)
        )
    reach: dict[str, Versions | str] = {}
    for o in outcomes:
        reach[o.node] = o.value if o.ok else o.error.message
    if head.name in reach and isinstance(reach[head.name], str) and "error" not in dash and "states" not in dash:
        dash["error"] = "not read: the head does not answer over SSH"  # its SSH error is on the head's row
    section = build_nodes_section(manifest, dash.get("states"), reach, dash.get("error"), dash.get("ray_version"))
    # a model recorded as ready on a cluster recorded as up is what the cluster should serve
    revision = deps.state.current_revision(name) if record is not None and record.state == "up" else None
    report = StatusReport(name, section, recorded=record.to_dict() if record else None,
                          expected_model=revision.model if revision is not None else None)  # fmt: skip
    # what the nodes expose that orch cannot close (Ray has no setting for it): said whenever
    # Ray runs there, not about a cluster with no node up
    report = report.with_section("warnings", exposure_warnings(manifest) if section.alive else [])
    return report.with_section("collective", deps.state.load_collective(name))
