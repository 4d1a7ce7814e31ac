"""Model specs: edges of resolve_model's name/path rule and of the MoE/MLA fields (issue 17's survivors)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.config_fields import (
    FIELD_BOUNDS,
    expert_count,
    first_dense_layers,
    max_position,
    per_layer_widths,
    read_int,
    shared_experts,
)
from orchestrator.plan.model_ref import resolve_model
from tests.unit.test_catalog import DEEPSEEK_V3, LLAMA31_8B


def test_a_bare_json_name_that_does_not_exist_is_a_missing_file_not_an_unknown_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config.json here, and the name holds no "/": the .json ending makes it a path
    with pytest.raises(ModelSpecError) as err:
        resolve_model("config.json")
    assert str(err.value) == "config.json: no such file"


def test_an_unknown_name_with_nothing_close_lists_the_catalog_and_suggests_nothing():
    with pytest.raises(ModelSpecError) as err:
        resolve_model("zzzz")
    message = str(err.value)
    prefix = "unknown model 'zzzz' (catalog: "
    assert message.startswith(prefix) and message.endswith(")")
    assert message[len(prefix) : -1].split(", ") == list(CATALOG)  # every name, comma-separated, nothing else
    hint = err.value.hint
    assert hint is not None and hint.startswith("pass a catalog name")
    assert "local Hugging Face model folder" in hint and hint.endswith("config.json")
    assert err.value.exit_code == 2


def test_an_mla_config_without_query_compression_has_q_lora_rank_0():
    # DeepSeek-V2-Lite's config.json writes "q_lora_rank": null (its queries are projected directly;
    # https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json); V3 compresses to 1536.
    spec = spec_from_config(dict(DEEPSEEK_V3, q_lora_rank=None), "c")
    assert (spec.q_lora_rank, spec.kv_lora_rank, spec.is_mla) == (0, 512, True)
    assert spec_from_config(DEEPSEEK_V3, "c").q_lora_rank == 1536


def test_moe_and_mla_fields_in_a_dense_config_leave_its_numbers_alone():
    # Keys that only size MoE layers or MLA attention are read only when the config has experts / kv_lora_rank.
    stray = {
        "moe_intermediate_size": 2048, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128,
    }  # fmt: skip
    plain = spec_from_config(LLAMA31_8B, "c")
    spec = spec_from_config({**LLAMA31_8B, **stray}, "c")
    assert asdict(spec) == asdict(plain)
    assert (spec.moe_intermediate, spec.q_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim) == (
        0, 0, 0, 0, 0,
    )  # fmt: skip


def test_a_config_file_that_is_not_json_is_named_by_its_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ModelSpecError) as err:
        resolve_model(path)
    assert str(err.value).startswith(f"{path}: not valid JSON (line 1: ")


# ---- config_fields at its edges: per-layer widths, ERNIE 4.5's MoE run, the length keys, the bounds ----

# tencent/Hunyuan-A13B-Instruct's architecture fields as a profiling project's test mirrors them
# (HUNYUAN_MOE_LIST_CONFIG): one moe_intermediate_size, moe_topk and num_shared_expert per layer
HUNYUAN_A13B = {
    "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 128167,
    "torch_dtype": "bfloat16", "num_experts": 64, "moe_intermediate_size": [3072] * 32, "moe_topk": [8] * 32,
    "num_shared_expert": [1] * 32,
}  # fmt: skip


def test_a_per_layer_expert_width_list_is_sized_at_its_mean_with_a_note():
    cfg, note = per_layer_widths(HUNYUAN_A13B, "c", 32)
    assert cfg == {**HUNYUAN_A13B, "moe_intermediate_size": 3072}
    assert note == "moe_intermediate_size per layer 3072..3072: sized at their mean 3072"
    assert per_layer_widths(LLAMA31_8B, "c", 32) == (LLAMA31_8B, "")  # a number is left alone
    spec = spec_from_config(HUNYUAN_A13B, "c")
    assert (spec.num_experts, spec.moe_intermediate) == (64, 3072)
    # the bounds of every moe_intermediate_size (FIELD_BOUNDS: up to 1,048,576), each entry a positive integer
    assert per_layer_widths({"moe_intermediate_size": [1, 1_048_576]}, "c", 2)[0]["moe_intermediate_size"] == 524288
    for bad in ([], [0, 3072], [3072, 1_048_577], [3072, True], [3072, "3072"]):
        with pytest.raises(ModelSpecError) as err:
            per_layer_widths({**HUNYUAN_A13B, "moe_intermediate_size": bad}, "m/config.json", 32)
        assert str(err.value) == "m/config.json: 'moe_intermediate_size' must be an integer or a list of positive integers"
        assert err.value.hint and err.value.hint.startswith("use a catalog name")


ERNIE_45_21B = json.loads((Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "ERNIE-4.5-21B-A3B" / "config.json").read_text())


def test_ernie_moe_layers_default_as_vllm_reads_them_and_must_run_to_the_last_layer():
    # ernie45_moe.py: getattr(config, "moe_layer_start_index", 0), "moe_layer_interval" 1, "moe_layer_end_index"
    # num_hidden_layers - 1; a layer is MoE when start <= i <= end and (i + 1) % interval == 0
    assert ERNIE_45_21B["num_hidden_layers"] == 28 and ERNIE_45_21B["moe_layer_start_index"] == 1
    bare = {k: v for k, v in ERNIE_45_21B.items() if k not in ("moe_layer_start_index", "moe_layer_interval", "moe_layer_end_index")}
    assert first_dense_layers(bare, "c", 28) == 0
    assert first_dense_layers(ERNIE_45_21B, "c", 28) == 1
    for end in (None, -1, 27):  # unset, transformers' "to the last", the last layer itself
        assert first_dense_layers({**ERNIE_45_21B, "moe_layer_end_index": end}, "c", 28) == 1
    for end, interval in ((26, 1), (0, 1), (27, 2)):
        with pytest.raises(ModelSpecError) as err:
            first_dense_layers({**ERNIE_45_21B, "moe_layer_end_index": end, "moe_layer_interval": interval}, "m/config.json", 28)
        assert str(err.value) == (
            f"m/config.json: MoE layers every {interval} layer(s) up to layer {end}: orch counts MoE layers only as "
            "one run from moe_layer_start_index to the last layer"
        )
        assert err.value.hint == "orch does not size this layout of MoE layers yet; vLLM's ernie45_moe.py defines which layers are MoE"


def test_an_unread_expert_count_of_zero_is_no_expert_and_any_positive_one_is_refused_with_its_hint():
    assert expert_count({**LLAMA31_8B, "num_moe_experts": 0}, "c") == 0  # Megatron writes 0 / null for a dense model
    for count in (1, 64):
        with pytest.raises(ModelSpecError) as err:
            expert_count({**LLAMA31_8B, "num_moe_experts": count}, "m/config.json")
        assert str(err.value) == (
            "m/config.json: 'num_moe_experts' describes experts, but orch finds no expert count it reads "
            "(num_local_experts, n_routed_experts, num_experts, moe_num_experts): it would size the model as dense"
        )
        assert err.value.hint == "use a config.json of a family orch reads (Mixtral, Qwen-MoE, DeepSeek, ERNIE 4.5, gpt-oss, Llama 4)"


def test_a_shared_expert_count_wins_over_a_shared_expert_width():
    # DeepSeek's n_shared_experts is the count; Qwen2-MoE's width is read only when no count is set (qwen2_moe.py)
    assert shared_experts({**DEEPSEEK_V3, "shared_expert_intermediate_size": 4 * 2048}, "c", 2048) == 1


def test_the_longest_sequence_key_takes_the_smallest_positive_value_up_to_2_to_the_31():
    no_max = {k: v for k, v in LLAMA31_8B.items() if k != "max_position_embeddings"}
    assert max_position({**no_max, "seq_length": 1}, "c") == 1  # vLLM takes the smallest set value, 1 included
    # model_max_length wins when set; a tokenizer's sentinel past 2**31 (1e30, 2**32 ...) is not a length
    assert max_position({**LLAMA31_8B, "model_max_length": 2**31}, "c") == 2**31
    for sentinel in (2**31 + 1, 2**32, 3**31):
        assert max_position({**LLAMA31_8B, "model_max_length": sentinel}, "c") == 131072


def test_a_field_without_bounds_of_its_own_takes_any_integer_from_0_to_2_to_the_31():
    # intermediate_size_mlp (Llama 4's dense layers) has no FIELD_BOUNDS row: 0 .. 2**31
    assert "intermediate_size_mlp" not in FIELD_BOUNDS
    assert read_int({"intermediate_size_mlp": 0}, "intermediate_size_mlp", "c") == 0
    assert read_int({"intermediate_size_mlp": 2**31}, "intermediate_size_mlp", "c") == 2**31
    with pytest.raises(ModelSpecError) as err:
        read_int({"intermediate_size_mlp": 2**31 + 1}, "intermediate_size_mlp", "m/config.json")
    assert str(err.value) == "m/config.json: 'intermediate_size_mlp' is 2,147,483,649, outside the range orch accepts (0 to 2,147,483,648)"
