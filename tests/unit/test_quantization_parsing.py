"""quantization_config parsing at its edges (orchestrator.plan.quantization): every regex construct
Python's ``re`` can nest a repetition in, the defaults each method's vLLM loader takes, and the
matching rules of each method.

Expected values: Python's own ``re`` parser and matcher (vLLM matches compressed-tensors' ``re:`` names
with ``re.match``, compressed_tensors/utils.py) and vLLM 0.32.0's quantization loaders
(vllm/model_executor/layers/quantization/), read for each default below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.quantization import Storage, matches_pattern, parse_quantization


def _ct(ignore: list[str]) -> dict:
    weights = {"num_bits": 8, "type": "float", "strategy": "channel"}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ignore}


# Each holds a repetition inside a repetition, reached through a different node of re's parse tree;
# Python's backtracking matcher takes exponential time on each for a non-matching name.
NESTED = {
    "lazy-inner": "(?:.*?)*X",  # MIN_REPEAT inside MAX_REPEAT
    "possessive-inner": "(?:a*+)*X",  # POSSESSIVE_REPEAT (Python 3.11)
    "lookahead": "(?=(.*)*X)",  # ASSERT
    "negative-lookahead": "(?!(.*)*X)",  # ASSERT_NOT
    "atomic-group": "(?>(.*)*)X",  # ATOMIC_GROUP
    "branch": "a|(?:.*)*X",  # BRANCH
    "conditional-yes": "(a)?(?(1)(?:.*)*X|b)",  # GROUPREF_EXISTS, the yes arm
    "conditional-no": "(a)?(?(1)b|(?:.*)*X)",  # GROUPREF_EXISTS, the no arm
}


@pytest.mark.parametrize("pattern", list(NESTED.values()), ids=list(NESTED))
def test_a_repetition_nested_through_any_construct_is_refused(pattern):
    with pytest.raises(ModelSpecError, match="a repetition inside a repetition"):
        parse_quantization(_ct(["re:" + pattern]), "q")


@pytest.mark.parametrize(
    "pattern",
    [".*?" * 6, "(?=.*)" * 6 + "x", "a|" + ".*" * 6, "(?:.*)" * 6],
    ids=["lazy", "in-lookaheads", "in-a-branch", "in-groups"],
)
def test_six_unbounded_repetitions_side_by_side_are_counted_in_any_construct(pattern):
    with pytest.raises(ModelSpecError, match="6 unbounded repetitions"):
        parse_quantization(_ct(["re:" + pattern]), "q")


@pytest.mark.parametrize("pattern", [r"model\.layers\.\d{1,2}\.mlp.*", "(?:a{1,3})*", ".*" * 5])
def test_bounded_repetitions_and_five_side_by_side_are_accepted(pattern):
    # a{1,3} backtracks at most 3 ways: a bounded repetition inside an unbounded one stays linear
    assert "re:" + pattern in parse_quantization(_ct(["re:" + pattern]), "q").ignore


CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
PLANNER_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"


def _quant(path: Path) -> dict:
    cfg = json.loads(path.read_text())
    return cfg if path.name == "hf_quant_config.json" else cfg["quantization_config"]


# What each real checkpoint's own file says (tests/data/checkpoints/SOURCES.md, tests/data/planner/SOURCES.md):
# the method, the scheme's figures (block, group), the summary dtype, how its exclusions are matched,
# whether vLLM's KV cache turns fp8 (kv_cache_quant_algo) and how many modules it excludes.
REAL = [
    (CHECKPOINTS / "Qwen--Qwen3-32B-FP8" / "config.json", "fp8 (fp8 weights, fp32 scale per 128x128 block)", "fp8", "exact", None, 0),
    (CHECKPOINTS / "neuralmagic--Meta-Llama-3-8B-Instruct-FP8" / "config.json", "fp8 (fp8 weights, per-tensor scales)", "fp8", "exact", None, 0),
    (CHECKPOINTS / "meta-llama--Llama-3.1-405B-Instruct-FP8" / "config.json", "fbgemm_fp8 (fp8 weights, fp32 scale per output channel)", "fp8", "exact", None, 511),
    (CHECKPOINTS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json", "modelopt (FP8 weights, per-tensor scales)", "fp8", "modelopt", "fp8", 1),
    (CHECKPOINTS / "nvidia--Gemma-4-31B-IT-NVFP4" / "hf_quant_config.json", "modelopt (NVFP4 weights, fp8 scale per 16)", "int4", "modelopt", "fp8", 63),
    (CHECKPOINTS / "nvidia--DeepSeek-V4-Flash-NVFP4" / "hf_quant_config.json",
     "modelopt (MIXED_PRECISION per layer: 43 NVFP4 entries; the rest 16-bit)", "int4", "modelopt", None, 4),
    (CHECKPOINTS / "openai--gpt-oss-20b" / "config.json",
     "mxfp4 (MoE experts at 4 bits, uint8 scale per 32; linear layers 16-bit)", "int4", "glob", None, 4),
    (PLANNER_CONFIGS / "Llama-3.3-70B-Instruct-FP8-dynamic" / "config.json",
     "compressed-tensors (W8A8: fp8 weights (channel scales))", "fp8", "regex", None, 1),
]  # fmt: skip


@pytest.mark.parametrize(("path", "described", "dtype", "match", "kv", "ignored"), REAL, ids=[p[0].parent.name for p in REAL])
def test_each_real_checkpoint_reads_as_its_file_says(path, described, dtype, match, kv, ignored):
    quant = parse_quantization(_quant(path), path.name)
    assert quant.describe() == f"{described} from {path.name}"
    assert (quant.dtype, quant.match, quant.kv_cache_dtype, len(quant.ignore)) == (dtype, match, kv, ignored)


# TheBloke/Llama-2-7B-Chat-GPTQ's quantization_config (as Intel Neural Compressor's HF export copies it,
# "Refer to https://huggingface.co/TheBloke/Llama-2-7B-Chat-GPTQ/blob/main/config.json")
GPTQ_LLAMA2 = {"bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": True, "sym": True, "true_sequential": True,
               "model_name_or_path": None, "model_file_base_name": "model", "quant_method": "gptq"}  # fmt: skip
LINEAR = ("model.layers.0.mlp.down_proj",)


def test_gptq_reads_bits_group_and_act_order_and_keeps_the_head_16_bit_unless_told():
    quant = parse_quantization(GPTQ_LLAMA2, "q")
    assert quant.describe() == "gptq (int4 weights, group 128, act-order) from q"
    assert (quant.dtype, quant.match, quant.lm_head) == ("int4", "substring", False)
    storage = quant.storage_for(LINEAR)
    assert storage is not None and (storage.group, storage.per_channel, storage.zero_point_bits, storage.g_idx) == (128, False, 4, True)
    assert quant.storage_for(("lm_head",), lm_head=True) is None  # auto_gptq.py: lm_head_quantized defaults to False
    assert parse_quantization({**GPTQ_LLAMA2, "lm_head": True}, "q").storage_for(("lm_head",), lm_head=True) == storage
    assert parse_quantization({**GPTQ_LLAMA2, "bits": 8}, "q").dtype == "int8"
    assert parse_quantization({**GPTQ_LLAMA2, "bits": 3}, "q").dtype == "int4"  # 2/3/4-bit all size below int8
    no_order = parse_quantization({k: v for k, v in GPTQ_LLAMA2.items() if k != "desc_act"}, "q")
    assert no_order.scheme == "int4 weights, group 128"
    # group_size -1: one group over each whole input row, i.e. a scale per output channel
    channel = parse_quantization({**GPTQ_LLAMA2, "group_size": -1}, "q")
    assert channel.scheme == "int4 weights, group per channel, act-order"
    cs = channel.storage_for(LINEAR)
    assert cs is not None and (cs.group, cs.per_channel) == (0, True)
    with pytest.raises(ModelSpecError, match="quantization 'bits' must be one of 2, 3, 4, 8, got 5"):
        parse_quantization({**GPTQ_LLAMA2, "bits": 5}, "q")
    assert storage.kind == "int4" and parse_quantization({**GPTQ_LLAMA2, "bits": 8}, "q").rules[0][1].kind == "int8"


AWQ_4BIT = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}


@pytest.mark.parametrize(
    ("config", "key", "keys", "wanted"),
    [
        # auto_gptq.py from_config: cls.get_from_keys(config, ["bits"]) / ["group_size"], no default
        (GPTQ_LLAMA2, "bits", "bits", "one of 2, 3, 4, 8"),
        (GPTQ_LLAMA2, "group_size", "group_size", "an integer"),
        # auto_awq.py from_config: get_from_keys(config, ["w_bit", "bits"]) / ["q_group_size", "group_size"], no default
        (AWQ_4BIT, "bits", "bits or w_bit", "one of 4, 8"),
        (AWQ_4BIT, "group_size", "group_size or q_group_size", "an integer"),
    ],
)
def test_a_gptq_or_awq_config_without_bits_or_group_size_names_the_file_and_the_keys(config, key, keys, wanted):
    method = config["quant_method"]
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({k: v for k, v in config.items() if k != key}, "m/config.json")
    assert str(err.value) == f"m/config.json: the {method} quantization_config has no '{key}', which vLLM needs to load it"
    assert err.value.hint == f"check the checkpoint's quantization config ({keys})"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({**config, key: "x"}, "m/config.json")
    assert str(err.value) == f"m/config.json: quantization '{key}' must be {wanted}, got 'x'"
    assert err.value.hint == "check the checkpoint's quantization config"


def test_awq_takes_autoawqs_own_key_names_as_vllm_does():
    # auto_awq.py from_config: get_from_keys(config, ["w_bit", "bits"]), ["q_group_size", "group_size"], ["zero_point"]
    hf = parse_quantization({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}, "q")
    autoawq = parse_quantization({"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}, "q")
    assert hf == autoawq and hf.describe() == "awq (int4 weights, group 128, fp16 scales, zero points) from q"
    assert (hf.dtype, hf.match, hf.lm_head) == ("int4", "substring", False)
    no_zero = parse_quantization({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "q")
    assert no_zero.scheme == "int4 weights, group 128, fp16 scales"
    missing = parse_quantization({"quant_method": "awq", "bits": 4, "group_size": 128}, "q")
    assert missing.scheme.endswith(", zero points")  # AutoAWQ's zero_point default True
    with pytest.raises(ModelSpecError, match="the awq quantization_config has no 'bits', which vLLM needs to load it"):
        parse_quantization({"quant_method": "awq", "group_size": 128}, "q")


def _ct_group(weights: dict, **group) -> dict:
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": weights, **group}}}


def test_compressed_tensors_defaults_are_the_schemes():
    # compressed-tensors QuantizationArgs defaults: type "int", strategy "tensor", symmetric True; a group
    # without "targets" applies to Linear layers; no input_activations: weight-only (A16)
    w4a16 = parse_quantization(_ct_group({"num_bits": 4, "strategy": "group", "group_size": 128}), "q")
    assert w4a16.scheme == "W4A16: int4 weights, 16-bit scale group 128" and w4a16.dtype == "int4"
    assert w4a16.storage_for(LINEAR) is not None
    asym = parse_quantization(_ct_group({"num_bits": 4, "strategy": "group", "group_size": 128, "symmetric": False}), "q")
    storage = asym.storage_for(LINEAR)
    assert storage is not None and storage.zero_point_bits == 4 and asym.scheme.endswith(", zero points")
    int8 = parse_quantization(_ct_group({"num_bits": 8}, input_activations={"num_bits": 8, "type": "int"}), "q")
    assert int8.scheme == "W8A8: int8 weights (tensor scales)" and int8.dtype == "int8"
    # nvfp4-pack-quantized (llm-compressor's NVFP4 preset): float 4-bit, group_size 16
    nvfp4 = parse_quantization(_ct_group({"num_bits": 4, "type": "float", "strategy": "tensor_group"}), "q")
    ns = nvfp4.storage_for(LINEAR)
    assert ns is not None and (ns.weight_bits, ns.group, ns.scale_bytes) == (4, 16, 1) and nvfp4.dtype == "int4"
    # a group that quantizes only activations (no "weights") is not a weight scheme
    mixed = {"quant_method": "compressed-tensors", "config_groups": {
        "kv": {"input_activations": {"num_bits": 8}}, "w": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "targets": ["Linear"]},
        "w4": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128}, "targets": ["re:.*mlp.*"]}}}  # fmt: skip
    both = parse_quantization(mixed, "q")
    assert len(both.rules) == 2 and both.dtype == "int4"  # the summary is the narrowest weights


def test_gpt_oss_globs_cover_the_modules_under_them_and_nothing_beside():
    # mxfp4.py: modules_to_not_convert matched as glob patterns ("model.layers.*.self_attn" covers the
    # attention's own projections), exact names, and nothing that merely shares a prefix
    quant = parse_quantization(_quant(CHECKPOINTS / "openai--gpt-oss-20b" / "config.json"), "q")
    assert quant.skipped(("model.layers.11.self_attn.qkv_proj",)) and quant.skipped(("model.layers.0.mlp.router",))
    assert quant.skipped(("model.embed_tokens",)) and quant.skipped(("lm_head",))
    assert not quant.skipped(("model.layers.0.mlp.experts",)) and not quant.skipped(("model.layers.0.self_attn_extra",))
    assert quant.storage_for(("model.layers.0.mlp.experts",), expert=True) is not None
    assert quant.storage_for(("model.layers.0.mlp.experts",), expert=False) is None  # experts only


def test_modelopt_exclusions_are_exact_names_substrings_or_wildcards():
    # modelopt.py is_layer_excluded: exact name, substring, or fnmatch wildcard
    quant = parse_quantization(_quant(CHECKPOINTS / "nvidia--Gemma-4-31B-IT-NVFP4" / "hf_quant_config.json"), "q")
    assert quant.skipped(("model.language_model.layers.0.self_attn.q_proj",))  # wildcard
    assert quant.skipped(("lm_head",)) and quant.skipped(("model.lm_head",))  # exact, substring
    assert not quant.skipped(("model.language_model.layers.0.mlp.down_proj",))
    legacy = parse_quantization(_quant(CHECKPOINTS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json"), "q")
    assert legacy.skipped(("lm_head",)) and not legacy.skipped(("model.layers.0.mlp.down_proj",))


def test_exact_and_regex_ignores_match_whole_names_only():
    # fp8.py / fbgemm_fp8.py: modules_to_not_convert are exact names; compressed-tensors: exact or "re:" (re.match)
    fp8 = parse_quantization({"quant_method": "fp8", "ignored_layers": ["model.layers.0.mlp.down_proj"]}, "q")
    assert fp8.skipped(("model.layers.0.mlp.down_proj",)) and not fp8.skipped(("model.layers.0.mlp.down_proj_x",))
    assert fp8.storage_for(("model.layers.1.mlp.down_proj",)) is not None
    ct = parse_quantization(dict(_ct(["model.layers.0.mlp.down_proj", "re:.*self_attn\\..*"])), "q")
    assert ct.skipped(("model.layers.0.mlp.down_proj",)) and not ct.skipped(("model.layers.10.mlp.down_proj",))
    assert ct.skipped(("model.layers.3.self_attn.o_proj",)) and not ct.skipped(("model.layers.3.mlp.self_attn_like",))


def test_a_block_scale_covers_a_partial_block_too():
    # fp8.py create_weights: weight_scale_inv is (cdiv(out, block_n), cdiv(in, block_k)) fp32
    # Qwen3-235B-A22B-FP8 at TP=8: moe_intermediate_size 1536 / 8 = 192 inputs, 1.5 blocks of 128
    storage = parse_quantization({"quant_method": "fp8", "weight_block_size": [128, 128]}, "q").storage_for(LINEAR)
    assert storage is not None
    assert storage.matrix_bytes(192, 4096) == 192 * 4096 + (4096 // 128) * 2 * 4
    assert storage.matrix_bytes(4096, 192) == 192 * 4096 + 2 * (4096 // 128) * 4
    assert storage.bytes_per_param(192, 4096) == storage.matrix_bytes(192, 4096) / (192 * 4096)
    with pytest.raises(ModelSpecError, match=r"weight_block_size must be two positive integers, got \[128\]"):
        parse_quantization({"quant_method": "fp8", "weight_block_size": [128]}, "q")


def test_awq_loads_4_bits_and_8_through_marlin_and_nothing_else():
    # auto_awq.py: TYPE_MAP {4: uint4}; "For 8-bit AWQ, use Marlin backend" (awq:marlin); other widths are refused
    assert parse_quantization({**AWQ_4BIT, "bits": 8}, "q").dtype == "int8"
    for bits in (2, 3):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization({**AWQ_4BIT, "bits": bits}, "m/config.json")
        assert str(err.value) == f"m/config.json: quantization 'bits' must be one of 4, 8, got {bits}"


@pytest.mark.parametrize("quant", [AWQ_4BIT, GPTQ_LLAMA2, {"quant_method": "fp8"}, {"quant_method": "fbgemm_fp8"}, {"quant_method": "mxfp4"}],
                         ids=["awq", "gptq", "fp8", "fbgemm_fp8", "mxfp4"])  # fmt: skip
def test_modules_to_not_convert_must_be_a_list_of_names(quant):
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({**quant, "modules_to_not_convert": "lm_head"}, "m/config.json")
    assert str(err.value) == "m/config.json: quantization 'modules_to_not_convert' must be a list of module names"
    assert err.value.hint == "check the checkpoint's quantization config"


# ---- ModelOpt MIXED_PRECISION and compressed-tensors, field by field (vLLM 0.32.0 modelopt.py LINEAR_ALGOS,
# ModelOptMixedPrecisionConfig; compressed-tensors QuantizationArgs defaults) ----


def _mp(layers: object, **extra) -> dict:
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers, **extra}


@pytest.mark.parametrize(
    ("entry", "storage"),
    [
        ({"quant_algo": "FP8"}, Storage(8, kind="fp8")),  # per-tensor scales
        ({"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, Storage(8, per_channel=True, kind="fp8")),
        ({"quant_algo": "FP8_PB_WO"}, Storage(8, block=(128, 128), kind="fp8")),  # block 128 when unset
        ({"quant_algo": "FP8_BLOCK_SCALES", "group_size": 64}, Storage(8, block=(64, 64), kind="fp8")),
        ({"quant_algo": "NVFP4"}, Storage(4, scale_bytes=1, group=16, kind="nvfp4")),  # fp8 scale per 16 when unset
        ({"quant_algo": "w4a16_nvfp4", "group_size": 32}, Storage(4, scale_bytes=1, group=32, kind="nvfp4")),
        ({"quant_algo": "MXFP8"}, Storage(8, scale_bytes=1, group=32, kind="fp8")),  # an e8m0 byte per 32
    ],
    ids=["fp8", "fp8-channel", "fp8-block-default", "fp8-block-64", "nvfp4-default", "w4a16-nvfp4", "mxfp8"],
)
def test_each_mixed_precision_algo_stores_what_vllm_allocates(entry, storage):
    quant = parse_quantization(_mp({"model.layers.0.self_attn.o_proj": entry}), "q")
    assert quant.per_layer == (("model.layers.0.self_attn.o_proj", storage),)
    assert quant.storage_for(("model.layers.0.self_attn.o_proj",)) == storage
    assert quant.dtype == ("int4" if storage.weight_bits == 4 else "fp8")


def test_a_mixed_precision_checkpoint_reads_its_summary_head_and_kv_cache():
    layers = {**{f"model.layers.0.self_attn.{p}": {"quant_algo": "FP8"} for p in ("q_proj", "k_proj", "v_proj", "o_proj")},
              "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16}}  # fmt: skip
    quant = parse_quantization(_mp(layers, kv_cache_quant_algo="FP8"), "q")
    assert quant.scheme == "MIXED_PRECISION per layer: 4 FP8, 1 NVFP4 entries; the rest 16-bit"
    assert (quant.method, quant.dtype, quant.match, quant.kv_cache_dtype, quant.lm_head) == ("modelopt", "int4", "modelopt", "fp8", False)
    assert parse_quantization(_mp(layers), "q").kv_cache_dtype is None
    # the output head is quantized when the table names it, under any of the names vLLM gives it
    for head in ("lm_head", "language_model.lm_head", "model.language_model.lm_head"):
        assert parse_quantization(_mp({**layers, head: {"quant_algo": "FP8"}}), "q").lm_head is True


def test_routed_experts_take_their_own_entry_before_any_other_key_of_their_mlp():
    # _resolve_quant_algo step 3: "...mlp.experts" itself, else the first key under it, else the first under "...mlp."
    gate_first = {"model.layers.0.mlp.gate": {"quant_algo": "FP8"}, "model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}}
    quant = parse_quantization(_mp(gate_first), "q")
    assert quant.per_layer_entry(("model.layers.0.mlp.experts.0.gate_proj",), expert=True) == "model.layers.0.mlp.experts"
    per_expert = {"model.layers.0.mlp.gate": {"quant_algo": "FP8"}, "model.layers.0.mlp.experts.3.up_proj": {"quant_algo": "NVFP4"}}
    quant = parse_quantization(_mp(per_expert), "q")
    assert quant.per_layer_entry(("model.layers.0.mlp.experts.0.gate_proj",), expert=True) == "model.layers.0.mlp.experts.3.up_proj"
    only_mlp = parse_quantization(_mp({"model.layers.0.mlp.gate": {"quant_algo": "FP8"}}), "q")
    assert only_mlp.per_layer_entry(("model.layers.0.mlp.experts.0.gate_proj",), expert=True) == "model.layers.0.mlp.gate"
    assert only_mlp.per_layer_entry(("model.layers.1.mlp.experts.0.gate_proj",), expert=True) is None
    # a later candidate name is tried when the first has no entry; a name with its own entry wins over its shards
    assert quant.per_layer_entry(("model.layers.1.mlp.experts.0.gate_proj", "model.layers.0.mlp.experts.0.gate_proj"), expert=True) == (
        "model.layers.0.mlp.experts.3.up_proj")
    fused = parse_quantization(_mp({"model.layers.0.self_attn.k_proj": {"quant_algo": "FP8"},
                                    "model.layers.0.self_attn.q_proj": {"quant_algo": "NVFP4"}}), "q")  # fmt: skip
    assert fused.per_layer_entry(("model.layers.0.self_attn.q_proj",)) == "model.layers.0.self_attn.q_proj"
    assert fused.per_layer_entry(("model.layers.0.self_attn.v_proj",)) == "model.layers.0.self_attn.q_proj"  # the first shard listed
    assert fused.per_layer_entry(("model.layers.0.self_attn.o_proj",)) is None
    assert fused.per_layer_entry(("model.layers.0.mlp.up_proj",)) is None


def test_a_mixed_precision_table_vllm_refuses_is_refused_word_for_word():
    for layers in (None, {}):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization(_mp(layers), "m/hf_quant_config.json")
        assert str(err.value) == ("m/hf_quant_config.json: ModelOpt MIXED_PRECISION without a quantized_layers mapping; vLLM refuses it "
                                  "(\"MIXED_PRECISION quant_algo requires a non-empty 'quantized_layers' mapping\")")  # fmt: skip
        assert err.value.hint == "check the checkpoint's hf_quant_config.json / quantization_config"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization(_mp({"model.layers.0.mlp.down_proj": "FP8"}), "m/hf_quant_config.json")
    assert str(err.value) == "m/hf_quant_config.json: quantized_layers entry 'model.layers.0.mlp.down_proj' must be an object with a quant_algo"
    assert err.value.hint == "check the checkpoint's quantized_layers"
    for entry, shown in (({}, "'missing'"), ({"quant_algo": "int8"}, "'INT8'")):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization(_mp({"model.layers.0.mlp.down_proj": entry}), "m/hf_quant_config.json")
        assert str(err.value) == (f"m/hf_quant_config.json: quantized_layers entry 'model.layers.0.mlp.down_proj' has quant_algo {shown}, "
                                  "which vLLM's ModelOpt MIXED_PRECISION does not load (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, "
                                  "W4A16_NVFP4, MXFP8)")  # fmt: skip
    with pytest.raises(ModelSpecError) as err:
        parse_quantization(_mp({"model.layers.0.mlp.down_proj": {"quant_algo": "FP8_PB_WO", "group_size": "x"}}), "m/c.json")
    assert str(err.value) == "m/c.json: quantization 'model.layers.0.mlp.down_proj.group_size' must be an integer, got 'x'"


def test_compressed_tensors_weights_default_to_int_symmetric_and_name_each_field():
    # QuantizationArgs: type "int", symmetric True when unset; a float 4-bit group is NVFP4 (16 per scale unless set)
    default = parse_quantization(_ct_group({"num_bits": 4, "strategy": "group", "group_size": 128}), "q").rules[0][1]
    assert default == Storage(4, scale_bytes=2, group=128, per_channel=False, zero_point_bits=0, kind="int4")
    nvfp4 = parse_quantization(_ct_group({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 32}), "q")
    assert nvfp4.rules[0][1] == Storage(4, scale_bytes=1, group=32, kind="nvfp4") and nvfp4.scheme == "W4A16: NVFP4 weights, fp8 scale per 32"
    channel = parse_quantization(_ct_group({"num_bits": 8, "type": "float", "strategy": "channel"}), "q").rules[0][1]
    assert channel == Storage(8, per_channel=True, kind="fp8")
    tensor = parse_quantization(_ct_group({"num_bits": 8, "type": "float"}), "q").rules[0][1]
    assert tensor == Storage(8, kind="fp8")
    # int8 in groups is a wNa16 scheme (16-bit scale per group), not W8A8's per-channel one
    int8_group = parse_quantization(_ct_group({"num_bits": 8, "strategy": "group", "group_size": 128}), "q").rules[0][1]
    assert int8_group == Storage(8, scale_bytes=2, group=128, kind="int8")
    for weights in ({"num_bits": 4, "type": "float", "group_size": "x"}, {"num_bits": 4, "strategy": "group", "group_size": "x"}):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization(_ct_group(weights), "m/config.json")
        assert str(err.value) == "m/config.json (config_groups.group_0): quantization 'group_size' must be an integer, got 'x'"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({**_ct_group({"num_bits": 4, "strategy": "group", "group_size": 128}), "ignore": "lm_head"}, "m/config.json")
    assert str(err.value) == "m/config.json: quantization 'ignore' must be a list of module names"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({**_ct_group({"num_bits": 4, "strategy": "group", "group_size": 128}), "ignore": ["re:(.*)*x"]}, "m/config.json")
    assert str(err.value).startswith("m/config.json: quantization 'ignore' holds 're:(.*)*x' with a repetition inside a repetition")


def test_a_group_size_of_one_is_a_group_and_0_or_minus_1_is_per_channel():
    # GPTQ / AWQ / compressed-tensors: group_size -1 (or 0) is one group over the whole input row
    for size, group in ((1, 1), (0, 0), (-1, 0)):
        storage = parse_quantization({**GPTQ_LLAMA2, "group_size": size}, "q").rules[0][1]
        assert (storage.group, storage.per_channel) == (group, group == 0)


@pytest.mark.parametrize("groups", [None, {}, ["group_0"]], ids=["absent", "empty", "a-list"])
def test_compressed_tensors_without_a_mapping_of_config_groups_is_refused(groups):
    quant = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    if groups is not None:
        quant["config_groups"] = groups
    with pytest.raises(ModelSpecError) as err:
        parse_quantization(quant, "m/config.json")
    assert str(err.value) == "m/config.json: compressed-tensors quantization_config has no config_groups"
    assert err.value.hint == "check the checkpoint's config.json"


def test_fp8_reads_its_blocks_its_exclusions_under_either_name_and_refuses_other_blocks():
    # fp8.py: weight_block_size [block_n, block_k], one fp32 weight_scale_inv per block; ignored_layers or modules_to_not_convert
    plain = parse_quantization({"quant_method": "fp8", "modules_to_not_convert": ["lm_head"]}, "q")
    assert plain.ignore == ("lm_head",) and plain.rules == ((("Linear",), Storage(8, kind="fp8")),)
    assert plain.scheme == "fp8 weights, per-tensor scales"
    block = parse_quantization({"quant_method": "fp8", "weight_block_size": [128, 64]}, "q")
    assert block.rules[0][1] == Storage(8, block=(128, 64), kind="fp8") and block.scheme == "fp8 weights, fp32 scale per 128x64 block"
    assert parse_quantization({"quant_method": "fp8", "weight_block_size": [1, 1]}, "q").rules[0][1].block == (1, 1)
    for bad in ([0, 128], [True, 128], [128.0, 128], [128], "128"):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization({"quant_method": "fp8", "weight_block_size": bad}, "m/config.json")
        assert str(err.value) == f"m/config.json: weight_block_size must be two positive integers, got {bad!r}"
        assert err.value.hint == "vLLM expects e.g. [128, 128]"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({"quant_method": "fp8", "ignored_layers": [1, 2]}, "m/config.json")
    assert str(err.value) == "m/config.json: quantization 'modules_to_not_convert' must be a list of module names"


def test_modelopt_reads_exclusions_kv_cache_and_nvfp4_groups_as_vllm_does():
    # modelopt.py: the config.json form lists "ignore" (or exclude_modules), hf_quant_config.json "exclude_modules";
    # an fp8 KV cache is kv_cache_quant_algo FP8 or a kv_cache_scheme of 8-bit floats; NVFP4 groups of 16 unless set
    fp8 = parse_quantization({"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}, "q")
    assert fp8.ignore == ("lm_head",) and fp8.rules == ((("Linear",), Storage(8, kind="fp8")),) and fp8.kv_cache_dtype is None
    legacy = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"], "ignore": ["x"]}}
    assert parse_quantization(legacy, "q").ignore == ("lm_head",)
    for kv, dtype in (({"num_bits": 8, "type": "float"}, "fp8"), ({"num_bits": 4, "type": "float"}, None), ({"num_bits": 8, "type": "int"}, None)):
        assert parse_quantization({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": kv}, "q").kv_cache_dtype == dtype
    mixed_kv = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "fp8",
                "quantized_layers": {"model.layers.0.mlp.down_proj": {"quant_algo": "FP8"}}}  # fmt: skip
    assert parse_quantization(mixed_kv, "q").kv_cache_dtype == "fp8"
    nvfp4 = parse_quantization({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "q")
    assert nvfp4.rules[0][1] == Storage(4, scale_bytes=1, group=16, kind="nvfp4") and nvfp4.dtype == "int4"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": "x"}, "m/c.json")
    assert str(err.value) == "m/c.json: quantization 'group_size' must be an integer, got 'x'"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": "lm_head"}, "m/c.json")
    assert str(err.value) == "m/c.json: quantization 'exclude_modules' must be a list of module names"
    for algo, shown in ((None, "'missing'"), ("int4_awq", "'INT4_AWQ'")):
        with pytest.raises(ModelSpecError) as err:
            parse_quantization({"quant_method": "modelopt", "quant_algo": algo}, "m/c.json")
        assert str(err.value) == f"m/c.json: ModelOpt quant_algo {shown}; orch sizes FP8, NVFP4 and MIXED_PRECISION ModelOpt checkpoints"
        assert err.value.hint and err.value.hint.startswith("orch sizes fp8, fbgemm_fp8, compressed-tensors")


def test_a_quantization_config_that_is_not_an_object_or_a_bool_for_a_number_is_refused():
    with pytest.raises(ModelSpecError) as err:
        parse_quantization(["fp8"], "m/config.json")  # type: ignore[arg-type]
    assert str(err.value) == "m/config.json: quantization_config must be a JSON object"
    assert err.value.hint == "check the checkpoint's config.json"
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({**GPTQ_LLAMA2, "group_size": True}, "m/config.json")
    assert str(err.value) == "m/config.json: quantization 'group_size' must be an integer, got True"


def test_matches_pattern_matches_a_target_as_a_name_suffix_and_other_modes_as_the_method_does():
    assert matches_pattern("model.layers.0.mlp.down_proj", "down_proj", "target")
    assert not matches_pattern("model.layers.0.mlp.down_proj_2", "down_proj", "target")
    assert matches_pattern("model.layers.0.mlp.down_proj", "Linear", "target")
    assert not matches_pattern("model.layers.0.mlp.down_proj", "down_proj", "exact")
    assert matches_pattern("lm_head", "lm_head", "exact") and not matches_pattern("lm_head", "lm", "exact")


def test_compressed_tensors_groups_default_to_linear_and_join_their_schemes():
    int8 = {"weights": {"num_bits": 8, "strategy": "channel"}, "input_activations": {"num_bits": 8}}
    fp8 = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "targets": ["re:.*mlp.*"]}
    both = parse_quantization({"quant_method": "compressed-tensors", "config_groups": {"a": int8, "b": fp8}}, "q")
    assert both.rules[0][0] == ("Linear",) and both.rules[1][0] == ("re:.*mlp.*",)
    assert both.scheme == "W8A8: int8 weights (channel scales); W8A16: fp8 weights (channel scales)"
    # two 8-bit schemes rank alike: the summary is the first group's
    assert both.dtype == "int8"
    assert parse_quantization({"quant_method": "compressed-tensors", "config_groups": {"b": fp8, "a": int8}}, "q").dtype == "fp8"
    empty_targets = parse_quantization({"quant_method": "compressed-tensors", "config_groups": {"a": {**int8, "targets": []}}}, "q")
    assert empty_targets.rules[0][0] == ("Linear",)
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({"quant_method": "compressed-tensors", "config_groups": {"kv": {"input_activations": {"num_bits": 8}}}}, "m/c.json")
    assert str(err.value) == "m/c.json: no compressed-tensors config group quantizes weights"
    assert err.value.hint == "check the checkpoint's config.json"


def test_autoawq_and_autogptq_method_names_are_read_as_awq_and_gptq():
    # vLLM's QuantizationMethods name them awq / gptq; AutoAWQ / AutoGPTQ exports may write auto_awq / auto_gptq
    assert parse_quantization({**AWQ_4BIT, "quant_method": "auto_awq"}, "q").method == "awq"
    assert parse_quantization({**GPTQ_LLAMA2, "quant_method": "auto_gptq"}, "q").method == "gptq"


def test_awq_per_channel_scales_its_head_and_its_storage():
    # auto_awq.py: group_size -1 is one group per input row (a scale per output channel); lm_head quantized when told
    channel = parse_quantization({**AWQ_4BIT, "group_size": -1, "lm_head": True}, "q")
    assert channel.rules[0][1] == Storage(4, scale_bytes=2, group=0, per_channel=True, zero_point_bits=4, kind="int4")
    assert channel.scheme == "int4 weights, group per channel, fp16 scales, zero points" and channel.lm_head is True
    assert parse_quantization(AWQ_4BIT, "q").rules[0][1] == Storage(4, scale_bytes=2, group=128, zero_point_bits=4, kind="int4")


def test_a_bitsandbytes_checkpoint_is_refused_with_vllms_reason():
    with pytest.raises(ModelSpecError) as err:
        parse_quantization({"quant_method": "bitsandbytes", "load_in_4bit": True}, "m/config.json")
    assert str(err.value) == ("m/config.json: a bitsandbytes checkpoint; vLLM 0.29 and 0.32 cannot load it (bitsandbytes is not among "
                              "their quantization methods, vllm/model_executor/layers/quantization/__init__.py)")  # fmt: skip
    assert err.value.hint == "use an AWQ, GPTQ or compressed-tensors checkpoint of the model, or the 16-bit one with --dtype fp8"


def test_storage_for_resolves_targets_regexes_experts_and_unlisted_modules():
    # compressed-tensors: a group's re: target matches module names with re.match; other modules stay 16-bit
    mlp_only = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "group", "group_size": 128},
                                                                          "targets": ["re:.*mlp.*"]}}}  # fmt: skip
    quant = parse_quantization(mlp_only, "q")
    assert quant.storage_for(("model.layers.0.mlp.down_proj",)) == quant.rules[0][1]
    assert quant.storage_for(("model.layers.0.self_attn.o_proj",)) is None
    named = parse_quantization({**mlp_only, "config_groups": {"g": {**mlp_only["config_groups"]["g"], "targets": ["down_proj"]}}}, "q")
    assert named.storage_for(("model.layers.0.mlp.down_proj",)) is not None and named.storage_for(("model.layers.0.mlp.up_proj",)) is None
    # ModelOpt MIXED_PRECISION: routed experts resolve through their own entry; an unlisted module stays 16-bit
    mixed = parse_quantization(_mp({"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}}), "q")
    assert mixed.storage_for(("model.layers.0.mlp.experts.0.gate_proj",), expert=True) == Storage(4, scale_bytes=1, group=16, kind="nvfp4")
    assert mixed.storage_for(("model.layers.0.self_attn.o_proj",)) is None


def test_a_block_scale_counts_output_and_input_blocks_and_a_group_of_one_has_a_scale_per_weight():
    # fp8.py: weight_scale_inv [ceil(n_out / block_n), ceil(n_in / block_k)] fp32; wNa16: one scale per group of inputs
    assert Storage(8, block=(128, 64), kind="fp8").matrix_bytes(4096, 1024) == 4096 * 1024 + (1024 // 128) * (4096 // 64) * 4
    assert Storage(4, scale_bytes=2, group=1).matrix_bytes(64, 32) == 64 * 32 / 2 + 64 * 32 * 2
