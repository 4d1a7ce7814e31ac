"""Issue 25 item 7: `orch status` and `orch down` on a cluster that is not there (never started,
its nodes unreachable): the right words, each problem said once, no HAProxy port warning when
nothing runs. Real SSH to loopback ports that refuse (tests/cli/unreachable.py)."""

from __future__ import annotations

import json

from tests.cli.unreachable import closed_port, orch_piped, unreachable_manifest

__all__ = ["closed_port"]


def _missing_key_manifest(tmp_path, port):
    path = unreachable_manifest(tmp_path, port)
    path.write_text(path.read_text().replace("  connect_timeout: 2\n", f"  connect_timeout: 2\n  identity_file: {tmp_path}/no-such-key\n"))
    return path


def test_status_of_a_never_started_unreachable_cluster_says_each_thing_once(tmp_path, closed_port):
    manifest = _missing_key_manifest(tmp_path, closed_port)
    res = orch_piped(tmp_path, "status", str(manifest))
    assert res.returncode == 4, res.stderr  # a node could not be reached: 4, after the report
    out = res.stdout
    cause = f"identity file {tmp_path}/no-such-key does not exist"
    assert out.count(cause) == 1, out  # was 5 times: per node, per dashboard line, per serving problem
    assert f"head, worker-with-a-long-name: unreachable over SSH: {cause}" in out
    assert "not started by orch: nothing is recorded about gone" in out
    assert "HAProxy" not in out + res.stderr  # no Ray runs there: no port of Ray's to warn about
    assert "serving: not read: cluster gone was never started by orch" in out
    assert "SERVE_API_ERROR" not in out and "application - -" not in out
    assert res.stderr.splitlines() == [
        "error: 2 of 2 node(s) did not answer over SSH: head, worker-with-a-long-name",
        "hint: the report above says why for each; see `orch runbook NODE_UNREACHABLE`",
    ]


def test_status_json_of_an_unreachable_cluster_is_one_valid_document(tmp_path, closed_port):
    res = orch_piped(tmp_path, "status", str(unreachable_manifest(tmp_path, closed_port)), "--json")
    assert res.returncode == 4
    report = json.loads(res.stdout)
    assert report["cluster"] == "gone" and report["recorded"] is None and report["healthy"] is False
    assert [n["reachable"] for n in report["nodes"]] == [False, False] and report["warnings"] == []
    assert report["serving_not_read"] == "cluster gone was never started by orch"


def test_status_with_nothing_up_says_so_and_succeeds(tmp_path):
    res = orch_piped(tmp_path, "status")
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.startswith(f"no cluster is up in {tmp_path / 'state'}; `orch up CLUSTER_YAML` starts one")
    res = orch_piped(tmp_path, "status", "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout) == {"cluster": None, "up": False, "message": f"no cluster is up in {tmp_path / 'state'}",
                                      "clusters": []}  # fmt: skip


def test_down_of_a_never_started_unreachable_cluster(tmp_path, closed_port):
    res = orch_piped(tmp_path, "down", str(unreachable_manifest(tmp_path, closed_port)))
    assert res.returncode == 4
    assert "stays recorded as up" not in res.stderr
    assert ("error: not reached: head, worker-with-a-long-name; cluster gone is not recorded as up (never started by orch, "
            "or already down), so nothing is known to run there") in res.stderr  # fmt: skip
