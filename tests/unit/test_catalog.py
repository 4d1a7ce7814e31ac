"""Model specs: the catalog, config.json parsing (pure) and the one file read at the edge."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import CATALOG, ModelSpec, closest_name, resolve_model, spec_from_config
from orchestrator.plan.tinymodel import TINY_CONFIG

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
    assert _numbers(spec_from_config(outer, "c")) == _numbers(CATALOG["llama3-8b"])


def test_quantized_checkpoints_report_their_weight_dtype():
    assert spec_from_config(DEEPSEEK_V3, "c").dtype == "fp8"
    awq = dict(LLAMA31_8B, quantization_config={"quant_method": "awq", "bits": 4})
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
