"""ModelOpt MIXED_PRECISION checkpoints, and quantization names that match nothing (issue 43 item 3).

Expected values come from vLLM 0.32.0's ``vllm/model_executor/layers/quantization/modelopt.py``
(``ModelOptMixedPrecisionConfig._resolve_quant_algo`` and ``LINEAR_ALGOS``: a module takes the
``quantized_layers`` entry of its own name, of a shard of its fused module, or, for routed experts,
of the ``...mlp.experts`` prefix or any key under it; a module with no entry gets
``UnquantizedLinearMethod``), the bytes each algo's ``create_weights`` allocates (FP8: one byte per
weight and per-tensor scales; NVFP4: two weights per byte and one fp8 scale per 16), and the real
``hf_quant_config.json`` files in tests/data/checkpoints (SOURCES.md names their origins). The
architecture numbers are Qwen3-235B-A22B's config.json (tests/data/planner/configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.modules import quantized_layer_bytes_per_gpu
from orchestrator.plan.planner import plan_model
from orchestrator.plan.quant_names import check_quantization_names, name_report
from orchestrator.plan.shape import make_shape
from orchestrator.plan.sharding import Sharding

DATA = Path(__file__).resolve().parents[1] / "data"
CHECKPOINTS = DATA / "checkpoints"
QWEN3_235B = json.loads((DATA / "planner" / "configs" / "Qwen3-235B-A22B-Instruct-2507-FP8" / "config.json").read_text())
H100X8 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1)

# Qwen3-235B-A22B, one layer: hidden 4096, 64 heads x 128, 4 KV heads x 128, 128 experts of 1536
Q = 4096 * 64 * 128  # q_proj
KV = 4096 * 4 * 128  # k_proj, v_proj each
OUT = 64 * 128 * 4096  # o_proj
EXPERTS = 128 * 3 * 4096 * 1536  # gate, up, down of every routed expert
ROUTER = 4096 * 128  # mlp.gate: built without a quant config, 16-bit
FP8 = 1.0  # bytes per weight (per-tensor scales: a few bytes, not counted)
NVFP4 = 0.5 + 1 / 16  # two weights per byte + one fp8 scale per group of 16


def _mixed(layers: dict, **extra) -> dict:
    """A config.json whose quantization_config is ModelOpt's config.json form of MIXED_PRECISION
    (``quant_method: modelopt``, ``quantized_layers``: the form NVIDIA Model-Optimizer writes since
    its PR #929, which vLLM reads first)."""
    cfg = dict(QWEN3_235B)
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers, **extra}
    return cfg


def _layer_bytes(cfg: dict, layer: int) -> float:
    spec = spec_from_config(cfg, "test config.json", name="qwen3-235b-mixed")
    return quantized_layer_bytes_per_gpu(spec, layer, Sharding(tp=1))


