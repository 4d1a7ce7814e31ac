"""`orch dashboard`: the head's Ray dashboard through an SSH tunnel, for a browser. The I/O edge
(the head's runner and one HTTP call, both through injected deps).

The dashboard listens on the head's 127.0.0.1 only (``ray start --dashboard-host 127.0.0.1``);
the tunnel is the runner's port forward, the one ``cluster/dashboard.py`` opens for orch's own
REST calls (``cluster.dashboard.open_dashboard``, injected). Before the URL is handed out the tunnel is proved with ``/api/version`` and the
cluster's token (Ray's token auth refuses the dashboard's API without it); the token itself is
never printed: the dashboard page asks for it, and it is in orch's state (``token_path``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.cluster.dashboard import DashboardUnavailable
from orchestrator.errors import ClusterError, ClusterNotUp
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.state import StateStore


@dataclass(frozen=True)
class Tunnel:
    url: str  # http://127.0.0.1:<local port>
    ray_version: str | None
    token_file: Path | None  # where the token the page asks for is (None: token auth is off)


@dataclass(frozen=True)
class DashboardDeps:
    state: StateStore
    open_runners: Callable[[Manifest], AbstractContextManager[dict[str, Runner]]]
    # (head runner, dashboard port on the head, token) -> a DashboardClient through the runner's tunnel
    open_dashboard: Callable[[Runner, int, str | None], AbstractContextManager[Any]]


@contextmanager
def dashboard_tunnel(manifest: Manifest, deps: DashboardDeps) -> Iterator[Tunnel]:
    """The tunnel to the head's dashboard, open while the block runs. ClusterNotUp (exit 5) when the
    cluster is not recorded as up; ClusterError (exit 5) when the dashboard does not answer through
    it or refuses the token; UnreachableError (exit 4) from ``open_runners`` when the head cannot be
    reached."""
    record = deps.state.get_cluster(manifest.name)
    if record is None or record.state != "up":
        raise ClusterNotUp(f"cluster {manifest.name!r} is not up", hint=f"run `orch up {manifest.source_path or 'CLUSTER_YAML'}` first")
    token = deps.state.read_token(manifest.name) if manifest.ray.token_auth else None
    with deps.open_runners(manifest) as runners:
        with deps.open_dashboard(runners[manifest.head.name], manifest.ray.dashboard_port, token) as client:
            try:
                version = client.ray_version()
            except DashboardUnavailable as exc:  # a refused token keeps its own message and hint
                raise ClusterError(f"the Ray dashboard of {manifest.name} does not answer through the tunnel: {exc.message}",
                                   hint="`orch status` says whether Ray runs on the head") from exc  # fmt: skip
            yield Tunnel(client.base_url, version, deps.state.token_path(manifest.name) if token else None)
