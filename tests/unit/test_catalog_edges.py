"""Model specs: edges of resolve_model's name/path rule and of the MoE/MLA fields (issue 17's survivors)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import CATALOG, spec_from_config
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