# nvidia/Qwen3.5-397B-A17B-NVFP4-V2's layout (FP8 attention and shared expert, NVFP4 routed experts
# as one "...mlp.experts" entry per layer), on Qwen3-235B's modules
LAYOUT = {
    **{f"model.layers.0.self_attn.{p}": {"quant_algo": "FP8"} for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
    "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
}


def test_each_module_takes_its_own_entrys_algo_and_unlisted_layers_stay_16_bit():
    cfg = _mixed(LAYOUT)
    # layer 0: attention FP8, experts NVFP4, router 16-bit
    assert _layer_bytes(cfg, 0) == pytest.approx((Q + 2 * KV + OUT) * FP8 + EXPERTS * NVFP4 + ROUTER * 2)
    # layer 1 has no entry: vLLM gives every module UnquantizedLinearMethod
    assert _layer_bytes(cfg, 1) == pytest.approx((Q + 2 * KV + OUT + EXPERTS + ROUTER) * 2)


def test_a_fused_module_takes_the_algo_of_the_shards_listed():
    # vLLM fuses q/k/v into qkv_proj and resolves it from the shards present (step 2 of
    # _resolve_quant_algo): v_proj without an entry is FP8 like q_proj and k_proj
    layers = {"model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}, "model.layers.0.self_attn.k_proj": {"quant_algo": "FP8"}}
    assert _layer_bytes(_mixed(layers), 0) == pytest.approx((Q + 2 * KV) * FP8 + (OUT + EXPERTS + ROUTER) * 2)


def test_per_expert_keys_quantize_the_whole_expert_module():
    # Nemotron-H style keys (one per expert projection): vLLM's routed experts are one module
    # "...mlp.experts", resolved from the first key under it (step 3)
    layers = {"model.layers.0.mlp.experts.0.up_proj": {"quant_algo": "NVFP4", "group_size": 16},
              "model.layers.0.mlp.experts.1.down_proj": {"quant_algo": "NVFP4", "group_size": 16}}  # fmt: skip
    assert _layer_bytes(_mixed(layers), 0) == pytest.approx(EXPERTS * NVFP4 + (Q + 2 * KV + OUT + ROUTER) * 2)
    assert name_report(spec_from_config(_mixed(layers), "c", name="m")).entries == ()


def test_fp8_block_and_per_channel_entries():
    # FP8_PB_WO: fp32 scale per group_size x group_size block; FP8_PER_CHANNEL_PER_TOKEN: fp32 per output row
    layers = {"model.layers.0.self_attn.o_proj": {"quant_algo": "FP8_PB_WO", "group_size": 128},
              "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}  # fmt: skip
    o_bytes = OUT + (4096 // 128) * (8192 // 128) * 4
    q_bytes = Q + 8192 * 4
    # k/v are q's shards: FP8 per channel like it
    kv_bytes = 2 * (KV + 512 * 4)
    assert _layer_bytes(_mixed(layers), 0) == pytest.approx(o_bytes + q_bytes + kv_bytes + (EXPERTS + ROUTER) * 2)


def test_an_algo_vllm_does_not_load_per_layer_is_refused_naming_the_entry():
    layers = {"model.layers.0.self_attn.q_proj": {"quant_algo": "W4A16_AWQ"}}
    with pytest.raises(ModelSpecError, match="'model.layers.0.self_attn.q_proj' has quant_algo 'W4A16_AWQ'"):
        spec_from_config(_mixed(layers), "c", name="m")


def test_mixed_precision_without_quantized_layers_is_refused_as_vllm_refuses_it():
    with pytest.raises(ModelSpecError, match="without a quantized_layers mapping"):
        spec_from_config(_mixed({}), "c", name="m")


def test_the_real_deepseek_v4_flash_nvfp4_checkpoint_is_refused_not_sized_at_16_bits():
    # nvidia/DeepSeek-V4-Flash-NVFP4's hf_quant_config.json names its experts "layers.N.ffn.experts";
    # vLLM's model names are "model.layers.N.mlp.experts": none of the 43 entries resolves, and
    # without this check every expert was sized at 16 bits (3.6x its NVFP4 size), exit 0
    spec = resolve_model(str(CHECKPOINTS / "nvidia--DeepSeek-V4-Flash-NVFP4"))
    report = name_report(spec)
    assert len(report.entries) == 43 and report.entries[0] == "layers.0.ffn.experts"
    # its exclusions: "head" matches lm_head (ModelOpt matches substrings), "mtp.*" is the MTP layer
    assert report.excluded == ("*.attn.*", "*.ffn.shared_experts.*") and report.not_loaded == ("mtp.*",)
    with pytest.raises(ModelSpecError, match="43 of the 43 quantized_layers entries match no module") as err:
        plan_model(spec, H100X8)
    assert "layers.0.ffn.experts" in str(err.value)


@pytest.mark.parametrize("checkpoint", ["nvidia--Gemma-4-31B-IT-NVFP4", "meta-llama--Llama-3.1-405B-Instruct-FP8", "openai--gpt-oss-120b",
                                        "nvidia--Llama-3.1-70B-Instruct-FP8", "deepseek-ai--DeepSeek-V3"])  # fmt: skip
def test_real_exclusion_lists_whose_names_all_exist_raise_no_warning(checkpoint):
    # every name in these real lists is a module vLLM has under the architecture's names (Gemma 4:
    # model.language_model.layers.N.self_attn*, its vision tower; gpt-oss: model.layers.N.mlp.router)
    assert check_quantization_names(resolve_model(str(CHECKPOINTS / checkpoint))) == []


def test_an_exclusion_pattern_that_matches_nothing_is_a_warning_in_the_plan_naming_it():
    cfg = json.loads((CHECKPOINTS / "Qwen--Qwen3-32B-FP8" / "config.json").read_text())
    # the real Gemma-4-31B NVFP4 list's vision pattern, on a text-only model: it names nothing there
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["model.embed_vision*", "lm_head"]}
    spec = spec_from_config(cfg, "c", name="qwen3-32b")
    plan = plan_model(spec, H100X8)
    warnings = [r for r in plan.reasons if r.startswith("warning:")]
    assert len(warnings) == 1 and "1 exclusion pattern(s)" in warnings[0] and "model.embed_vision*" in warnings[0]


def test_layer_exclusions_of_which_none_exists_under_vllms_names_are_an_error():
    # the real Gemma-4-31B NVFP4 exclusion list renamed the way DeepSeek-V4's names attention
    # ("attn" instead of "self_attn"): its layers would be sized NVFP4 where the checkpoint keeps 16 bits
    folder = CHECKPOINTS / "nvidia--Gemma-4-31B-IT-NVFP4"
    cfg = json.loads((folder / "config.json").read_text())
    legacy = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "ignore": [p.replace(".self_attn*", ".attn*") for p in legacy["exclude_modules"]]}  # fmt: skip
    spec = spec_from_config(cfg, "c", name="gemma4")
    with pytest.raises(ModelSpecError, match="none of the 60 excluded decoder-layer pattern"):
        check_quantization_names(spec)
