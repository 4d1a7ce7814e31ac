"""The collective check inside `orch up` (gating, what runs where, what is recorded), over the
simulated nodes of tests/workflows/cluster_world.py. The job's real behaviour is tested on the
test bed (tests/integration/test_collective_testbed.py) and with real processes here
(test_collective_job_runs_for_real)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.collective.figures import NodeRun
from orchestrator.collective.plan import MESH_DEADLINE_S, SIZES, job_argv, job_spec, plan_check
from orchestrator.collective.verdict import judge
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import ClusterDeps, PreflightStopped, UpOptions, up
from tests.workflows.cluster_world import YAML, Clock, World, manifest_of


@pytest.fixture()
def env(tmp_path):
    manifest = manifest_of()
    world = World(manifest)
    clock = Clock()
    messages: list[str] = []
    deps = ClusterDeps(
        state=StateStore(tmp_path / "state", clock=clock), open_runners=world.open_runners, gather=world.gather,
        check=lambda m, f: [], open_dashboard=world.open_dashboard, clock=clock, sleep=clock.sleep,
        token_factory=lambda: "t0k3n", progress=messages.append,
    )  # fmt: skip
    return manifest, world, deps, messages


def test_check_runs_on_every_node_with_the_env_ray_gets_and_is_recorded(env):
    manifest, world, deps, messages = env
    res = up(manifest, deps, UpOptions(check_only=True))
    jobs = {name: (spec, e) for name, spec, e in world.collective_jobs}
    assert sorted(jobs) == ["head", "w1", "w2"]
    assert [jobs[n][0]["rank"] for n in ("head", "w1", "w2")] == [0, 1, 2]
    assert {jobs[n][0]["store_host"] for n in jobs} == {"192.168.7.1"} and {jobs[n][0]["store_port"] for n in jobs} == {41234}
    for spec, e in jobs.values():  # a GPU cluster: NCCL, pinned to the manifest's interface
        assert spec["backend"] == "nccl" and e["NCCL_SOCKET_IFNAME"] == e["GLOO_SOCKET_IFNAME"] == "eth1"
        assert e["NCCL_DEBUG"] == "INFO" and "ORCH_CLUSTER" not in e and e["VLLM_HOST_IP"].startswith("192.168.7.")
    assert res.collective is not None and res.collective.ok and world.ray_calls() == []
    recorded = deps.state.load_collective("tb")
    assert recorded["ok"] is True and [p["nodes"] for p in recorded["pairs"]] == [["head", "w1"], ["head", "w2"]]
    assert recorded["all"]["busbw_gbps"] == res.collective.to_dict()["all"]["busbw_gbps"]
    # the all-to-all: every pair of nodes, workers included, and the group of all
    assert all(spec["alltoall"] and spec["deadline_s"] == MESH_DEADLINE_S for spec, _ in jobs.values())
    assert [p["nodes"] for p in recorded["mesh"]["pairs"]] == [["head", "w1"], ["head", "w2"], ["w1", "w2"]]
    assert recorded["mesh"]["all"]["op"] == "all-to-all" and recorded["mesh"]["all"]["busbw_gbps"] > 0
    assert any(m.startswith("collective check (nccl") for m in messages)


def test_a_worker_that_cannot_join_stops_up_before_anything_starts(env):
    manifest, world, deps, _ = env
    world.collective_broken["w1"] = "DistNetworkError: The client socket has timed out after 20000ms while trying to connect to (192.168.7.1, 41234)."
    with pytest.raises(PreflightStopped) as caught:
        up(manifest, deps)
    fails = [(f.code, f.node) for f in caught.value.findings if f.severity == "fail"]
    assert fails == [("COLLECTIVE_INIT_FAILED", "w1")]
    assert "trying to connect to (192.168.7.1, 41234)" in caught.value.findings[-1].message
    assert "COLLECTIVE_INIT_FAILED@w1" in caught.value.message
    assert world.ray_calls() == [] and deps.state.get_cluster("tb") is None
    assert deps.state.load_collective("tb")["ok"] is False  # the failed check is recorded too


def test_skip_flag_and_nothing_to_do_run_no_job(env):
    manifest, world, deps, messages = env
    up(manifest, deps, UpOptions(collective_check=False))
    assert world.collective_jobs == [] and "collective check skipped (--skip-collective-check)" in messages
    up(manifest, deps)  # healthy and unchanged: nothing starts, so nothing is checked
    assert world.collective_jobs == []


def test_cli_flag_and_json(tmp_path, monkeypatch, capsys):
    path = tmp_path / "tb.yaml"
    path.write_text(YAML)
    world, clock = World(manifest_of()), Clock()

    def make_deps(manifest, sd, accept, progress):
        return ClusterDeps(state=StateStore(sd, clock=clock), open_runners=world.open_runners, gather=world.gather,
                           check=lambda m, f: [], open_dashboard=world.open_dashboard, clock=clock, sleep=clock.sleep,
                           progress=progress)  # fmt: skip

    monkeypatch.setattr("orchestrator.cli.cluster.cluster_deps", make_deps)
    assert main(["--state-dir", str(tmp_path / "s"), "up", str(path), "--check-only", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["collective"]["ok"] is True and out["collective"]["ranks"] == ["head", "w1", "w2"]
    assert main(["--state-dir", str(tmp_path / "s"), "up", str(path), "--check-only", "--skip-collective-check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["collective"] is None
    assert len(world.collective_jobs) == 3  # the first run only


def test_collective_job_runs_for_real(tmp_path):
    """The job's source with this machine's torch: 3 processes, Gloo over loopback, judged."""
    manifest = manifest_of(YAML.replace("name: tb", "name: tb\naccelerator: cpu").replace(", interface: eth1", "").replace("gpus: 8", "gpus: 0"))
    plan = plan_check(manifest, {})
    assert not isinstance(plan, str) and plan.backend == "gloo"
    plan = type(plan)(plan.backend, plan.ranks, "127.0.0.1", plan.interfaces, plan.addresses, plan.alltoall)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    procs = {n: subprocess.Popen(job_argv(sys.executable, job_spec(plan, i, port)), env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, n in enumerate(plan.ranks)}  # fmt: skip
    runs = {}
    for n, p in procs.items():
        out, err = p.communicate(timeout=120)
        runs[n] = NodeRun(n, p.returncode, out, err)
    report = judge(plan, runs, {}, port)
    assert not [f for f in report.findings if f.severity == "fail"], report.findings
    assert [p.ok for p in report.pairs] == [True, True] and report.all is not None and report.all.ok
    assert [s.bytes for s in report.all.sizes] == [b for b, _ in SIZES["gloo"]]
    # the all-to-all ran too: every pair (workers with each other as well) and the group of all
    assert report.mesh is not None and [(p.name, p.ok) for p in report.mesh.pairs] == [
        ("head<->w1", True), ("head<->w2", True), ("w1<->w2", True)]
    assert report.mesh.all is not None and [s.bytes for s in report.mesh.all.sizes] == [b for b, _ in SIZES["gloo"]]
    assert all(r.exit_code == 0 for r in runs.values())
