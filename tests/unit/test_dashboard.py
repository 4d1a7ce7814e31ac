"""ray_dashboard: the HTTP client (httpx MockTransport serving captured Ray JSON) and
wait_for_nodes with a fake clock (no real sleep)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from orchestrator.cluster.dashboard import DashboardClient, DashboardRefused, DashboardUnavailable, wait_for_nodes
from orchestrator.cluster.node_state import parse_nodes
from orchestrator.errors import ClusterError

DATA = Path(__file__).resolve().parents[1] / "data" / "ray_dashboard"


def captured(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def make_transport(token: str, seen: list[httpx.Request]):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers.get("authorization") != f"Bearer {token}":
            return httpx.Response(401, text="Unauthorized: Missing authentication token")
        if request.url.path == "/api/v0/nodes":
            return httpx.Response(200, json=captured("nodes_two.json"))
        if request.url.path == "/api/cluster_status":
            return httpx.Response(200, json=captured("cluster_status_used.json"))
        if request.url.path == "/api/version":
            return httpx.Response(200, json={"version": "4", "ray_version": "2.60.0"})
        return httpx.Response(404, text="not found")

    return httpx.MockTransport(handler)


def test_client_sends_bearer_token_and_combines_usage():
    seen: list[httpx.Request] = []
    with DashboardClient("http://127.0.0.1:1", "tok", transport=make_transport("tok", seen)) as client:
        states = {s.name: s for s in client.nodes_with_usage()}
        assert client.ray_version() == "2.60.0"
    assert states["w1"].gpus_used == 3.0 and states["head"].gpus_total == 8.0
    assert seen[0].url.params["detail"] == "true"
    assert all(r.headers["authorization"] == "Bearer tok" for r in seen)


def test_client_wrong_token_is_refused_error():
    with DashboardClient("http://127.0.0.1:1", "other", transport=make_transport("tok", [])) as client:
        with pytest.raises(DashboardRefused, match="refused orch's token"):
            client.nodes()


def test_client_http_error_and_non_json():
    def handler(request):
        if request.url.path == "/api/version":
            return httpx.Response(200, text="<html>")
        return httpx.Response(500, text="boom")

    with DashboardClient("http://x", "t", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ClusterError, match="answered 500"):
            client.nodes()
        with pytest.raises(ClusterError, match="not JSON"):
            client.ray_version()


def test_client_connection_refused_is_unavailable():
    def handler(request):
        raise httpx.ConnectError("Connection refused", request=request)

    with DashboardClient("http://127.0.0.1:1", "t", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(DashboardUnavailable, match="did not answer"):
            client.nodes()


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_wait_returns_when_all_alive_after_dashboard_comes_up():
    clock = Clock()
    two = parse_nodes(captured("nodes_two.json"))
    head_only = [s for s in two if s.name == "head"]
    answers = [DashboardUnavailable("down"), head_only, head_only, two]
    messages: list[str] = []

    def fetch():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    states = wait_for_nodes(fetch, {"head": 8, "w1": 8}, timeout=30, clock=clock, sleep=clock.sleep, progress=messages.append)
    assert {s.name for s in states} == {"head", "w1"}
    assert clock.now == 3.0
    assert messages == ["0/2 nodes ALIVE; waiting for head, w1", "1/2 nodes ALIVE; waiting for w1", "2/2 nodes ALIVE"]


def test_wait_timeout_names_missing_nodes_and_reason():
    clock = Clock()
    dead = parse_nodes(captured("nodes_dead.json"))
    with pytest.raises(ClusterError) as err:
        wait_for_nodes(lambda: dead, {"head": 8, "w1": 8, "w2": 8}, timeout=5, clock=clock, sleep=clock.sleep, interval=2)
    msg = err.value.message
    assert "w1, w2" in msg and "heartbeats" in msg and "w2: not in the Ray cluster" in msg and "head:" not in msg
    assert clock.now == 5.0 and clock.sleeps == [2, 2, 1]
    assert "runbooks/RAY_NODE_NOT_JOINED.md" in err.value.hint


def test_wait_timeout_mentions_last_dashboard_error():
    clock = Clock()

    def fetch():
        raise DashboardUnavailable("nothing at 127.0.0.1:1")

    with pytest.raises(ClusterError, match="last dashboard error: nothing at"):
        wait_for_nodes(fetch, {"head": 8}, timeout=2, clock=clock, sleep=clock.sleep)


def test_wait_does_not_retry_a_refused_token():
    clock = Clock()

    def fetch():
        raise DashboardRefused("refused")

    with pytest.raises(DashboardRefused):
        wait_for_nodes(fetch, {"head": 8}, timeout=60, clock=clock, sleep=clock.sleep)
    assert clock.now == 0.0
