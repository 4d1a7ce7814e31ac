"""`orch status` and healing on the test bed (real sshd hosts, real Ray, the shared cluster).

- The raylet of one worker is killed: status shows that node DEAD within 30 s, and `orch up`
  restarts only that node (the head's and the other worker's raylets keep their pids).
- The dashboard answers nowhere but the head's loopback, and refuses requests without the
  cluster's token (also through orch's own SSH tunnel with a wrong token).
"""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from orchestrator.cluster.dashboard import DashboardRefused
from orchestrator.workflows.status_nodes import status_nodes

pytestmark = [pytest.mark.integration, pytest.mark.ray]

DEAD_WITHIN_S = 30.0

# Runs on the head (inside its namespaces): a GET of the dashboard, printing the HTTP status
# or the connection error. argv only; the token travels in the environment.
HTTP_GET = r"""
import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1])
if os.environ.get("TOKEN"):
    req.add_header("Authorization", "Bearer " + os.environ["TOKEN"])
try:
    print(urllib.request.urlopen(req, timeout=5).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError as e:
    print(type(getattr(e, "reason", e)).__name__)
"""


@pytest.mark.disrupts_serving  # the served app's replica may live on the killed node (after a surge it moved)
def test_killed_worker_raylet_shows_dead_and_up_restarts_only_it(ray_testbed_cluster, capsys):
    c = ray_testbed_cluster
    before = {h.name: c.raylet_pid(h.name) for h in c.bed.hosts}
    assert all(before.values()), before
    victim = "host2"
    c.bed.ns_exec(victim, ["kill", "-KILL", str(before[victim])])

    def dead_row():
        report = status_nodes(c.manifest, c.deps())
        row = {r.name: r for r in report.nodes.rows}[victim]
        return row if row.ray_state == "DEAD" else None

    row = c.wait_for(dead_row, timeout=DEAD_WITHIN_S, interval=1.0)
    assert row is not None, f"{victim} not reported DEAD within {DEAD_WITHIN_S:g} s"
    assert row.reachable and row.detail  # SSH still works; Ray says why it is dead

    capsys.readouterr()
    assert main(c.cli("status", c.manifest_path, "--json")) == 0
    status = json.loads(capsys.readouterr().out)
    states = {n["name"]: n["ray_state"] for n in status["nodes"]}
    assert states == {"host0": "ALIVE", "host1": "ALIVE", "host2": "DEAD"}
    assert status["healthy"] is False and status["totals"]["gpus_total"] == 16.0

    assert main(c.cli("up", c.manifest_path, "--json", "--skip-collective-check")) == 0  # stand-in GPUs: no NCCL
    healed = json.loads(capsys.readouterr().out)
    assert healed["action"] == "heal" and healed["started"] == [victim], healed
    after = {h.name: c.raylet_pid(h.name) for h in c.bed.hosts}
    assert after["host0"] == before["host0"] and after["host1"] == before["host1"]
    assert after[victim] and after[victim] != before[victim]
    report = status_nodes(c.manifest, c.deps())
    assert report.nodes.healthy and report.nodes.gpus_total == 24.0


def test_dashboard_only_on_loopback_and_only_with_token(ray_testbed_cluster):
    c = ray_testbed_cluster
    from orchestrator.state import StateStore

    port = c.manifest.ray.dashboard_port
    token = StateStore(c.state_dir).read_token(c.manifest.name)
    python = c.manifest.python

    def get(url: str, with_token: bool) -> str:
        env = ["env", f"TOKEN={token}"] if with_token else ["env", "TOKEN="]
        return c.bed.ns_exec("host0", [*env, python, "-c", HTTP_GET, url]).stdout.strip()

    # Every non-loopback address of the head: nothing listens there.
    addrs = json.loads(c.bed.ns_exec("host0", ["ip", "-j", "-4", "addr"]).stdout)
    non_loopback = [a["local"] for link in addrs for a in link.get("addr_info", []) if not a["local"].startswith("127.")]
    assert c.head_address in non_loopback
    for addr in non_loopback:
        assert get(f"http://{addr}:{port}/api/version", with_token=True) == "ConnectionRefusedError"
    # From another host of the cluster network, likewise.
    assert c.bed.ns_exec("host1", ["env", "TOKEN=", python, "-c", HTTP_GET, f"http://{c.head_address}:{port}/api/version"]
                         ).stdout.strip() == "ConnectionRefusedError"  # fmt: skip
    # On the loopback: 401 without the token, 200 with it.
    assert get(f"http://127.0.0.1:{port}/api/v0/nodes", with_token=False) == "401"
    assert get(f"http://127.0.0.1:{port}/api/v0/nodes", with_token=True) == "200"
    # Through orch's SSH tunnel: a wrong token is refused, the right one lists the nodes.
    with c.dashboard(token="0" * 64) as wrong:
        with pytest.raises(DashboardRefused):
            wrong.nodes()
    with c.dashboard() as right:
        assert {s.name for s in right.nodes() if s.alive} == {"host0", "host1", "host2"}
