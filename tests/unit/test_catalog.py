"""Model specs: the catalog, config.json parsing (pure) and the one file read at the edge."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import (
    CATALOG,
    HINT,
    MAX_CONFIG_BYTES,
    ModelSpec,
    _llama,
    closest_name,
    parse_config_text,
    spec_from_config,
)
from orchestrator.plan.config_fields import FIELD_BOUNDS
from orchestrator.plan.memory import count_params
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.tinymodel import TINY_CONFIG
from tests.unit.test_memory import QWEN3_235B_FP8

# The published config.json files (the fields orch reads), as on the Hugging Face hub.
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}  # fmt: skip
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_experts_per_tok": 2,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 32000,
}  # fmt: skip
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "first_k_dense_replace": 3, "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip


def _numbers(spec: ModelSpec) -> dict:
    d = asdict(spec)
    d.pop("name")
    d.pop("source")
    if d["quantization"] is not None:
        d["quantization"].pop("source")  # where it was read, not what it is
    return d


@pytest.mark.parametrize(
    ("name", "config"), [("llama3-8b", LLAMA31_8B), ("mixtral-8x7b", MIXTRAL_8X7B), ("deepseek-v3", DEEPSEEK_V3)]
)
def test_catalog_entries_equal_their_published_configs(name, config):
    assert _numbers(spec_from_config(config, "config.json")) == _numbers(CATALOG[name])


def test_tiny_catalog_entry_is_the_tiny_model_recipe():
    tiny = CATALOG["tiny"]
    assert (tiny.layers, tiny.hidden, tiny.intermediate) == (
        TINY_CONFIG["num_hidden_layers"], TINY_CONFIG["hidden_size"], TINY_CONFIG["intermediate_size"]
    )
    assert (tiny.heads, tiny.kv_heads, tiny.head_dim, tiny.vocab) == (4, 2, 64, 512)
    assert tiny.dtype == "bf16" and tiny.tie_embeddings is False


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_catalog_name_resolves_case_insensitively(name):
    assert resolve_model(name) is CATALOG[name]
    assert resolve_model(name.upper()) is CATALOG[name]


def test_unknown_name_lists_the_catalog_and_the_closest_match():
    with pytest.raises(ModelSpecError) as err:
        resolve_model("llama3_8b")
    message = str(err.value)
    assert "did you mean 'llama3-8b'" in message
    for name in CATALOG:
        assert name in message
    assert err.value.exit_code == 2
    assert closest_name("qwen-72b") == "qwen2.5-72b"


def test_reads_the_tiny_model_folder_and_its_config_json(tiny_model_dir):
    from_dir = resolve_model(str(tiny_model_dir))
    from_file = resolve_model(str(tiny_model_dir / "config.json"))
    assert _numbers(from_dir) == _numbers(from_file) == _numbers(CATALOG["tiny"])
    assert from_dir.source.endswith("config.json")


def test_missing_field_names_the_field_and_the_file(tmp_path):
    config = dict(LLAMA31_8B)
    del config["num_hidden_layers"]
    path = tmp_path / "model" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    with pytest.raises(ModelSpecError) as err:
        resolve_model(str(path.parent))
    assert "num_hidden_layers" in str(err.value)
    assert str(path) in str(err.value)


def test_dense_config_without_intermediate_size_is_refused():
    config = dict(LLAMA31_8B)
    del config["intermediate_size"]
    with pytest.raises(ModelSpecError, match="intermediate_size"):
        spec_from_config(config, "x/config.json")


def test_defaults_mha_head_dim_and_untied():
    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 10}
    spec = spec_from_config(config, "c")
    assert (spec.kv_heads, spec.head_dim, spec.tie_embeddings, spec.dtype) == (4, 16, False, "bf16")


def test_text_config_of_a_multimodal_checkpoint_is_used():
    outer = {"architectures": ["Mistral3ForConditionalGeneration"], "vision_config": {"hidden_size": 1024}, "text_config": dict(LLAMA31_8B)}
    spec = spec_from_config(outer, "c")
    # the text model is the text_config's; the vision tower is counted apart (test_multimodal_towers)
    assert {**_numbers(spec), "tower_params": 0, "towers": ""} == _numbers(CATALOG["llama3-8b"])
    assert spec.tower_params > 0


def test_quantized_checkpoints_report_their_weight_dtype():
    assert spec_from_config(DEEPSEEK_V3, "c").dtype == "fp8"
    awq = dict(LLAMA31_8B, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True})
    assert spec_from_config(awq, "c").dtype == "int4"
    assert spec_from_config(dict(LLAMA31_8B, torch_dtype="float16"), "c").dtype == "fp16"


@pytest.mark.parametrize(
    ("content", "needle"),
    [("{not json", "not valid JSON"), ("[1, 2]", "JSON object"), (json.dumps(dict(LLAMA31_8B, hidden_size="4096")), "hidden_size")],
)
def test_bad_config_files_are_clear_errors(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ModelSpecError, match=needle):
        resolve_model(str(path))


def test_missing_path_is_an_error(tmp_path):
    with pytest.raises(ModelSpecError, match="no such file"):
        resolve_model(str(tmp_path / "nowhere"))


def test_with_dtype_rejects_unknown_dtype():
    assert CATALOG["llama3-8b"].with_dtype("int4").dtype == "int4"
    with pytest.raises(ModelSpecError):
        CATALOG["llama3-8b"].with_dtype("fp4")


# ---- behaviour the mutation run (issue 17) showed untested


def test_llama_catalog_builder_gives_the_published_llama_31_config():
    # the catalog is built once at import; its Llama builder is checked here against config.json
    spec = _llama("llama3-8b", 32, 4096, 14336, 32)
    assert spec.name == "llama3-8b"
    assert spec.head_dim == 128 and isinstance(spec.head_dim, int)  # an int, as config.json has it
    assert _numbers(spec) == _numbers(spec_from_config(LLAMA31_8B, "config.json"))


def test_unknown_dtype_names_the_dtypes_orch_knows():
    with pytest.raises(ModelSpecError, match="unknown dtype 'fp4'") as err:
        CATALOG["llama3-8b"].with_dtype("fp4")
    assert err.value.hint == "use one of fp32, bf16, fp16, fp8, int8, int4"


def test_closest_name_accepts_a_loose_match_and_none_when_nothing_is_close():
    assert closest_name("tiny-model") == "tiny"  # similarity 0.57: above the 0.5 cutoff
    assert closest_name("gpt2") is None


def test_a_config_of_exactly_the_size_limit_is_read_and_one_byte_more_is_refused():
    fits = b" " * (MAX_CONFIG_BYTES - 2) + b"{}"
    assert parse_config_text(fits, "c/config.json") == {}
    with pytest.raises(ModelSpecError, match=r"c/config.json: too large for a config.json \(limit 4,194,304 bytes\)") as err:
        parse_config_text(fits + b" ", "c/config.json")
    assert err.value.hint == HINT


CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"


def _config(model: str) -> dict:
    return json.loads((CONFIGS / model / "config.json").read_text())


def test_real_quantized_configs_give_their_weight_dtype():
    # RedHatAI's llm-compressor FP8 checkpoint (compressed-tensors, float weights of 8 bits)
    assert spec_from_config(_config("Llama-3.3-70B-Instruct-FP8-dynamic"), "c").dtype == "fp8"
    # Qwen's block-quantized FP8 (quant_method fp8)
    qwen = spec_from_config(_config("Qwen3-235B-A22B-Instruct-2507-FP8"), "c")
    assert qwen.dtype == "fp8"
    # MoE fields as Qwen3-MoE names them (num_experts, moe_intermediate_size), and its own head_dim
    assert (qwen.num_experts, qwen.experts_per_token, qwen.moe_intermediate, qwen.intermediate) == (128, 8, 1536, 12288)
    assert (qwen.heads, qwen.kv_heads, qwen.head_dim, qwen.max_position) == (64, 4, 128, 262144)
    assert (qwen.shared_experts, qwen.first_k_dense, qwen.architecture) == (0, 0, "qwen3_moe")


def _llm_compressor(bits: int, kind: str) -> dict:
    # the quantization_config fields orch reads, as llm-compressor writes them (RedHatAI's
    # *-quantized.w8a8 and *-quantized.w4a16 checkpoints: integer weights of 8 or 4 bits)
    weights = {"num_bits": bits, "type": kind, "strategy": "channel", "symmetric": True}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


@pytest.mark.parametrize(
    ("quant", "dtype"),
    [
        (_llm_compressor(8, "int"), "int8"),
        (_llm_compressor(4, "int"), "int4"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8"),  # GPTQ 8-bit
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 128}, "int4"),  # AutoAWQ's own naming
    ],
)
def test_quantization_configs_give_the_weight_dtype(quant, dtype):
    assert spec_from_config(dict(LLAMA31_8B, quantization_config=quant), "c").dtype == dtype


@pytest.mark.parametrize(
    ("fields", "dtype"),
    [({"torch_dtype": "torch.float16"}, "fp16"), ({"dtype": "float32"}, "fp32"), ({}, "bf16"), ({"torch_dtype": "Float32"}, "fp32")],
)
def test_torch_dtype_spellings(fields, dtype):
    config = {k: v for k, v in LLAMA31_8B.items() if k != "torch_dtype"}
    assert spec_from_config({**config, **fields}, "c").dtype == dtype


def test_unknown_torch_dtype_is_named():
    with pytest.raises(ModelSpecError, match="c/config.json: unknown torch_dtype 'float8_e4m3fn'") as err:
        spec_from_config(dict(LLAMA31_8B, torch_dtype="float8_e4m3fn"), "c/config.json")
    assert err.value.hint == "expected bfloat16, float16 or float32"


def test_missing_field_error_names_the_field_the_file_and_what_orch_reads():
    config = {k: v for k, v in LLAMA31_8B.items() if k != "vocab_size"}
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(config, "m/config.json")
    assert str(err.value) == "m/config.json: config is missing 'vocab_size', which orch needs to size the model"
    assert err.value.hint == (
        "orch reads Hugging Face decoder configs (Llama, Qwen, Mistral/Mixtral, DeepSeek); "
        "add 'vocab_size' to the config or use a catalog name"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [("4096", "'4096'"), (True, "True"), (-1, "-1"), (40.0, "40.0"), ("x" * 60, "'" + "x" * 39 + "..."),
     ("x" * 38, "'" + "x" * 38 + "'"), ("x" * 39, "'" + "x" * 39 + "...")],  # a value shown in up to 40 characters
    ids=["text", "bool", "negative", "float", "long-text", "40-characters", "41-characters"],
)  # fmt: skip
def test_a_field_that_is_not_a_non_negative_integer_is_refused(value, shown):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(LLAMA31_8B, num_hidden_layers=value), "m/config.json")
    assert str(err.value) == f"m/config.json: 'num_hidden_layers' must be a non-negative integer, got {shown}"
    assert err.value.hint == HINT


def test_a_field_outside_its_bounds_names_the_range():
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(LLAMA31_8B, num_hidden_layers=1025), "m/config.json")
    assert str(err.value) == "m/config.json: 'num_hidden_layers' is 1,025, outside the range orch accepts (1 to 1,024)"
    assert err.value.hint == "check the config.json: no published model is that size"
    assert spec_from_config(dict(LLAMA31_8B, num_hidden_layers=1024), "c").layers == 1024  # the bound itself is accepted


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 2, "num_attention_heads": 4, "num_key_value_heads": 4},
         "m/config.json: hidden_size 2 is smaller than num_attention_heads 4 and there is no head_dim"),
        ({"num_key_value_heads": 3}, "m/config.json: num_attention_heads 32 is not a multiple of num_key_value_heads 3"),
        ({"num_key_value_heads": 64}, "m/config.json: num_attention_heads 32 is not a multiple of num_key_value_heads 64"),
    ],
)  # fmt: skip
def test_impossible_head_layouts_are_refused(changes, message):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(LLAMA31_8B, **changes), "m/config.json")
    assert str(err.value) == message
    no_head = "a head needs at least one dimension: check hidden_size and num_attention_heads"
    assert err.value.hint == (no_head if "no head_dim" in message else HINT)


@pytest.mark.parametrize("per_token", [0, 9])
def test_experts_per_token_must_be_between_1_and_the_experts(per_token):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(MIXTRAL_8X7B, num_experts_per_tok=per_token), "m/config.json")
    assert str(err.value) == "m/config.json: num_experts_per_tok must be between 1 and the 8 experts"
    assert err.value.hint == HINT
    assert spec_from_config(dict(MIXTRAL_8X7B, num_experts_per_tok=8), "c").experts_per_token == 8


def test_sizes_that_add_up_past_100t_parameters_are_refused():
    huge = dict(LLAMA31_8B, num_hidden_layers=1024, hidden_size=131072, intermediate_size=1_048_576)
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(huge, "m/config.json")
    assert str(err.value).startswith("m/config.json: these sizes describe about ")
    # 1,024 layers x (4 x 131,072 x 32 heads x 4,096 + 3 x 131,072 x 1,048,576) + 2 x 128,256 x 131,072
    assert str(err.value).endswith("about 493T parameters, past the 100T orch accepts")
    assert err.value.hint == "check hidden_size, intermediate_size, the expert counts and num_hidden_layers"


def test_name_tie_and_context_length_fields():
    qwen06 = _config("Qwen3-0.6B")
    spec = spec_from_config(qwen06, "q/config.json")
    assert spec.tie_embeddings is True  # Qwen3-0.6B ties its embeddings
    assert spec.name == "q/config.json" and spec.source == "q/config.json"
    assert spec_from_config({**qwen06, "_name_or_path": "Qwen/Qwen3-0.6B"}, "q").name == "Qwen/Qwen3-0.6B"
    assert spec_from_config({**qwen06, "_name_or_path": "Qwen/Qwen3-0.6B"}, "q", name="mine").name == "mine"
    no_max = {k: v for k, v in LLAMA31_8B.items() if k != "max_position_embeddings"}
    # vLLM 0.32 (model_arch_config_convertor.py derive_max_model_len_and_key, config/model.py
    # _get_and_verify_max_len): 2048 without any length key, else the smallest, model_max_length winning
    assert spec_from_config(no_max, "c").max_position == 2048
    assert spec_from_config({**no_max, "max_sequence_length": 8192}, "c").max_position == 8192
    assert spec_from_config({**no_max, "max_sequence_length": 8192, "seq_length": 4096}, "c").max_position == 4096
    assert spec_from_config({**LLAMA31_8B, "model_max_length": 1_048_576}, "c").max_position == 1_048_576  # Kimi-Linear's only key
    assert spec_from_config({**LLAMA31_8B, "model_max_length": 10**30}, "c").max_position == 131072  # a tokenizer's sentinel
    assert spec_from_config({**LLAMA31_8B, "model_max_length": 1e30}, "c").max_position == 131072  # the same as a float
    assert spec_from_config({**no_max, "seq_length": 8192.0}, "c").max_position == 8192
    with pytest.raises(ModelSpecError, match="'seq_length' must be a non-negative integer"):
        spec_from_config({**LLAMA31_8B, "seq_length": "long"}, "c")


def test_moe_without_dense_layers_may_omit_intermediate_size():
    config = {k: v for k, v in MIXTRAL_8X7B.items() if k != "intermediate_size"}
    spec = spec_from_config({**config, "moe_intermediate_size": 14336}, "c")
    assert (spec.intermediate, spec.moe_intermediate, spec.num_experts) == (0, 14336, 8)
    dense = spec_from_config(dict(LLAMA31_8B, n_shared_experts=2, first_k_dense_replace=3, num_experts_per_tok=2), "c")
    assert (dense.shared_experts, dense.first_k_dense, dense.experts_per_token, dense.moe_intermediate) == (0, 0, 0, 0)


def test_model_type_or_first_architecture_names_the_architecture():
    assert spec_from_config(LLAMA31_8B, "c").architecture == "llama"
    no_type = {k: v for k, v in LLAMA31_8B.items() if k != "model_type"}
    assert spec_from_config(no_type, "c").architecture == "LlamaForCausalLM"
    assert spec_from_config({**no_type, "architectures": []}, "c").architecture == ""
    assert spec_from_config({**no_type, "architectures": ["x" * 100]}, "c").architecture == ""
    assert spec_from_config({**LLAMA31_8B, "model_type": "m" * 100}, "c").architecture == "LlamaForCausalLM"
    assert spec_from_config({**LLAMA31_8B, "model_type": "m" * 99}, "c").architecture == "m" * 99


def test_a_fifo_or_an_oversized_file_is_refused_unread(tmp_path):
    fifo = tmp_path / "fifo" / "config.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(ModelSpecError) as err:
        resolve_model(str(fifo.parent))  # a FIFO would block a read
    assert str(err.value) == f"{fifo}: not a regular file" and err.value.hint == HINT
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ModelSpecError) as err:
        resolve_model(str(big))
    assert str(err.value) == f"{big}: 4,194,305 bytes, too large for a config.json (limit 4,194,304)"
    assert err.value.hint == HINT


def test_a_missing_file_error_names_the_path(tmp_path):
    with pytest.raises(ModelSpecError) as err:
        resolve_model(str(tmp_path / "model"))
    assert str(err.value) == f"{tmp_path / 'model'}: no such file" and err.value.hint == HINT


def test_a_model_named_by_its_folder_or_its_config_file(tmp_path):
    folder = tmp_path / "Llama-3.1-8B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA31_8B))
    assert resolve_model(folder).name == "Llama-3.1-8B-Instruct"
    assert resolve_model(folder / "config.json").name == "Llama-3.1-8B-Instruct"
    assert resolve_model(folder / "config.json").source == str(folder / "config.json")


def test_a_bare_json_file_name_is_read_as_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA31_8B))
    spec = resolve_model("llama.json")  # no "/" in it: the .json ending makes it a path
    assert spec.layers == 32 and spec.name == "llama.json"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"a": "\xff"}', "c: not UTF-8 text (byte 7); is it a binary file?"),
        (b"{" * 1 + b'"a": 1,', "c: not valid JSON (line 1: Expecting property name enclosed in double quotes)"),
        (b"[" * 100_000 + b"]" * 100_000, "c: JSON nested too deeply to be a model config"),
        (b"1" * 5000, "c: not a usable JSON value (Exceeds the limit (4300 digits) for integer string conversion: "),
    ],
)
def test_unreadable_config_bytes_are_clear_errors(raw, message):
    with pytest.raises(ModelSpecError) as err:
        parse_config_text(raw, "c")
    assert str(err.value).startswith(message) and err.value.hint == HINT


def test_a_config_of_exactly_the_size_limit_is_read_whole(tmp_path):
    text = json.dumps(LLAMA31_8B).encode()
    path = tmp_path / "config.json"
    path.write_bytes(b" " * (MAX_CONFIG_BYTES - len(text)) + text)  # the closing brace is the last byte
    assert resolve_model(str(path)).layers == 32


def test_a_path_through_a_regular_file_cannot_be_read(tmp_path):
    (tmp_path / "file").write_text("{}")
    target = tmp_path / "file" / "config.json"
    with pytest.raises(ModelSpecError) as err:
        resolve_model(str(target))
    assert str(err.value) == f"{target}: cannot read it: Not a directory" and err.value.hint == HINT


def test_the_json_value_error_quotes_at_most_80_characters_of_pythons_message():
    with pytest.raises(ModelSpecError) as err:
        parse_config_text(b"1" * 5000, "c")
    head = "c: not a usable JSON value ("
    assert str(err.value).startswith(head) and str(err.value).endswith(")")
    assert len(str(err.value)) - len(head) - 1 == 80  # Python's message is longer (it names the digit count)


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ({"quant_method": "compressed-tensors", "format": "dense"}, "compressed-tensors quantization_config has no config_groups"),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": "corrupt"}}, "no compressed-tensors config group quantizes weights"),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"input_activations": {"num_bits": 8}}}},
         "no compressed-tensors config group quantizes weights"),
        ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 16}}}},
         "quantization 'num_bits' must be one of 4, 8, got 16"),
        ({"quant_method": "other", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}}, "unknown quant_method 'other'"),
        ({"fmt": "FP8_E4M3"}, "quantization_config has no quant_method"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "a bitsandbytes checkpoint; vLLM 0.29 and 0.32 cannot load it"),
        ({"quant_method": "awq", "bits": 4}, "the awq quantization_config has no 'group_size'"),
    ],
    ids=["no-groups", "corrupt-group", "no-weights", "16-bit-weights", "unknown-method", "fmt-without-method", "bitsandbytes", "awq-no-group"],
)
def test_quantization_configs_orch_cannot_size_are_errors_never_a_silent_16_bit_plan(quant, message):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(LLAMA31_8B, quantization_config=quant), "c")
    assert message in str(err.value) and str(err.value).startswith("c")
    assert err.value.exit_code == 2 and err.value.hint


ERNIE_45_21B = json.loads((Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "ERNIE-4.5-21B-A3B" / "config.json").read_text())


def _base_reading(field: str) -> dict:
    # a real config in which spec_from_config reads `field`
    if field == "num_experts":  # read only when neither Mixtral's nor DeepSeek's expert count is there
        return dict(LLAMA31_8B)
    if field.startswith("moe_") and field != "moe_intermediate_size":  # ERNIE 4.5's names
        return dict(ERNIE_45_21B)
    if field in ("num_experts_per_token", "num_shared_experts", "shared_expert_intermediate_size"):  # aliases, read when DeepSeek's are absent
        return {k: v for k, v in DEEPSEEK_V3.items() if k not in ("num_experts_per_tok", "n_shared_experts")}
    if field == "max_sequence_length":  # read only without max_position_embeddings
        return {k: v for k, v in LLAMA31_8B.items() if k != "max_position_embeddings"}
    return dict(DEEPSEEK_V3)


@pytest.mark.parametrize("field", sorted(FIELD_BOUNDS))
def test_every_field_error_names_the_file_and_the_field(field):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config({**_base_reading(field), field: "x"}, "m/config.json")
    assert str(err.value) == f"m/config.json: '{field}' must be a non-negative integer, got 'x'"


def test_a_config_that_is_not_an_object_is_refused_with_the_hint():
    with pytest.raises(ModelSpecError) as err:
        spec_from_config([1, 2], "m/config.json")  # type: ignore[arg-type]
    assert str(err.value) == "m/config.json: config.json must hold a JSON object" and err.value.hint == HINT


def test_the_smallest_model_the_bounds_allow_is_accepted():
    smallest = {"num_hidden_layers": 1, "hidden_size": 1, "num_attention_heads": 1, "vocab_size": 1, "intermediate_size": 0}
    spec = spec_from_config(smallest, "c")
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.vocab) == (1, 1, 1, 1, 1, 1)


def test_a_mixtral_config_without_any_mlp_width_names_the_file():
    config = {k: v for k, v in MIXTRAL_8X7B.items() if k != "intermediate_size"}  # and no moe_intermediate_size
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(config, "m/config.json")
    assert str(err.value) == "m/config.json: config is missing 'intermediate_size', which orch needs to size the model"


def test_top_1_routing_and_a_missing_experts_per_token_are_accepted():
    # Llama 4 Scout routes each token to 1 expert (num_experts_per_tok 1 in its config.json)
    assert spec_from_config(dict(MIXTRAL_8X7B, num_experts_per_tok=1), "c").experts_per_token == 1
    no_k = {k: v for k, v in MIXTRAL_8X7B.items() if k != "num_experts_per_tok"}
    assert spec_from_config(no_k, "c").num_experts == 8
    assert spec_from_config({**no_k, "num_local_experts": 1}, "c").num_experts == 1


def test_the_moe_catalog_entries_are_their_config_json():
    # Each entry against the checkpoint's own config.json (tests/data/planner/SOURCES.md): a typo in
    # the catalog fails here.
    configs = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"
    strip = lambda spec: replace(spec, name="", source="")  # noqa: E731
    mixtral = resolve_model(configs / "Mixtral-8x22B-v0.1")
    assert strip(CATALOG["mixtral-8x22b"]) == strip(mixtral)
    kimi = resolve_model(configs / "Kimi-K2-Instruct")
    assert strip(CATALOG["kimi-k2"]) == strip(replace(kimi, dtype="fp8"))  # the published weights are FP8
    bf16 = {k: v for k, v in QWEN3_235B_FP8.items() if k != "quantization_config"}
    qwen = spec_from_config({**bf16, "model_type": "qwen3_moe"}, "Qwen/Qwen3-235B-A22B config.json")
    assert strip(CATALOG["qwen3-235b-a22b"]) == strip(qwen)
    # the published totals: Mixtral-8x22B 141B, Qwen3-235B-A22B 235B, Kimi-K2 1.0T (1.03T with norms)
    assert f"{count_params(CATALOG['mixtral-8x22b']).total / 1e9:.0f}" == "141"
    assert f"{count_params(CATALOG['qwen3-235b-a22b']).total / 1e9:.0f}" == "235"
    assert f"{count_params(CATALOG['kimi-k2']).total / 1e12:.2f}" == "1.03"


def test_ernie_45_moe_is_read_with_its_own_expert_fields():
    """ERNIE 4.5 names its experts as vllm/model_executor/models/ernie45_moe.py reads them:
    moe_num_experts routed, moe_k active, moe_num_shared_experts of moe_intermediate_size, MoE from
    moe_layer_start_index on. Read as dense (before), the 21B model was 3.35B parameters and a
    plan put it on one 24 GB GPU."""
    spec = spec_from_config(ERNIE_45_21B, "c")
    assert (spec.num_experts, spec.experts_per_token, spec.shared_experts, spec.moe_intermediate, spec.first_k_dense) == (64, 6, 2, 1536, 1)
    assert 21.0e9 <= count_params(spec).total <= 22.5e9  # the published name: 21B total, 3B active


def test_an_ernie_interleaving_orch_cannot_count_is_refused():
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(ERNIE_45_21B, moe_layer_interval=2), "m/config.json")
    assert "MoE layers every 2 layer(s)" in str(err.value) and err.value.exit_code == 2


def test_qwen2_moe_shared_expert_width_counts_as_shared_experts_of_the_expert_width():
    # qwen2_moe.py / qwen3_next.py: one shared expert of shared_expert_intermediate_size
    qwen2_moe = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("n_shared_experts",)}
    spec = spec_from_config(dict(qwen2_moe, shared_expert_intermediate_size=4 * qwen2_moe["moe_intermediate_size"]), "c")
    assert spec.shared_experts == 4
    spec = spec_from_config(dict(qwen2_moe, shared_expert_intermediate_size=qwen2_moe["moe_intermediate_size"] + 1), "c")
    assert spec.shared_experts == 2  # rounded up


@pytest.mark.parametrize("key", ["num_moe_experts", "n_experts"])
def test_an_expert_count_orch_does_not_read_is_refused_instead_of_a_dense_plan(key):
    with pytest.raises(ModelSpecError) as err:
        spec_from_config(dict(LLAMA31_8B, **{key: 64}), "m/config.json")
    assert f"'{key}' describes experts" in str(err.value) and err.value.exit_code == 2


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_null_dtype_is_read_as_no_dtype(key):
    # transformers writes "dtype": null for a config built without one; vLLM then takes the weights' own
    assert spec_from_config({**{k: v for k, v in LLAMA31_8B.items() if k != "torch_dtype"}, key: None}, "c").dtype == "bf16"
    assert spec_from_config({**LLAMA31_8B, "dtype": None}, "c").dtype == spec_from_config(LLAMA31_8B, "c").dtype
