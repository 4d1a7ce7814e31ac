"""`orch down` on the test bed: no Ray process is left on any host; a host whose sshd is down
is reported as unreachable, the others are stopped, and the command exits 4 (an unreachable
node, README's exit codes). Ends the shared cluster, so these
tests run last (marker ``ends_cluster``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from orchestrator.cli import main
from orchestrator.state import StateStore

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.ends_cluster]


SLEEP = "import time; time.sleep(600)"


def _start_decoys(c, host: str, temp: str, cluster_id: str) -> dict[str, str]:
    """Processes on ``host`` that look like another cluster's: same name, another id; a temp dir
    that only starts with ours; another user's process carrying our very tag and temp dir. Each
    has a unique marker on its command line; returns label -> marker."""
    other_id = uuid.uuid4().hex[:16]
    decoys = {
        "same name, other id": ([], {"ORCH_CLUSTER": c.manifest.name, "ORCH_CLUSTER_ID": other_id}, None),
        "similar temp dir": ([f"--temp-dir={temp}-overhead-1"], {}, None),
        "similar session dir": ([f"--session_dir={temp}-overhead-1/session_2026"], {}, None),
        "another user's, our tag": ([f"--temp-dir={temp}"], {"ORCH_CLUSTER_ID": cluster_id}, "nobody"),
    }
    markers = {}
    for label, (args, env, user) in decoys.items():
        marker = f"decoy-{uuid.uuid4().hex[:8]}"
        argv = ["/usr/bin/python3", "-c", SLEEP, marker, *args]  # runnable by nobody too
        if user:
            argv = ["runuser", "-u", user, "--", *argv]
        env_args = [f"{k}={v}" for k, v in env.items()]
        # detached, its output away from ns_exec's pipes (which would otherwise wait for it)
        c.bed.ns_exec(host, ["sh", "-c", 'setsid -f "$@" </dev/null >/dev/null 2>&1', "sh", "env", *env_args, *argv])
        markers[label] = marker
    return markers


def _gone(c, host: str) -> bool:
    return c.ray_pids(host) == {}


def _alive(c, host: str, marker: str) -> bool:
    return c.bed.ns_exec(host, ["pgrep", "-f", marker], check=False).returncode == 0


def test_remove_stops_serving_the_model_and_ray_stays_up(served_tiny, monkeypatch, capsys, measured):
    """`orch remove tiny` on the shared cluster (before `orch down` ends it): Serve deletes the
    model's application, the revision is recorded removed, the public route answers no
    completion, and Ray keeps running on every host."""
    c = served_tiny.cluster
    monkeypatch.setenv(served_tiny.manifest.serve.api_key_env, served_tiny.api_key)
    capsys.readouterr()
    assert main(c.cli("remove", "tiny", served_tiny.manifest_path, "--json")) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["action"] == "removed" and "orch" in res["apps"], res
    measured(f"orch remove: Serve deleted {', '.join(res['apps'])} {res['seconds']} s after the PUT")
    with c.dashboard() as dash:
        left = dash.get_json("/api/serve/applications/").get("applications") or {}
    assert not set(res["apps"]) & set(left), sorted(left)
    state = StateStore(c.state_dir)
    assert state.current_revision(served_tiny.manifest.name) is None
    assert state.get_revision(served_tiny.manifest.name, res["revision"]).status == "removed"
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4}
    resp = httpx.post(f"{served_tiny.endpoint}/v1/completions", json=body, headers={"Authorization": f"Bearer {served_tiny.api_key}"},
                      timeout=60)  # fmt: skip
    assert resp.status_code != 200, resp.text[:300]
    assert all(c.ray_pids(h.name) for h in c.bed.hosts)


def test_down_with_one_host_unreachable_then_down_leaves_no_ray_process(ray_testbed_cluster, capsys):
    c = ray_testbed_cluster
    name = c.manifest.name
    assert all(c.ray_pids(h.name) for h in c.bed.hosts)
    # decoys of another cluster on host0 (issue 12: substring matching of the temp dir killed
    # ~20 processes of a cluster whose temp dir began the same; the name tag is shared by any
    # two clusters of one name; another user's processes are not ours)
    cluster_id = StateStore(c.state_dir).read_cluster_id(name)
    assert cluster_id
    decoys = _start_decoys(c, "host0", str(c.manifest.ray.temp_dir).rstrip("/"), cluster_id)
    assert all(_alive(c, "host0", m) for m in decoys.values())

    # host1's sshd is down: the others are stopped, host1 is reported, the exit code is 4.
    c.bed.stop_sshd("host1")
    try:
        capsys.readouterr()
        assert main(c.cli("down", c.manifest_path, "--json")) == 4
        captured = capsys.readouterr()
    finally:
        c.bed.start_sshd("host1")
    result = json.loads(captured.out)
    by = {n["node"]: n for n in result["nodes"]}
    assert by["host1"]["unreachable"] is True and by["host1"]["ok"] is False
    assert by["host0"]["ok"] and by["host2"]["ok"]
    assert "error: not reached: host1; Ray may still run there" in captured.err
    # a killed process stays a zombie until the host's init reaps it (up to ~1 s later): wait for that
    assert c.wait_for(lambda: _gone(c, "host0") and _gone(c, "host2"), timeout=30), (c.ray_pids("host0"), c.ray_pids("host2"))
    assert c.ray_pids("host1")  # untouched: it was not reachable
    # host1 did not confirm: the cluster is not recorded as down
    assert result["recorded_down"] is False and StateStore(c.state_dir).get_cluster(name).state == "up"

    # Once reachable again, `orch down` stops it too: no Ray process anywhere.
    assert main(c.cli("down", c.manifest_path)) == 0
    out = capsys.readouterr().out
    assert "stopped" in out
    assert c.wait_for(lambda: all(_gone(c, h.name) for h in c.bed.hosts), timeout=30), {h.name: c.ray_pids(h.name) for h in c.bed.hosts}
    assert StateStore(c.state_dir).get_cluster(name).state == "down"
    try:
        assert {label: _alive(c, "host0", m) for label, m in decoys.items()} == {label: True for label in decoys}
    finally:
        for m in decoys.values():
            c.bed.ns_exec("host0", ["pkill", "-f", m], check=False)
    assert not Path(f"/root/.orch/nodes/{name}").exists()  # no secret left on the nodes

    # Status of a cluster that is down says so (and does not fail).
    assert main(c.cli("status", c.manifest_path, "--json")) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["healthy"] is False and status["dashboard_error"]
    assert {n["ray_state"] for n in status["nodes"]} == {"UNKNOWN"}
