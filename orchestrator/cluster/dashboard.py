"""The Ray dashboard's REST API, read with httpx and the cluster's token, and the wait for nodes.

Does I/O (HTTP to a dashboard URL that the caller provides, normally the local end of an SSH
tunnel to the head's 127.0.0.1:dashboard_port: no dashboard port is ever opened to the network).
Parsing lives in ``orchestrator.cluster.ray_nodes``. ``wait_for_nodes`` takes its clock and sleep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from orchestrator.cluster.node_state import NodeState, node_problems, parse_nodes, parse_usage, with_usage
from orchestrator.errors import ClusterError, OrchError
from orchestrator.polling import poll_until
from orchestrator.runbooks import runbook

RUNBOOK_NOT_JOINED = runbook("RAY_NODE_NOT_JOINED")


class DashboardUnavailable(ClusterError):
    """Nothing answered at the dashboard address (head down, still starting, tunnel closed)."""


class DashboardRefused(ClusterError):
    """The dashboard answered 401/403: the token is missing or not this cluster's."""


class DashboardClient:
    """A small synchronous client of the endpoints orch reads. ``token`` may be None only for a
    cluster without token auth."""

    def __init__(self, base_url: str, token: str | None, timeout: float = 10.0, transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DashboardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The two failures every dashboard request shares; a client of another API on the same
    # dashboard (ServeClient) overrides them to raise its own error kind.
    def _unavailable(self, what: str, exc: httpx.TransportError) -> OrchError:
        return DashboardUnavailable(
            f"the Ray dashboard at {self.base_url} did not answer {what}: {type(exc).__name__}: {exc}",
            hint="is Ray running on the head? `orch up CLUSTER_YAML` starts it",
        )

    def _refused(self, what: str, status_code: int) -> OrchError:
        return DashboardRefused(
            f"the Ray dashboard refused orch's token ({status_code} on {what})",
            hint="the cluster was started with another token; `orch down` then `orch up` restarts it with orch's",
        )

    def _send(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        """One request; no answer and a refused token become errors, other statuses are returned."""
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unavailable(what, exc) from exc
        if resp.status_code in (401, 403):
            raise self._refused(what, resp.status_code)
        return resp

    def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        resp = self._send("GET", path, path, params=params)
        if resp.status_code >= 400:
            raise ClusterError(f"the Ray dashboard answered {resp.status_code} on {path}: {resp.text[:200]}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ClusterError(f"the Ray dashboard answered {path} with something that is not JSON") from exc

    def nodes(self) -> list[NodeState]:
        """Every Ray node record (ALIVE and DEAD), without usage."""
        try:
            return parse_nodes(self.get_json("/api/v0/nodes", {"detail": "true", "limit": "10000"}))
        except ValueError as exc:
            raise ClusterError(f"unexpected answer from the Ray dashboard: {exc}") from exc

    def usage(self) -> dict[str, dict[str, float]]:
        try:
            return parse_usage(self.get_json("/api/cluster_status"))
        except ValueError as exc:
            raise ClusterError(f"unexpected answer from the Ray dashboard: {exc}") from exc

    def nodes_with_usage(self) -> list[NodeState]:
        return with_usage(self.nodes(), self.usage())

    def ray_version(self) -> str | None:
        data = self.get_json("/api/version")
        return data.get("ray_version") if isinstance(data, Mapping) else None


@contextmanager
def open_dashboard(runner: Any, port: int, token: str | None, timeout: float = 10.0) -> Iterator[DashboardClient]:
    """A client of the dashboard on the head's 127.0.0.1:``port``, through ``runner.forward`` (an
    SSH tunnel) when the runner has one, else directly (a local head)."""
    forward = getattr(runner, "forward", None)
    local_port = forward("127.0.0.1", port) if callable(forward) else port
    client = DashboardClient(f"http://127.0.0.1:{local_port}", token, timeout=timeout)
    try:
        yield client
    finally:
        client.close()


def wait_for_nodes(
    fetch: Callable[[], list[NodeState]],
    expected_gpus: Mapping[str, int],
    timeout: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] | None = None,
    interval: float = 1.0,
) -> list[NodeState]:
    """Poll ``fetch`` until every expected node is ALIVE with its GPU count; return the last
    states. A dashboard that does not answer yet counts as "not ready". On timeout raise
    ClusterError naming each missing node and why."""
    said: list[str] = []

    def attempt() -> tuple[list[NodeState], dict[str, str], ClusterError | None]:
        try:
            states = fetch()
        except DashboardRefused:
            raise
        except ClusterError as exc:
            return [], {name: "not in the Ray cluster" for name in expected_gpus}, exc
        return states, node_problems(expected_gpus, states), None

    def done(value: tuple[list[NodeState], dict[str, str], ClusterError | None]) -> bool:
        _, problems, _ = value
        if progress:
            ready = len(expected_gpus) - len(problems)
            line = f"{ready}/{len(expected_gpus)} nodes ALIVE" + (f"; waiting for {', '.join(sorted(problems))}" if problems else "")
            if not said or said[-1] != line:
                progress(line)
                said.append(line)
        return not problems

    polled = poll_until(attempt, done, deadline=clock() + timeout, clock=clock, sleep=sleep, interval=interval)
    states, problems, last_error = polled.value
    if polled.done:
        return states
    detail = "; ".join(f"{name}: {why}" for name, why in sorted(problems.items()))
    if last_error is not None:
        detail += f"; last dashboard error: {last_error.message}"
    raise ClusterError(
        f"timed out after {timeout:g} s waiting for Ray nodes {', '.join(sorted(problems))} ({detail})",
        hint=f"see the node's Ray logs under its temp dir (session_latest/logs/raylet.err); see {RUNBOOK_NOT_JOINED}",
    )
