"""plan/capacity: vLLM's scheduler defaults per GPU and the per-stage JSON contract of `orch plan`.

vLLM 0.32 ``engine/arg_utils.py`` (``get_batch_defaults``, API server): 16,384 batched tokens and
1,024 sequences on GPUs of 160 GiB and more, 8,192 / 1,024 from 70 GiB except A100s, 2,048 / 256
otherwise. The H100's 79.18 GiB is what vLLM logged for an H100 80GB (llm-d-benchmark, see
test_planner.py); the other sizes are picked on either side of the thresholds.
"""

from __future__ import annotations

import pytest

from orchestrator.plan.capacity import (
    PlanOptions,
    StageCapacity,
    reserve_bytes,
    stage_capacities,
)
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM, engine_terms, parse_vllm_version
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape
from orchestrator.plan.tinymodel import TINY_CONFIG


@pytest.mark.parametrize(("gpu_type", "gib", "expected"), [
    ("H100-80GB", 79.18, (8192, 1024)),
    ("A100-80GB", 79.15, (2048, 256)),
    ("B200", 179.06, (16384, 1024)),
    ("L4", 22.05, (2048, 256)),
    ("H100-80GB", 70.0, (8192, 1024)),  # the 70 GiB threshold itself
    ("B200", 160.0, (16384, 1024)),  # the 160 GiB threshold itself
    ("L40S", 69.99, (2048, 256)),
])  # fmt: skip
def test_vllm_scheduler_defaults_by_gpu(gpu_type, gib, expected):
    terms = engine_terms(parse_vllm_version(GPU_EXTRA_VLLM))
    assert terms.batch_defaults(int(gib * GIB), gpu_type, 131072) == expected


def test_stage_json_contract():
    # docs/planner.md: per stage, its layer range [first, end), GiB rounded to 3 places, bytes per
    # token and the KV tokens.
    stage = StageCapacity(index=1, first_layer=40, layers=40, weights_bytes=33.8754 * GIB, reserve_bytes=1.5 * GIB,
                          kv_bytes=-2.25 * GIB, kv_bytes_per_token=163840.0, kv_tokens=0)  # fmt: skip
    assert stage.to_json() == {
        "stage": 1, "layers": [40, 80], "weights_gib": 33.875, "reserve_gib": 1.5, "kv_cache_gib": -2.25,
        "kv_bytes_per_token": 163840.0, "kv_cache_tokens": 0,
    }  # fmt: skip


# ---- the CPU backend: the KV cache is VLLM_CPU_KVCACHE_SPACE GiB ----
# vLLM 0.32 CPU with VLLM_CPU_KVCACHE_SPACE=1 logged 524,288 KV tokens for the demo model (4 layers,
# 2 KV heads of 64: 2,048 bytes per token in bf16): tests/data/planner/vllm-0.32-cpu-tiny.log.

CPU = ClusterShape(gpus_per_node=1, nodes=1, gpu_memory_bytes=None, gpu_type="cpu")


def _tiny(dtype: str = "bfloat16"):
    return spec_from_config({**TINY_CONFIG, "torch_dtype": dtype}, "tiny config.json")


def test_cpu_kv_cache_is_the_configured_space():
    (stage,) = stage_capacities(_tiny(), CPU, PlanOptions(), tp=1, pp=1)
    got = (stage.index, stage.reserve_bytes, stage.kv_bytes, stage.kv_bytes_per_token, stage.kv_tokens)
    assert got == (0, 0.0, GIB, 2048, 524_288)
    (two,) = stage_capacities(_tiny(), CPU, PlanOptions(kv_cache_gib=2), tp=1, pp=1)
    assert two.kv_tokens == 1_048_576
    (fp32,) = stage_capacities(_tiny("float32"), CPU, PlanOptions(), tp=1, pp=1)
    assert (fp32.kv_bytes_per_token, fp32.kv_tokens) == (4096, 262_144)  # auto: the model's 4-byte dtype
    (fp8,) = stage_capacities(_tiny(), CPU, PlanOptions(kv_cache_dtype="fp8"), tp=1, pp=1)
    assert fp8.kv_tokens == 1_048_576
    stages = stage_capacities(_tiny(), CPU, PlanOptions(), tp=1, pp=2)
    assert [(s.index, s.first_layer, s.layers) for s in stages] == [(0, 0, 2), (1, 2, 2)]


def test_a_gpu_too_small_has_no_kv_tokens_and_says_by_how_much():
    shape = ClusterShape(gpus_per_node=1, nodes=1, gpu_memory_bytes=int(0.5 * GIB), gpu_type="small")
    (stage,) = stage_capacities(_tiny(), shape, PlanOptions(), tp=1, pp=1)
    assert stage.kv_bytes < 0 and stage.kv_tokens == 0


# ---- what vLLM keeps out of the KV cache (docs/planner.md's reserve table) ----

LLAMA_8B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
}  # fmt: skip
H100 = ClusterShape(gpus_per_node=8, nodes=1, gpu_memory_bytes=int(79.18 * GIB), gpu_type="H100-80GB")


def test_reserve_terms_follow_the_planner_table():
    """vLLM 0.10 (V1, sort sampler, CUDA graphs not yet subtracted): docs/planner.md's terms."""
    spec = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    opts = PlanOptions(vllm_version="0.10.1")

    def reserve(**kw):
        return reserve_bytes(spec, H100, kw.pop("options", opts), **{"tp": 1, "pp": 1, "last": True, **kw})

    # Here the sampler's logits (1,024 sequences x 128,256 vocab) outweigh the forward buffers, on the last stage only.
    assert reserve(last=False) < reserve() - 3 * GIB
    # + 0.25 GiB of non-torch memory once the replica spans GPUs by TP (NCCL).
    assert reserve(tp=2) - reserve() == pytest.approx(0.25 * GIB)
