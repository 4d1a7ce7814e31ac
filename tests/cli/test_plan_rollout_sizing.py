"""`orch plan --cluster` and `orch rollout --dry-run` size a model by one pipeline
(workflows.plan.size_model): with a calibration record of the configuration on the cluster, both
print the same layout, KV cache and max_model_len, and that sizing is the calibrated one, not the
modelled one a rollout used to deploy. The record is made from a real engine log: dennislee22's
vLLM 0.10.1.1 run of Qwen2-7B-Instruct on one A100-80GB at gpu_memory_utilization 0.5 ("Model
loading took 14.2488 GiB", "Available KV cache memory: 24.83 GiB"; tests/data/planner/SOURCES.md)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from orchestrator.cli import main
from orchestrator.cluster.node_state import NodeState
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.calibration import calibration_record, model_fingerprint, parse_engine_figures
from orchestrator.plan.model_ref import resolve_model
from orchestrator.remote.fake import FakeRunner, result
from orchestrator.state import StateStore
from orchestrator.workflows.calibration import save_calibration
from orchestrator.workflows.rollout import ClusterApis, ServingDeps
from tests.workflows.rollout_world import FakeEndpoint, FakeServe

DATA = Path(__file__).resolve().parents[1] / "data" / "planner"
MODEL = DATA / "configs" / "Qwen2-7B-Instruct"
LOG = DATA / "logs" / "dennislee-7B-1gpuA10080GB-0.5GRAM.log"
MANIFEST = """
name: a100
nodes:
  - {name: g1, host: 10.0.0.1, role: head, gpus: 1, gpu_type: A100-80GB}
serve: {http_port: 8000, api_key_env: ORCH_SIZING_KEY}
"""
FLAGS = ["--model", str(MODEL), "--max-model-len", "16384", "--gpu-memory-utilization", "0.5", "--sampler", "flashinfer"]
SIZING = ("tp", "pp", "dp", "expert_parallel", "max_model_len", "gpu_memory_utilization", "weights_gib_per_gpu", "reserve_gib_per_gpu",
          "kv_cache_gib_per_gpu", "kv_cache_tokens", "max_concurrency", "max_num_seqs", "max_num_batched_tokens")  # fmt: skip


def _up_cluster(tmp_path: Path) -> tuple[Path, Path]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(MANIFEST)
    manifest = load_manifest_file(cluster)
    state = StateStore(tmp_path / "state")
    state.record_cluster(manifest.name, manifest.fingerprint(), "10.0.0.1", 8265, {"g1": "n1"})
    state.save_facts(manifest.name, {"g1": {"versions": {"vllm": "0.10.1.1"}}})  # what `orch up` probed
    return cluster, tmp_path / "state"


def _fake_deps(state_dir: Path):
    node = NodeState("n1", "g1", "10.0.0.1", "ALIVE", True, {"GPU": 1.0, "CPU": 8.0, "accelerator_type:A100": 1.0})
    runners = {"g1": FakeRunner("g1", default=result()).on(("nproc",), result(stdout="8\n"))}

    @contextmanager
    def open_runners(_m):
        yield runners

    @contextmanager
    def open_apis(_m, _r, _t):
        yield ClusterApis(serve=FakeServe(), nodes=lambda: [node], endpoint=FakeEndpoint())

    return lambda manifest, _dir, progress: ServingDeps(state=StateStore(state_dir), open_runners=open_runners, open_apis=open_apis,
                                                        validate=lambda _app: None, progress=progress, environ={})  # fmt: skip


def _plan(capsys, state_dir: Path, cluster: Path) -> dict:
    assert main(["--state-dir", str(state_dir), "plan", *FLAGS, "--cluster", str(cluster), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _rollout_plan(capsys, monkeypatch, state_dir: Path, cluster: Path) -> dict:
    monkeypatch.setattr("orchestrator.cli.rollout.rollout_deps", _fake_deps(state_dir))
    rc = main(["--state-dir", str(state_dir), "rollout", str(cluster), *FLAGS, "--dry-run", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)["plan"]


def test_plan_and_rollout_dry_run_give_the_same_calibrated_sizing(capsys, monkeypatch, tmp_path):
    cluster, state_dir = _up_cluster(tmp_path)
    modelled = _plan(capsys, state_dir, cluster)
    assert not any("calibrated" in r for r in modelled["reasons"])  # no record yet
    assert {k: modelled[k] for k in SIZING} == {k: _rollout_plan(capsys, monkeypatch, state_dir, cluster)[k] for k in SIZING}

    # the rollout of this configuration recorded what its engine logged
    record = calibration_record({**modelled, "model_fingerprint": model_fingerprint(resolve_model(MODEL))},
                                parse_engine_figures(LOG.read_text().splitlines()))  # fmt: skip
    assert record is not None and record["measured_reserve_gib"] is not None
    save_calibration(StateStore(state_dir), "a100", {**record, "revision": 7})

    planned = _plan(capsys, state_dir, cluster)
    rolled = _rollout_plan(capsys, monkeypatch, state_dir, cluster)
    reserve = 79.15 * 0.5 - 14.2488 - 24.83  # CUDA's A100-80GB total x util - what vLLM logged
    for plan in (planned, rolled):
        assert any(f"calibrated: revision 7 of this configuration measured {reserve:.2f} GiB" in r for r in plan["reasons"])
        assert abs(plan["reserve_gib_per_gpu"] - reserve) < 0.01
    assert {k: planned[k] for k in SIZING} == {k: rolled[k] for k in SIZING}
    # and the calibration changed the sizing: a rollout that skipped it would deploy another KV cache
    assert rolled["kv_cache_tokens"] != modelled["kv_cache_tokens"]
    assert abs(rolled["kv_cache_gib_per_gpu"] - 24.83) < 0.1  # the engine's figure (orch's weights are 14.18 GiB, vLLM's 14.25)


def test_a_model_store_folder_is_what_both_size(capsys, monkeypatch, tmp_path):
    """`--model NAME` on a manifest with a model_store: the rollout loads <model_store>/NAME, and
    `orch plan --cluster` sizes that folder's config.json as the rollout does (it is readable here)."""
    store = tmp_path / "models"
    (store / "qwen7b").mkdir(parents=True)
    (store / "qwen7b" / "config.json").write_bytes((MODEL / "config.json").read_bytes())
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(MANIFEST + f"model_store: {store}\n")
    state_dir = tmp_path / "state"
    flags = ["--model", "qwen7b", "--max-model-len", "16384", "--gpu-memory-utilization", "0.5", "--sampler", "flashinfer"]
    assert main(["--state-dir", str(state_dir), "plan", *flags, "--cluster", str(cluster), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    monkeypatch.setattr("orchestrator.cli.rollout.rollout_deps", _fake_deps(state_dir))  # not up: rendered, validated by nothing
    assert main(["--state-dir", str(state_dir), "rollout", str(cluster), *flags, "--dry-run", "--json"]) == 0
    rolled = json.loads(capsys.readouterr().out)
    assert rolled["config"]["args"]["llm_configs"][0]["model_loading_config"]["model_source"] == str(store / "qwen7b")
    assert planned["model"] == rolled["plan"]["model"] == "qwen7b"
    assert 7.5e9 < planned["params"] < 7.7e9  # Qwen2-7B-Instruct's 7.6B (its model card), not a catalog entry's
    assert {k: planned[k] for k in SIZING} == {k: rolled["plan"][k] for k in SIZING}
