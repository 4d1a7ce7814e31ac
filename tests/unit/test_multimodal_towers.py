"""Multimodal checkpoints: the vision tower and projector counted from the config as vLLM loads
them (issue 26 item 5). Expected values: tests/data/checkpoints/multimodal/params.json, the
parameters of each real config's transformers model built on PyTorch's meta device
(scripts/count_towers.py; the same tensors the checkpoint holds: Qwen2.5-VL-7B 8.29B, Gemma 3 27B
27.4B and Llama 4 Scout 109B in all, as their model pages say)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.memory import GIB, count_params, stage_weight_bytes
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

ROOT = Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "multimodal"
ROWS = json.loads((ROOT / "params.json").read_text())["rows"]


def _spec(model: str):
    return spec_from_config(json.loads((ROOT / model / "config.json").read_text()), f"{model}/config.json", name=model)


@pytest.mark.parametrize("row", ROWS, ids=[r["model"] for r in ROWS])
def test_towers_and_text_model_have_the_checkpoints_parameters(row):
    spec = _spec(row["model"])
    assert spec.tower_params == row["tower_params"]
    assert abs(count_params(spec).total - (row["text_params"] + row["tower_params"])) / row["text_params"] < 0.0005


@pytest.mark.parametrize("row", ROWS, ids=[r["model"] for r in ROWS])
def test_one_gpu_holds_the_whole_checkpoint_at_16_bits(row):
    spec = _spec(row["model"])
    whole = stage_weight_bytes(spec, 0, spec.layers, tp=1, first=True, last=True)
    assert abs(whole - 2 * (row["text_params"] + row["tower_params"])) / whole < 0.001


def test_the_tower_is_split_over_tp_and_loaded_on_every_pipeline_stage():
    spec = _spec("qwen2.5_vl_7b")
    tower = spec.tower_params * 2
    for tp in (1, 2, 4):
        with_tower = stage_weight_bytes(spec, 0, 14, tp=tp, first=True, last=False)
        from dataclasses import replace

        without = stage_weight_bytes(replace(spec, tower_params=0), 0, 14, tp=tp, first=True, last=False)
        assert with_tower - without == pytest.approx(tower / tp)
        later = stage_weight_bytes(spec, 14, 28, tp=tp, first=False, last=True) - stage_weight_bytes(replace(spec, tower_params=0), 14, 28, tp=tp, first=False, last=True)
        assert later == pytest.approx(tower / tp)


def test_a_plan_counts_the_tower_in_its_parameters_and_weights():
    spec = _spec("gemma3")
    plan = plan_model(spec, make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1), PlanOptions(max_model_len=8192))
    assert plan.params == count_params(spec).total and spec.towers == "gemma3"
    assert plan.weights_gib_per_gpu == pytest.approx(2 * (27_009_346_304 + 423_060_336) / plan.tp / GIB, rel=0.002)


def _with_vision(model: str, **fields):
    config = json.loads((ROOT / model / "config.json").read_text())
    config["vision_config"] = {**config["vision_config"], **fields}
    return config


@pytest.mark.parametrize(
    ("model", "fields", "says"),
    [
        # a tower past any GPU cluster: the plan's float arithmetic would overflow on it
        ("gemma3", {"hidden_size": 10**160}, "vision_config/audio_config describe more than the 100T parameters orch accepts"),
        # a pixel-shuffle ratio whose square is 0.0 in floating point
        ("llama4_scout_17b_16e", {"pixel_shuffle_ratio": 1e-200}, "the vision/audio sections cannot be sized (float division by zero)"),
        # a number where Qwen3-VL lists its deepstack layers
        ("Qwen3-VL-8B-Instruct", {"deepstack_visual_indexes": 3}, "the vision/audio sections cannot be sized (object of type 'int' has no len())"),
    ],
)
def test_a_tower_that_cannot_be_sized_is_an_error_naming_its_section(model, fields, says):
    from orchestrator.errors import ModelSpecError

    with pytest.raises(ModelSpecError) as err:
        spec_from_config(_with_vision(model, **fields), f"{model}/config.json", name=model)
    assert str(err.value) == f"{model}/config.json: {says}" and err.value.exit_code == 2
    assert "vision_config" in (err.value.hint or "")
