"""The layer-type KV cache against public vLLM start-up logs of hybrid models
(tests/data/planner/hybrid_logs.json, sources in tests/data/planner/SOURCES.md).

A row with the engine's own "Available KV cache memory" is planned with that memory fixed
(kv_cache_memory_bytes), so both printed lines test the layer-type sizing alone; a row without it
tests the ratio of the two lines, which the grouping, the attention block size and the version's
print form decide, whatever the memory was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan.capacity import PlanOptions, stage_capacities
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from orchestrator.plan.tinymodel import TINY_CONFIG

DATA = Path(__file__).resolve().parents[1] / "data" / "planner"
ROWS = json.loads((DATA / "hybrid_logs.json").read_text())["rows"]
TOLERANCE = 0.10  # the bar for both printed lines
# With the engine's own KV memory fixed, nothing of the reserve model is left in the comparison:
# these rows must hold to 2% (each was within one block of the log when this test was written).
KV_ONLY_TOLERANCE = 0.02


def _spec(row: dict):
    return resolve_model(str(DATA / "configs" / row["config"] / "config.json"))


def _options(row: dict, **extra) -> PlanOptions:
    opts = dict(row["options"])
    return PlanOptions(
        tp=row["tp"], pp=1, vllm_version=row.get("vllm_as", row["vllm"]), dtype="bf16", **opts, **extra,
    )  # fmt: skip


def _stage(row: dict, kv_gib: float):
    # the KV memory is fixed at what the engine logged; the GPU only has to hold the weights beside it
    shape = make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=1, gpu_memory_gib=1024)
    (stage,) = stage_capacities(_spec(row), shape, _options(row, kv_cache_gib=kv_gib), tp=row["tp"], pp=1)
    return stage


def _ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


WITH_MEMORY = [r for r in ROWS if r["available_kv_gib"] is not None]
RATIO_ONLY = [r for r in ROWS if r["available_kv_gib"] is None]


@pytest.mark.parametrize("row", WITH_MEMORY, ids=_ids(WITH_MEMORY))
def test_both_printed_lines_are_within_10_percent_of_the_log(row):
    stage = _stage(row, row["available_kv_gib"])
    assert stage.logged_tokens is not None and stage.concurrency is not None
    assert abs(stage.logged_tokens - row["kv_tokens"]) / row["kv_tokens"] <= KV_ONLY_TOLERANCE <= TOLERANCE, (stage.logged_tokens, row["kv_tokens"])
    assert abs(stage.concurrency - row["concurrency"]) / row["concurrency"] <= KV_ONLY_TOLERANCE, (stage.concurrency, row["concurrency"])


@pytest.mark.parametrize("row", RATIO_ONLY, ids=_ids(RATIO_ONLY))
def test_the_ratio_of_the_two_lines_is_the_versions(row):
    # up to 0.20 vLLM printed blocks // groups x block size beside blocks / blocks-per-request:
    # their ratio is blocks-per-request x block size / groups, whatever the memory
    stage = _stage(row, 40.0)
    ours = stage.logged_tokens / stage.concurrency
    logged = row["kv_tokens"] / row["concurrency"]
    assert abs(ours - logged) / logged <= KV_ONLY_TOLERANCE, (ours, logged)


def test_the_plan_prints_the_lines_and_the_layer_types():
    row = next(r for r in ROWS if r["id"] == "qwen3.8-27b-fp8-tp2")
    shape = make_shape(gpu_type_name="H200-141GB", gpus_per_node=2, nodes=1)
    plan = plan_model(_spec(row), shape, _options(row, kv_cache_gib=row["available_kv_gib"]))
    assert plan.vllm_lines == {"kv_cache_size_tokens": 302921, "max_concurrency": 2.31, "max_model_len": 131072}
    assert plan.layer_types == "48 Gated DeltaNet + 16 full attention"
    assert any("layer_types" in s and "qwen3_5.py" in s for s in plan.layer_sources)


def test_a_long_context_that_vllm_ran_is_planned_as_fitting():
    # the same engine at 262,144 tokens: one request takes cdiv(262144, 1568) = 168 attention
    # blocks + 2 state pages in each of 3 groups, of 208 blocks (PR #1995: "168 blocks of ~193
    # available, so it fits"); counting every layer as full attention would need 16 GiB per GPU
    row = next(r for r in ROWS if r["id"] == "qwen3.8-27b-fp8-tp2")
    shape = make_shape(gpu_type_name="H200-141GB", gpus_per_node=2, nodes=1)
    opts = _options(row, kv_cache_gib=row["available_kv_gib"])
    plan = plan_model(_spec(row), shape, PlanOptions(**{**opts.__dict__, "max_model_len": 262144}))
    assert plan.fits is True
    assert 1.0 <= plan.max_concurrency <= 1.3


def _cpu_engine_plan(spec):
    """The plan for the CPU engine runs below: one CPU node, 0.25 GiB of KV cache, 1,024 batched
    tokens, max_model_len 4,096, vLLM 0.32 (the settings each run's log was made with)."""
    cpu = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1)
    return plan_model(spec, cpu, PlanOptions(max_model_len=4096, kv_cache_gib=0.25, max_num_batched_tokens=1024, vllm_version="0.32.0"))


