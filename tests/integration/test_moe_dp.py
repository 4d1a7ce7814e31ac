"""A data-parallel + expert-parallel MoE application on the test bed, through `orch rollout`.

Two test hosts with one described H100 each and the vLLM device-key stand-in (the GPU path:
vLLM's Ray executor); the tiny Qwen3-MoE-shaped model of ``orchestrator.plan.tinymodel``
(8 experts). `orch rollout --dp 2 --expert-parallel` renders ``build_dp_openai_app``; Serve
gang-schedules the two ranks, one per host, and each rank's DPServer starts its engine.

vLLM 0.32's CPU backend cannot run a DP group to the end (docs/moe.md: the MoE layer's
``all_gatherv`` is not implemented by the CPU communicator, so every engine dies in its profiling
run), so nothing here waits for an answer. What runs for real and is checked, from ONE rollout
attempt shared by the module (one bed, one `orch up`, one DP application):

1. the ranks as Serve and Ray placed them: one per host, the gang's placement group over both
   nodes, and `orch status` naming each rank, its group and its node from the replicas' logs;
2. Serve's gang: killing one rank's replica process takes the whole group down (the other rank's
   replica is stopped too) and a new group starts, as `orch status` shows; the time is printed;
3. the rollout, stopped with SIGTERM as a user's Ctrl-C would, removes the DP application it
   deployed and records the revision as failed.

Cost: one `orch up` of 2 hosts and two gangs of 2 ranks each started (their engines never finish
loading: the application is gone before the engines' profiling run on a quiet machine); about
2-3 minutes in all (docs/moe.md has the measured figures).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.plan.tinymodel import build_tiny_moe
from orchestrator.state import StateStore
from orchestrator.workflows.down import down
from tests.fixtures.cluster import RayTestbedCluster
from tests.fixtures.cluster import testbed_manifest as manifest_text
from tests.fixtures.serving import TEST_KV_CACHE_GIB
from tests.testbed import HostSpec

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[2]
# Generous deadlines for real processes on a loaded 2-core machine (never waited for when the
# state comes earlier): Serve's gang scheduling and the DPServer's first log line.
RANKS_DEADLINE_S = 300.0
RESTART_DEADLINE_S = 240.0
GANG_PG_PREFIX = "SERVE_GANG::"  # ray/serve/_private/common.py GANG_PG_NAME_PREFIX


@dataclass
class DpAttempt:
    cluster: RayTestbedCluster
    api_key: str
    proc: subprocess.Popen | None = None
    first: dict | None = None  # the first `orch status --json` report that showed both ranks
    log: list[str] = field(default_factory=list)

    def status(self, capsys) -> dict:
        """`orch status --json` as the user runs it (the test sets the API key)."""
        capsys.readouterr()
        main(self.cluster.cli("status", self.cluster.manifest_path, "--json"))
        return json.loads(capsys.readouterr().out)


def dp_ranks(report: dict) -> list[dict]:
    """The DPServer replicas of the report whose rank is known, by group and rank."""
    reps = [r for d in report["serving"]["deployments"] if d["name"].startswith("DPServer:") for r in d["replicas"] if r["dp"]]
    return sorted(reps, key=lambda r: (r["dp"]["group"], r["dp"]["rank"]))


@pytest.fixture(scope="module")
def moe_bed(testbed_factory, tmp_path_factory):
    bed = testbed_factory.make([HostSpec("1xH100-80GB", vllm_gpu=True) for _ in range(2)], name="moe-dp")
    work = tmp_path_factory.mktemp("moe-dp")
    model = build_tiny_moe(work / "models" / "tiny-moe")
    path = work / f"{bed.name}.yaml"
    path.write_text(manifest_text(bed, model_store=model.parent))
    cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=work / "state")
    cluster.ensure_up()
    yield cluster, model
    down(cluster.manifest, cluster.deps())
    bed.close()


@pytest.fixture(scope="module")
def attempt(moe_bed):
    """`orch rollout --dp 2 --expert-parallel` of the tiny MoE, run as the user runs it (a
    process), left running while the tests read it; the last test stops it."""
    cluster, model = moe_bed
    att = DpAttempt(cluster, api_key="orch-test-" + secrets.token_hex(16))
    argv = [sys.executable, "-m", "orchestrator", "--state-dir", str(cluster.state_dir), "rollout", str(cluster.manifest_path),
            "--model", str(model), "--served-name", "tiny", "--dp", "2", "--expert-parallel", "--replicas", "1",
            "--max-model-len", "1024", "--enforce-eager", "--kv-cache-gib", str(TEST_KV_CACHE_GIB), "--timeout", "1200"]  # fmt: skip
    att.proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "ORCH_API_KEY": att.api_key},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    att.started = time.monotonic()  # type: ignore[attr-defined]
    yield att
    if att.proc.poll() is None:
        att.proc.kill()
        att.proc.wait()


def test_the_ranks_land_one_per_host_and_status_names_each_with_its_node(attempt, capsys, monkeypatch):
    cluster = attempt.cluster
    monkeypatch.setenv("ORCH_API_KEY", attempt.api_key)

    def both_ranks():
        assert attempt.proc.poll() is None, attempt.proc.communicate()
        report = attempt.status(capsys)
        ranks = dp_ranks(report)
        return report if len(ranks) == 2 else None

    report = cluster.wait_for(both_ranks, timeout=RANKS_DEADLINE_S, interval=3.0)
    assert report is not None, "orch status never showed the two DP ranks"
    attempt.first = report
    attempt.log.append(f"both ranks in orch status {time.monotonic() - attempt.started:.0f} s after the rollout started")  # type: ignore[attr-defined]
    r0, r1 = dp_ranks(report)
    assert (r0["dp"]["rank"], r1["dp"]["rank"], r0["dp"]["size"]) == (0, 1, 2)
    assert r0["dp"]["group"] == r1["dp"]["group"]
    # Serve's gang (PACK over one GPU per host) put one rank on each host.
    assert {r0["node"], r1["node"]} == {h.name for h in cluster.bed.hosts}
    # The application orch deployed is the DP builder with expert parallelism, its key redacted.
    config = StateStore(cluster.state_dir).get_revision(cluster.manifest.name, 1).config
    assert config["import_path"] == "ray.serve.llm:build_dp_openai_app"
    kw = config["args"]["llm_config"]["engine_kwargs"]
    assert (kw["data_parallel_size"], kw["enable_expert_parallel"]) == (2, True) and attempt.api_key not in json.dumps(config)
    # Ray's own record of the gang: one placement group of 2 GPU bundles, one on each node.
    with cluster.dashboard() as dash:
        rows = dash.get_json("/api/v0/placement_groups", {"detail": "true", "limit": "10000"})["data"]["result"]["result"]
        nodes = {n["node_id"]: n for n in dash.get_json("/api/v0/nodes", {"limit": "100"})["data"]["result"]["result"]}
    gangs = [r for r in rows if str(r.get("name", "")).startswith(GANG_PG_PREFIX) and r.get("state") == "CREATED"]
    assert len(gangs) == 1, [(r.get("name"), r.get("state")) for r in rows]
    gpu_bundles = [b for b in gangs[0]["bundles"] if (b.get("unit_resources") or {}).get("GPU")]
    assert len(gpu_bundles) == 2 and len({b["node_id"] for b in gpu_bundles}) == 2
    assert {nodes[b["node_id"]]["node_ip"] for b in gpu_bundles} == {h.address for h in cluster.bed.hosts}
    # Each rank's problem is "starting"; the group's says it does not serve until both run.
    group = [p for p in report["serving"]["problems"] if p["subject"].startswith("DPServer:tiny group ")]
    assert group and group[0]["code"] == "REPLICA_UNHEALTHY" and "ranks RUNNING" in group[0]["message"]


def test_killing_one_rank_restarts_the_whole_group(attempt, capsys, monkeypatch, measured):
    cluster = attempt.cluster
    monkeypatch.setenv("ORCH_API_KEY", attempt.api_key)
    assert attempt.first is not None, "the ranks were never seen"
    r0, r1 = dp_ranks(attempt.first)
    old_ids, old_group = {r0["replica_id"], r1["replica_id"]}, r0["dp"]["group"]
    host = next(h for h in cluster.bed.hosts if h.name == r1["node"])
    killed_at = time.monotonic()
    cluster.bed.ns_exec(host, ["kill", "-KILL", str(r1["pid"])])

    def new_group():
        report = attempt.status(capsys)
        ranks = dp_ranks(report)
        ids = {r["replica_id"] for d in report["serving"]["deployments"] for r in d["replicas"] if d["name"].startswith("DPServer:")}
        fresh = [r for r in ranks if r["dp"]["group"] != old_group]
        return report if not (ids & old_ids) and len(fresh) == 2 else None

    killed_wall = time.time()
    report = cluster.wait_for(new_group, timeout=RESTART_DEADLINE_S, interval=2.0)
    took = time.monotonic() - killed_at
    assert report is not None, f"Serve did not replace the whole group within {RESTART_DEADLINE_S:.0f} s of the kill"
    # Both old replicas are gone, the rank that was not killed too: the gang restarted as one.
    ranks = dp_ranks(report)
    assert {r["dp"]["rank"] for r in ranks} == {0, 1} and len({r["dp"]["group"] for r in ranks}) == 1
    attempt.log.append(f"gang restart: a new group with both ranks in orch status {took:.1f} s after the kill")
    # When Serve acted, from its controller's log on the head (figures for docs/moe.md).
    stopped, added = _controller_times(cluster, killed_wall)
    attempt.log.append(f"Serve stopped the other rank {_after(stopped, killed_wall)} and started a new gang {_after(added, killed_wall)} after the kill")
    measured("; ".join(attempt.log))


def _after(t: float | None, since: float) -> str:
    return "?" if t is None else f"{t - since:.1f} s"


def _controller_times(cluster: RayTestbedCluster, since: float) -> tuple[float | None, float | None]:
    """(sibling stopped, new gang's replicas added): the first of each line of Serve's controller
    log at or after ``since`` (its lines start with a local timestamp, ``%Y-%m-%d %H:%M:%S,%f``)."""
    head = cluster.bed.hosts[0]
    logs = sorted(Path(head.ray_dir).glob("session_*/logs/serve/controller_*.log"))
    stopped = added = None
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)
            if len(parts) < 4:
                continue
            try:
                t = datetime.strptime(f"{parts[1]} {parts[2]}", "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if t < since - 1:
                continue
            if stopped is None and "because a gang member failed" in line:
                stopped = t
            if added is None and "using gang scheduling" in line:
                added = t
    return stopped, added


def test_sigterm_stops_the_rollout_and_removes_the_dp_application(attempt):
    cluster = attempt.cluster
    proc = attempt.proc
    assert proc is not None and proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, (out[-2000:], err[-2000:])
    state = StateStore(cluster.state_dir)
    rev = state.get_revision(cluster.manifest.name, 1)
    assert rev.status == "failed" and state.current_revision(cluster.manifest.name) is None

    def serve_apps():
        with cluster.dashboard() as dash:
            return dash.get_json("/api/serve/applications/").get("applications") or {}

    # The rollout removed it (one PUT without it); Serve deletes it in the background (DELETING).
    assert cluster.wait_for(lambda: serve_apps() == {}, timeout=180, interval=2.0), list(serve_apps())
