"""plan/capacity: vLLM's scheduler defaults per GPU and the per-stage JSON contract of `orch plan`.

vLLM 0.32 ``engine/arg_utils.py`` (``get_batch_defaults``, API server): 16,384 batched tokens and
1,024 sequences on GPUs of 160 GiB and more, 8,192 / 1,024 from 70 GiB except A100s, 2,048 / 256
otherwise. The H100's 79.18 GiB is what vLLM logged for an H100 80GB (llm-d-benchmark, see
test_planner.py); the other sizes are picked on either side of the thresholds.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.plan.capacity import (
    PlanOptions,
    StageCapacity,
    activation_bytes_per_token,
    cpu_kv_cache_bytes,
    reserve_bytes,
    stage_capacities,
    terms_for,
)
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM, engine_terms, parse_vllm_version
from orchestrator.plan.memory import GIB
from orchestrator.plan.model_ref import resolve_model
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
    stage = StageCapacity(index=1, first_layer=40, layers=40, weights_bytes=33.8754 * GIB, reserve_bytes=1.23456 * GIB,
                          kv_bytes=-2.25049 * GIB, kv_bytes_per_token=163840.0, kv_tokens=0)  # fmt: skip
    assert stage.to_json() == {
        "stage": 1, "layers": [40, 80], "weights_gib": 33.875, "reserve_gib": 1.235, "kv_cache_gib": -2.25,
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


# ---- the forward-pass buffers per batched token, worked by hand from the module docstring's rule ----
# (3*I/tp + 3*H) * 2 bytes for a dense model; an MoE layer's top-k experts each (3*I_moe/tp + H),
# shared experts 3*I_moe/tp each; the dense MLP only where the model has dense layers; fp32: 4 bytes.

QWEN3_235B = resolve_model(
    Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "Qwen3-235B-A22B-Instruct-2507-FP8"
)


def test_forward_buffers_of_a_dense_model():
    llama = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    assert activation_bytes_per_token(llama, 1) == (3 * 14336 + 3 * 4096) * 2 == 110_592
    assert activation_bytes_per_token(llama, 2) == (3 * 14336 / 2 + 3 * 4096) * 2 == 67_584
    # an fp32 checkpoint runs its activations in fp32: 4 bytes each
    fp32 = spec_from_config({**LLAMA_8B, "torch_dtype": "float32"}, "c")
    assert activation_bytes_per_token(fp32, 1) == (3 * 14336 + 3 * 4096) * 4 == 221_184


def test_forward_buffers_of_moe_models():
    # Qwen3-235B-A22B (config in tests/data/planner/configs): 8 of 128 experts of width 1,536, hidden
    # 4,096, no shared experts, no dense layers; FP8 weights, activations in 16 bits.
    assert activation_bytes_per_token(QWEN3_235B, 4) == (8 * (3 * 1536 / 4 + 4096) + 3 * 4096) * 2 == 108_544
    assert activation_bytes_per_token(QWEN3_235B, 1) == (8 * (3 * 1536 + 4096) + 3 * 4096) * 2 == 163_840
    # Mixtral-8x7B: 2 experts of 14,336 per token
    assert activation_bytes_per_token(CATALOG["mixtral-8x7b"], 1) == (2 * (3 * 14336 + 4096) + 3 * 4096) * 2 == 212_992
    # DeepSeek-V3: 8 routed experts of 2,048 + 1 shared, hidden 7,168; its 3 dense layers' MLP (18,432)
    # is narrower than the routed experts' buffers, so they decide.
    deepseek = CATALOG["deepseek-v3"]
    assert (
        activation_bytes_per_token(deepseek, 8) == (8 * (3 * 2048 / 8 + 7168) + 3 * 2048 / 8 + 3 * 7168) * 2 == 171_520
    )
    assert activation_bytes_per_token(deepseek, 1) == (8 * (3 * 2048 + 7168) + 3 * 2048 + 3 * 7168) * 2 == 268_288


def test_the_dense_mlp_of_an_moe_model_counts_only_where_it_has_dense_layers():
    # Qwen3-MoE's config.json writes intermediate_size 12,288 although every layer is sparse
    # (mlp_only_layers: []): no width of it may change the buffers.
    assert activation_bytes_per_token(replace(QWEN3_235B, intermediate=1_000_000), 1) == 163_840
    # With dense layers (first_k_dense > 0) the wider of the dense MLP and the experts decides.
    wide_dense = replace(CATALOG["deepseek-v3"], intermediate=200_000)
    assert activation_bytes_per_token(wide_dense, 1) == (3 * 200_000 + 3 * 7168) * 2 == 1_243_008


# ---- the reserve's terms, worked by hand (vLLM 0.10.1 on an H100 of 79.18 GiB: 8,192 batched tokens and
# 1,024 sequences, the sort sampler at 38.5 bytes per logit, CUDA graphs not subtracted) ----

FORWARD_8B = 8192 * 110_592  # batched tokens x the dense buffers above
SAMPLER_8B = 1024 * 128256 * 38.5  # sequences x vocab x bytes per logit


def _reserve_8b(**kw) -> float:
    spec = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    options = kw.pop("options", PlanOptions(vllm_version="0.10.1"))
    return reserve_bytes(spec, H100, options, **{"tp": 1, "pp": 1, "last": True, **kw})


def test_reserve_is_non_torch_memory_plus_the_larger_of_forward_and_sampler():
    assert _reserve_8b() == pytest.approx(0.30 * GIB + SAMPLER_8B, abs=1e-3)
    assert _reserve_8b(last=False) == pytest.approx(0.30 * GIB + FORWARD_8B, abs=1e-3)  # no sampler off the last stage


def test_a_pipeline_stage_adds_nccl_memory_and_its_send_buffers():
    # PP=2 spans GPUs too (+0.25 GiB) and each stage holds 8,192 x 4,096 hidden states x 18.7 bytes.
    assert _reserve_8b(pp=2) == pytest.approx(0.55 * GIB + SAMPLER_8B + 8192 * 4096 * 18.7, abs=1e-3)
    assert _reserve_8b(pp=2, last=False) == pytest.approx(0.55 * GIB + FORWARD_8B + 8192 * 4096 * 18.7, abs=1e-3)


def test_cuda_graph_memory_as_given_or_as_the_version_subtracts_it():
    given = PlanOptions(vllm_version="0.10.1", cuda_graph_gib=0.5)
    assert _reserve_8b(options=given) == pytest.approx(0.80 * GIB + SAMPLER_8B, abs=1e-3)
    # From 0.21 vLLM subtracts its CUDA graph estimate (0.36 GiB) unless the engine runs eager. 0.29.0 runs
    # Llama on Model Runner V2 (4 bytes per logit), so there the forward buffers decide.
    assert _reserve_8b(options=PlanOptions(vllm_version="0.29.0")) == pytest.approx(
        (0.30 + 0.36) * GIB + FORWARD_8B, abs=1e-3
    )
    eager = PlanOptions(vllm_version="0.29.0", enforce_eager=True)
    assert _reserve_8b(options=eager) == pytest.approx(0.30 * GIB + FORWARD_8B, abs=1e-3)


# ---- a fixed KV cache size on a GPU (vLLM's kv_cache_memory_bytes): gpu_memory_utilization no longer
# applies, and the whole device must hold weights, reserve and the cache ----


def test_a_fixed_kv_cache_size_is_used_as_given_when_it_fits():
    spec = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    options = PlanOptions(vllm_version="0.10.1", kv_cache_gib=20, gpu_memory_utilization=0.3)
    (stage,) = stage_capacities(spec, H100, options, tp=1, pp=1)
    # 2 (K, V) x 8 KV heads x 128 x 2 bytes x 32 layers = 131,072 bytes per token; 20 GiB of them
    assert (stage.kv_bytes, stage.kv_bytes_per_token, stage.kv_tokens) == (20 * GIB, 131_072, 20 * GIB // 131_072)


def test_a_fixed_kv_cache_size_fits_exactly_and_one_byte_short_it_does_not():
    spec = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    options = PlanOptions(vllm_version="0.10.1", kv_cache_gib=20, reserve_gib=2)
    (probe,) = stage_capacities(spec, H100, options, tp=1, pp=1)
    exact = probe.weights_bytes + 2 * GIB + 20 * GIB
    assert exact == int(exact)  # whole bytes, so the device below holds exactly that much
    (fits,) = stage_capacities(spec, replace(H100, gpu_memory_bytes=int(exact)), options, tp=1, pp=1)
    assert (fits.kv_bytes, fits.kv_tokens) == (20 * GIB, 163_840)
    (short,) = stage_capacities(spec, replace(H100, gpu_memory_bytes=int(exact) - 1), options, tp=1, pp=1)
    assert (short.kv_bytes, short.kv_tokens) == (-1, 0)  # short by one byte, and says so


def test_the_engine_terms_follow_the_models_architecture_moe_and_sampler():
    # plan/engine_terms.py (vLLM release notes): Model Runner V2 is the default for Qwen3 dense models from
    # 0.22, Llama from 0.23, every dense model from 0.25, never for MoE; FlashInfer's sampler when the engine
    # logs it. The plan's terms must come from the model's own architecture and MoE flag and the options.
    llama = spec_from_config(LLAMA_8B, "meta-llama/Llama-3.1-8B config.json")
    qwen3_dense = resolve_model(Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "Qwen3-32B")
    at = PlanOptions

    def engine(spec, options):
        terms = terms_for(spec, options)
        return terms.engine, terms.sampler

    assert engine(qwen3_dense, at(vllm_version="0.22.0")) == ("V1 (Model Runner V2)", "mrv2")
    assert engine(llama, at(vllm_version="0.22.0")) == ("V1", "triton")
    # MoE: never Model Runner V2; from 0.29 vLLM requires flashinfer and samples with it by default
    assert engine(QWEN3_235B, at(vllm_version="0.29.0")) == ("V1", "flashinfer")
    assert engine(QWEN3_235B, at(vllm_version="0.29.0", flashinfer_sampler=False)) == ("V1", "triton")
    assert engine(QWEN3_235B, at(vllm_version="0.28.0")) == ("V1", "triton")  # installed or not: unknown here
    assert engine(llama, at(vllm_version="0.29.0")) == ("V1 (Model Runner V2)", "mrv2")
    assert engine(llama, at(vllm_version="0.10.1", flashinfer_sampler=True)) == ("V1", "flashinfer")
    assert engine(llama, at(vllm_version="0.10.1")) == ("V1", "sort")


def test_a_cpu_kv_cache_goes_as_the_variable_only_in_whole_gib():
    """vLLM 0.32's CPU platform reads VLLM_CPU_KVCACHE_SPACE with ``int()`` and sets
    ``kv_cache_memory_bytes = kv_cache_space * GiB_bytes`` (vllm/platforms/cpu.py,
    check_and_update_config): whole GiB go as the variable, anything else as the engine's bytes."""
    assert cpu_kv_cache_bytes(1.0) is None  # orch's default of 1 GiB
    assert cpu_kv_cache_bytes(1) is None and cpu_kv_cache_bytes(4.0) is None
    assert cpu_kv_cache_bytes(0.25) == GIB // 4
    assert cpu_kv_cache_bytes(1.5) == 3 * GIB // 2  # int("1.5") would stop the engine