def test_the_cpu_engine_of_a_sliding_window_model_prints_what_the_plan_says():
    # tests/data/planner/vllm-0.32-cpu-tiny-swa.log: the tiny Llama with layers [sliding 64, full] x 2
    # on vLLM 0.32's CPU backend, 0.25 GiB of KV cache, 1,024 batched tokens, max_model_len 4,096
    log = (DATA / "vllm-0.32-cpu-tiny-swa.log").read_text()
    assert "CPU KV cache size: 199,728 tokens, Maximum concurrency for 4,096 tokens per request: 48.76x" in log
    cfg = {**TINY_CONFIG, "model_type": "llama", "layer_types": ["sliding_attention", "full_attention"] * 2, "sliding_window": 64}
    spec = spec_from_config(cfg, "tiny-swa", name="tiny-swa")
    plan = _cpu_engine_plan(spec)
    assert plan.layer_types == "2 sliding-window (64) + 2 full attention"
    # the CPU platform's block of 128 tokens: 0.25 GiB // (2 layers x 128 x 512 B) = 2,048 blocks, a request
    # takes cdiv(4096, 128) = 32 + cdiv(63 + 1024, 128) + 1 = 10 of them: 48.76x, int(48.76 x 4096) = 199,728
    assert plan.vllm_lines == {"kv_cache_size_tokens": 199728, "max_concurrency": 48.76, "max_model_len": 4096}


def test_the_cpu_engine_of_a_pure_mamba2_model_prints_what_the_plan_says():
    # tests/data/planner/vllm-0.32-cpu-tiny-mamba2.log: a random-weight Mamba2 (2 layers) on vLLM 0.32's
    # CPU backend, 0.25 GiB. One state: conv (512 + 2 x 16) x 3 x 2 B + temporal 8 x 64 x 16 x 2 B =
    # 19,648 B per layer; one group of both layers: 0.25 GiB // 39,296 B = 6,831 blocks, one per request
    # (attention-free: no prefix caching, so no second "align" page): 6831.00x, 27,979,776 tokens.
    # The config names no length key: vLLM takes the --max-model-len it is given.
    log = (DATA / "vllm-0.32-cpu-tiny-mamba2.log").read_text()
    assert "CPU KV cache size: 27,979,776 tokens, Maximum concurrency for 4,096 tokens per request: 6831.00x" in log
    spec = resolve_model(str(DATA / "configs" / "tiny-mamba2" / "config.json"))
    plan = _cpu_engine_plan(spec)
    assert plan.layer_types == "2 Mamba2"
    assert plan.vllm_lines == {"kv_cache_size_tokens": 27979776, "max_concurrency": 6831.0, "max_model_len": 4096}


def test_the_cpu_engine_of_a_gated_deltanet_hybrid_prints_what_the_plan_says():
    # tests/data/planner/vllm-0.32-cpu-tiny-gdn.log: a random-weight Qwen3-Next (3 Gated DeltaNet + 1 full
    # attention layer) on vLLM 0.32's CPU backend, 0.25 GiB, prefix caching on ("Mamba cache mode is set to
    # 'align'"), the state page padded to the 128-token attention page of 65,536 B: 4,096 blocks, a request
    # takes 32 attention blocks + 2 state pages in each of 3 groups = 38: 107.79x, 441,505 tokens.
    log = (DATA / "vllm-0.32-cpu-tiny-gdn.log").read_text()
    assert "CPU KV cache size: 441,505 tokens, Maximum concurrency for 4,096 tokens per request: 107.79x" in log
    spec = resolve_model(str(DATA / "configs" / "tiny-gdn" / "config.json"))
    plan = _cpu_engine_plan(spec)
    assert plan.layer_types == "3 Gated DeltaNet + 1 full attention"
    assert plan.vllm_lines == {"kv_cache_size_tokens": 441505, "max_concurrency": 107.79, "max_model_len": 4096}
