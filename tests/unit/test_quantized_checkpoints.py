"""Quantized checkpoints sized from their own files (issue 26 item 1).

Expected values: the real configs and sizes in tests/data/checkpoints (SOURCES.md names each
origin and says which figures were seen before a choice was made), and the tensor shapes vLLM's
``create_weights`` allocates per quantization method (vllm/model_executor/layers/quantization/,
0.29.0 and 0.32.0), written out here independently of orch's ``Storage``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError, PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.memory import GIB, stage_weight_bytes
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.modules import quantized_layer, quantized_layer_bytes_per_gpu
from orchestrator.plan.planner import plan_model
from orchestrator.plan.quantization import parse_quantization
from orchestrator.plan.shape import make_shape
from orchestrator.plan.sharding import Sharding

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
SIZES = json.loads((DATA / "sizes.json").read_text())["rows"]
H100X8 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1)


def _spec(row: dict):
    folder = DATA / row["checkpoint"]
    config = json.loads((folder / "config.json").read_text())
    config.update(row["config_overrides"])
    return spec_from_config(config, str(folder / "config.json"), name=folder.name)


def _whole_model_per_gpu(spec, tp: int) -> float:
    return stage_weight_bytes(spec, 0, spec.layers, tp=tp, first=True, last=True)


@pytest.mark.parametrize("row", SIZES, ids=[f"{r['checkpoint'].split('/')[-1]}-tp{r['tp']}-{i}" for i, r in enumerate(SIZES)])
def test_weights_are_within_5_percent_of_what_vllm_loaded_or_the_checkpoint_holds(row):
    ours = _whole_model_per_gpu(_spec(row), row["tp"])
    real = row["gib"] * GIB if "gib" in row else row["bytes"]
    tolerance = row.get("tolerance", 0.05 if row["set"] == "fit" or row["config_overrides"] == {} else 0.01)
    assert abs(ours - real) / real <= tolerance, f"{ours / GIB:.3f} GiB against {real / GIB:.3f} GiB"


def test_the_405b_fp8_log_is_matched_to_within_a_tenth_of_a_percent_at_its_16_kv_heads():
    row = next(r for r in SIZES if r["config_overrides"] == {"num_key_value_heads": 16})
    assert abs(_whole_model_per_gpu(_spec(row), 8) / GIB - 57.752) / 57.752 < 0.001


def test_the_405b_fp8_checkpoint_plans_tp8_on_one_node_of_8_h100():
    spec = resolve_model(str(DATA / "meta-llama--Llama-3.1-405B-Instruct-FP8"))
    plan = plan_model(spec, H100X8)
    assert (plan.fits, plan.tp, plan.pp, plan.replicas, plan.dtype) == (True, 8, 1, 1, "fp8")
    assert abs(plan.weights_gib_per_gpu - 57.75) / 57.75 < 0.05
    # the plan says which quantization it read and from which file
    said = [r for r in plan.reasons if r.startswith("weights: ")]
    assert said == [
        "weights: fbgemm_fp8, fp8 weights, fp32 scale per output channel, read from "
        f"{DATA / 'meta-llama--Llama-3.1-405B-Instruct-FP8' / 'config.json'} (quantization_config); "
        "511 module pattern(s) it lists stay 16-bit"
    ]
    assert plan.to_json()["quantization"]["method"] == "fbgemm_fp8"
    # vLLM loads the checkpoint's own quantization: orch passes none
    assert "quantization" not in plan.engine_kwargs()
    # the same model at bf16 does not fit the node (the "nothing fits")
    assert plan_model(CATALOG["llama3-405b"], H100X8).fits is False


def test_the_405b_list_keeps_attention_and_the_first_and_last_mlp_at_16_bits():
    spec = resolve_model(str(DATA / "meta-llama--Llama-3.1-405B-Instruct-FP8"))
    kinds = {layer: {lin.name: (st.kind if st else "bf16") for lin, st in quantized_layer(spec, layer)} for layer in (0, 1, 125)}
    assert set(kinds[0].values()) == {"bf16"} and set(kinds[125].values()) == {"bf16"}
    assert kinds[1] == {"self_attn.q_proj": "bf16", "self_attn.k_proj": "bf16", "self_attn.v_proj": "bf16", "self_attn.o_proj": "bf16",
                        "mlp.gate_proj": "fp8", "mlp.up_proj": "fp8", "mlp.down_proj": "fp8"}  # fmt: skip


def test_gpt_oss_quantizes_only_the_experts():
    spec = resolve_model(str(DATA / "openai--gpt-oss-120b"))
    kinds = {lin.name: (st.kind if st else "bf16") for lin, st in quantized_layer(spec, 7)}
    assert kinds == {"self_attn.q_proj": "bf16", "self_attn.k_proj": "bf16", "self_attn.v_proj": "bf16", "self_attn.o_proj": "bf16",
                     "mlp.gate": "bf16", "mlp.experts.0.gate_proj": "mxfp4", "mlp.experts.0.up_proj": "mxfp4",
                     "mlp.experts.0.down_proj": "mxfp4"}  # fmt: skip


def test_modelopt_fp8_is_read_from_hf_quant_config_json_and_makes_the_kv_cache_fp8():
    folder = DATA / "nvidia--Llama-3.1-70B-Instruct-FP8"
    spec = resolve_model(str(folder))
    assert spec.quantization is not None
    assert (spec.dtype, spec.quantization.method, spec.quantization.source) == ("fp8", "modelopt", str(folder / "hf_quant_config.json"))
    assert spec.quantization.ignore == ("lm_head",) and spec.quantization.kv_cache_dtype == "fp8"
    # vLLM's kv_cache_dtype=auto follows kv_cache_quant_algo: 1 byte per number
    # (80 layers x 2 (K, V) x 1 KV head per GPU at TP=8 x 128)
    options = PlanOptions(max_model_len=8192, tp=8, pp=1)
    assert plan_model(spec, H100X8, options).kv_bytes_per_token_per_gpu == 80 * 2 * 1 * 128 * 1
    # the config alone (no hf_quant_config.json): 16-bit weights and a 16-bit KV cache
    bf16 = spec_from_config(json.loads((folder / "config.json").read_text()), "c")
    assert bf16.quantization is None and plan_model(bf16, H100X8, options).kv_bytes_per_token_per_gpu == 80 * 2 * 1 * 128 * 2


def test_modelopt_nvfp4_wildcards_keep_the_listed_attention_16_bit():
    spec = resolve_model(str(DATA / "nvidia--Gemma-4-31B-IT-NVFP4"))
    assert spec.quantization is not None and spec.quantization.method == "modelopt" and spec.quantization.scheme == "NVFP4 weights, fp8 scale per 16"
    kinds = {lin.name: (st.kind if st else "bf16") for lin, st in quantized_layer(spec, 33)}
    assert kinds == {"self_attn.q_proj": "bf16", "self_attn.k_proj": "bf16", "self_attn.v_proj": "bf16", "self_attn.o_proj": "bf16",
                     "mlp.gate_proj": "nvfp4", "mlp.up_proj": "nvfp4", "mlp.down_proj": "nvfp4"}  # fmt: skip
    # the legacy hf_quant_config.json beside it says the same
    legacy = parse_quantization(json.loads((DATA / "nvidia--Gemma-4-31B-IT-NVFP4" / "hf_quant_config.json").read_text()), "h")
    assert (legacy.scheme, legacy.ignore, legacy.kv_cache_dtype) == (spec.quantization.scheme, spec.quantization.ignore, "fp8")


# ---- the bytes of one matrix, from the shapes vLLM allocates (in = 4096, out = 14336) ----

N_IN, N_OUT = 4096, 14336
INT32, FP16, FP32 = 4, 2, 4
AWQ_G128 = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
GPTQ_G128 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def _ct(weights: dict) -> dict:
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ["lm_head"]}


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        # auto_awq.py AutoAWQMarlinLinearMethod: qweight [in, out/8] int32, qzeros [in/g, out/8] int32, scales [in/g, out] fp16
        (AWQ_G128, N_IN * N_OUT // 8 * INT32 + N_IN // 128 * N_OUT // 8 * INT32 + N_IN // 128 * N_OUT * FP16),
        # auto_gptq.py: qweight [in/8, out] int32, g_idx [in] int32, qzeros [in/g, out/8] int32, scales [in/g, out] fp16
        (GPTQ_G128, N_IN // 8 * N_OUT * INT32 + N_IN * INT32 + N_IN // 128 * N_OUT // 8 * INT32 + N_IN // 128 * N_OUT * FP16),
        # compressed_tensors_wNa16.py: weight_packed [out, in/8] int32, weight_scale [out, in/g] 16-bit (symmetric: no zero point)
        (_ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}),
         N_OUT * N_IN // 8 * INT32 + N_OUT * N_IN // 128 * FP16),
        # compressed_tensors_w8a8_int8.py: weight [out, in] int8, weight_scale [out, 1] fp32 (channel)
        (_ct({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}), N_OUT * N_IN + N_OUT * FP32),
        # modelopt.py NVFP4: weight [out, in/2] uint8, weight_scale [out, in/16] fp8 (+ per-tensor fp32 scalars)
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, N_OUT * N_IN // 2 + N_OUT * N_IN // 16),
        # fp8.py block: weight [out, in] fp8, weight_scale_inv [out/128, in/128] fp32
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, N_OUT * N_IN + (N_OUT // 128) * (N_IN // 128) * FP32),
        # fbgemm_fp8.py: weight [out, in] fp8, weight_scale [out, 1] fp32
        ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": []}, N_OUT * N_IN + N_OUT * FP32),
    ],
    ids=["awq-w4-g128", "gptq-w4-g128", "ct-w4a16-g128", "ct-w8a8-int8", "modelopt-nvfp4", "fp8-block", "fbgemm-fp8"],
)  # fmt: skip
def test_one_matrix_takes_the_bytes_vllms_create_weights_allocates(quant, expected):
    quantization = parse_quantization(quant, "q")
    storage = quantization.storage_for(("model.layers.3.mlp.gate_proj",))
    assert storage is not None and storage.matrix_bytes(N_IN, N_OUT) == expected


def test_awq_gptq_and_compressed_tensors_size_a_whole_llama_8b_by_module():
    base = json.loads((Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "Llama-3.1-8B-Instruct" / "config.json").read_text())
    bf16 = _whole_model_per_gpu(spec_from_config(base, "c"), 1)
    for quant in (AWQ_G128, GPTQ_G128, _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})):
        int4 = _whole_model_per_gpu(spec_from_config(dict(base, quantization_config=quant), "c"), 1)
        # the linear layers (6.98B parameters) shrink to a quarter plus scales; embeddings and head stay 16-bit (2.1 GiB)
        assert 0.35 < int4 / bf16 < 0.38


@pytest.mark.parametrize(
    ("ignore", "module", "skipped"),
    [
        (["re:.*mlp.gate$"], "model.layers.4.mlp.gate", True),
        (["re:.*mlp.gate$"], "model.layers.4.mlp.gate_proj", False),
        (["model.layers.0.self_attn.q_proj"], "model.layers.0.self_attn.q_proj", True),
        (["model.layers.0.self_attn.q_proj"], "model.layers.10.self_attn.q_proj", False),
    ],
)
def test_compressed_tensors_ignore_takes_exact_names_and_re_regexes(ignore, module, skipped):
    quant = parse_quantization(dict(_ct({"num_bits": 8, "type": "float", "strategy": "channel"}), ignore=ignore), "q")
    assert (quant.storage_for((module,)) is None) is skipped


@pytest.mark.parametrize(
    ("field", "pattern", "says"),
    [
        ("ignore", "re:[unclosed", "not a valid regular expression (unterminated character set at position 0)"),
        ("ignore", "re:(.*)*X$", "a repetition inside a repetition"),
        ("ignore", "re:(a|b+)+c", "a repetition inside a repetition"),
        ("targets", "re:(.*.*)*X$", "a repetition inside a repetition"),
        ("ignore", "re:" + ".*" * 6 + "X", "6 unbounded repetitions (at most 5)"),
    ],
)
def test_a_re_pattern_that_cannot_compile_or_would_backtrack_for_minutes_is_refused(field, pattern, says):
    # Python's re takes 0.3 s for "(.*)*X$" on a 20-character name and doubles with each character
    # more; vLLM matches the same patterns with re.match (compressed_tensors/utils.py).
    ct = _ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True})
    if field == "targets":
        ct["config_groups"]["group_0"]["targets"] = [pattern]
    else:
        ct["ignore"] = ["lm_head", pattern]
    with pytest.raises(ModelSpecError) as err:
        parse_quantization(ct, "q")
    name = "config_groups.group_0.targets" if field == "targets" else "ignore"
    if says.startswith("not a valid"):
        assert str(err.value) == f"q: quantization '{name}' holds '{pattern}', which is {says}"
    else:
        assert str(err.value) == f"q: quantization '{name}' holds '{pattern}' with {says}: matching it against module names can take minutes"
    assert err.value.hint == "fix the pattern in the checkpoint's quantization config (vLLM matches it with Python's re.match)"
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    "pattern",
    ["re:.*mlp.gate$", "re:.*self_attn.*", r"re:model\.layers\.\d+\.mlp\.experts\.\d+\..*", r"re:(?:.*\.)?lm_head$", "re:.*a.*b.*c.*d.*e"],
)
def test_the_re_patterns_real_ignore_lists_use_are_accepted(pattern):
    ct = _ct({"num_bits": 8, "type": "float", "strategy": "channel"})
    assert pattern in parse_quantization(dict(ct, ignore=[pattern]), "q").ignore


def test_awq_modules_to_not_convert_are_substrings_as_vllm_matches_them():
    quant = parse_quantization(dict(AWQ_G128, modules_to_not_convert=["visual", "self_attn"]), "q")
    assert quant.storage_for(("model.layers.3.self_attn.o_proj",)) is None
    assert quant.storage_for(("model.layers.3.mlp.down_proj",)) is not None


def test_an_unknown_quant_method_is_an_error_naming_it():
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(json.loads((DATA / "Qwen--Qwen3-32B-FP8" / "config.json").read_text()), quantization_config={"quant_method": "hqq"}), "m/config.json")
    assert str(err.value) == "m/config.json (quantization_config): unknown quant_method 'hqq' in quantization_config"
    assert err.value.exit_code == 2 and "--dtype" in (err.value.hint or "")


def test_dtype_flags_follow_what_vllm_can_do_with_the_checkpoint():
    with pytest.raises(PlanError, match="vLLM does not quantize a bf16 checkpoint to int4 on load") as err:
        plan_model(CATALOG["llama3-8b"], H100X8, PlanOptions(dtype="int4"))
    assert "AWQ" in (err.value.hint or "")
    fp8 = resolve_model(str(DATA / "Qwen--Qwen3-32B-FP8"))
    with pytest.raises(PlanError, match="is a quantized checkpoint"):
        plan_model(fp8, H100X8, PlanOptions(dtype="int4"))
    assert plan_model(fp8, H100X8, PlanOptions(dtype="fp8")).quantization is not None  # its own dtype: fine
    # on-the-fly fp8: vLLM's shorthand by version (0.32 refuses `fp8` for a 16-bit checkpoint)
    assert plan_model(CATALOG["llama3-8b"], H100X8, PlanOptions(dtype="fp8")).engine_kwargs()["quantization"] == "fp8_per_tensor"
    old = plan_model(CATALOG["llama3-8b"], H100X8, PlanOptions(dtype="fp8", vllm_version="0.11.0"))
    assert old.engine_kwargs()["quantization"] == "fp8"
    assert "quantization" not in plan_model(CATALOG["llama3-8b"], H100X8).engine_kwargs()


# ---- the rollout renders what the plan decided (serve/desired.py -> serve/config.py) ----


def _rendered_engine_kwargs(model: str, **request) -> dict:
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.serve.desired import RolloutRequest
    from orchestrator.workflows.desired import desired_for_model

    manifest = load_manifest_file(Path(__file__).resolve().parents[2] / "cluster-templates" / "2x8-h100-405b.yaml")
    desired = desired_for_model(manifest, RolloutRequest(model=model, **request))([], None)
    return desired.rendered.app["args"]["llm_configs"][0]["engine_kwargs"]


def test_an_fp8_checkpoint_renders_no_quantization_flag_and_the_checkpoints_dtype():
    # `quantization: fp8` beside a checkpoint's own fbgemm_fp8 (or compressed-tensors) config makes
    # vLLM refuse to start (vllm/config/model.py _verify_quantization: "does not match")
    kw = _rendered_engine_kwargs(str(DATA / "meta-llama--Llama-3.1-405B-Instruct-FP8"), max_model_len=8192)
    assert "quantization" not in kw and kw["dtype"] == "auto" and kw["tensor_parallel_size"] == 8


def test_dtype_fp8_on_a_16_bit_model_renders_vllms_on_the_fly_quantization():
    kw = _rendered_engine_kwargs("llama3-8b", model_path="/mnt/shared/models/llama3-8b", dtype="fp8", max_model_len=8192)
    assert (kw["quantization"], kw["dtype"]) == ("fp8_per_tensor", "auto")
    kw = _rendered_engine_kwargs("llama3-8b", model_path="/m/llama3-8b", dtype="fp8", max_model_len=8192, vllm_version="0.11.0")
    assert kw["quantization"] == "fp8"
    kw = _rendered_engine_kwargs("llama3-8b", model_path="/m/llama3-8b", max_model_len=8192)
    assert "quantization" not in kw and kw["dtype"] == "bfloat16"


def test_an_engine_arg_quantization_is_refused_because_the_plan_sizes_it():
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match="--engine-arg quantization sizes the engine's memory") as err:
        _rendered_engine_kwargs("llama3-8b", model_path="/m/llama3-8b", engine_args=(("quantization", "fp8"),))
    assert err.value.hint == "use --dtype instead: the planner sizes with it and the rollout passes it to vLLM"


def test_gpt_oss_experts_per_gpu_follow_the_expert_sharding_and_its_padding():
    # gpt-oss-120b's mxfp4 experts (128 of 2,880 x 2,880: 4-bit weights, a uint8 scale per 32 = 17/32 bytes per
    # weight), padded per GPU slice as vLLM's mxfp4 MoE kernels pad them (fused_moe/oracle/mxfp4.py
    # mxfp4_round_up_hidden_size_and_intermediate_size: hidden to 3,072, intermediate_size_per_partition to a
    # multiple of 128). Attention, router and norms at bf16 (modules_to_not_convert).
    spec = resolve_model(str(DATA / "openai--gpt-oss-120b"))
    h, q, kv = 2880, 64 * 64, 8 * 64
    router = h * 128 * 2

    def expert_bytes(inter_per_gpu: int, experts_per_gpu: int) -> float:
        return experts_per_gpu * 3 * 3072 * inter_per_gpu * 17 / 32

    # TP=8: each expert split, 2,880 / 8 = 360 padded to 384, all 128 experts on every GPU; one KV head per GPU
    tp8 = 2 * h * q / 8 * 2 + 2 * h * kv / 8 * 2 + router + expert_bytes(384, 128)
    assert quantized_layer_bytes_per_gpu(spec, 7, Sharding(tp=8)) == tp8
    # DP=8 with expert parallel (TP=1 per rank): whole attention, 16 whole experts of 2,880 padded to 2,944
    dp8 = 2 * h * q * 2 + 2 * h * kv * 2 + router + expert_bytes(2944, 16)
    assert quantized_layer_bytes_per_gpu(spec, 7, Sharding(tp=1, dp=8, expert_parallel=True)) == dp8
    # DP=8 without expert parallel: the experts split over all 8 GPUs as under TP=8, attention whole
    assert quantized_layer_bytes_per_gpu(spec, 7, Sharding(tp=1, dp=8)) == dp8 - expert_bytes(2944, 16) + expert_bytes(384, 128)
