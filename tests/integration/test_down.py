"""`orch down` on the test bed: no Ray process is left on any host; a host whose sshd is down
is reported as unreachable without failing the command. Ends the shared cluster, so these
tests run last (marker ``ends_cluster``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.state import StateStore

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.ends_cluster]


def test_down_with_one_host_unreachable_then_down_leaves_no_ray_process(ray_testbed_cluster, capsys):
    c = ray_testbed_cluster
    name = c.manifest.name
    assert all(c.ray_pids(h.name) for h in c.bed.hosts)

    # host1's sshd is down: the others are stopped, host1 is reported, the exit code is 0.
    c.bed.stop_sshd("host1")
    try:
        capsys.readouterr()
        assert main(c.cli("down", c.manifest_path, "--json")) == 0
        captured = capsys.readouterr()
    finally:
        c.bed.start_sshd("host1")
    result = json.loads(captured.out)
    by = {n["node"]: n for n in result["nodes"]}
    assert by["host1"]["unreachable"] is True and by["host1"]["ok"] is False
    assert by["host0"]["ok"] and by["host2"]["ok"]
    assert "warning: not reached: host1" in captured.err
    assert c.ray_pids("host0") == {} and c.ray_pids("host2") == {}
    assert c.ray_pids("host1")  # untouched: it was not reachable

    # Once reachable again, `orch down` stops it too: no Ray process anywhere.
    assert main(c.cli("down", c.manifest_path)) == 0
    out = capsys.readouterr().out
    assert "stopped" in out
    assert {h.name: c.ray_pids(h.name) for h in c.bed.hosts} == {"host0": {}, "host1": {}, "host2": {}}
    assert StateStore(c.state_dir).get_cluster(name).state == "down"
    assert not Path(f"/root/.orch/nodes/{name}").exists()  # no secret left on the nodes

    # Status of a cluster that is down says so (and does not fail).
    assert main(c.cli("status", c.manifest_path, "--json")) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["healthy"] is False and status["dashboard_error"]
    assert {n["ray_state"] for n in status["nodes"]} == {"UNKNOWN"}
