"""Block-FP8 MoE checkpoints: the layouts vLLM refuses to load, and the ones it refines.

vLLM shards each routed expert's intermediate size over the MoE's TP ranks (DP x TP without
expert parallelism, 1 with it: fused_moe/config.py FusedMoEParallelConfig.make). Before 0.32 a
shard that is not a whole number of scale blocks is refused at load by
quantization/utils/fp8_utils.py validate_fp8_block_shape_moe; vllm-project/vllm#48173 quotes it
for a 1,536-wide expert at TP=8: "The output_size of gate's and up's weight = 192 is not
divisible by weight quantization block_n = 128." vLLM 0.32.0 refines the blocks instead when the
gcd of the blocks, the shard and the hidden size is at least 32 (fused_moe/oracle/fp8.py
refine_fp8_moe_block_shape). The model is Qwen3-235B-A22B-Instruct-2507-FP8's own config.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.layout import fp8_block_problem
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

QWEN = resolve_model(
    str(Path(__file__).resolve().parents[1] / "data" / "planner" / "configs" / "Qwen3-235B-A22B-Instruct-2507-FP8")
)
ONE_NODE = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1)
OLD, REFINING = PlanOptions(vllm_version="0.29.0"), PlanOptions(vllm_version="0.32.0")


def test_the_issue_shape_is_refused_before_the_refinement_with_vllms_numbers():
    why = fp8_block_problem(QWEN, OLD, tp=8)
    assert why is not None and "1536/8 = 192" in why and "block 128" in why and "gate's and up's" in why


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_of_whole_blocks_load_on_every_version(tp):
    # 1536 / 4 = 384 = 3 x 128
    assert fp8_block_problem(QWEN, OLD, tp=tp) is None


def test_expert_parallel_keeps_experts_whole():
    assert fp8_block_problem(QWEN, OLD, tp=8, expert_parallel=True) is None
    # DP x TP = 16 without expert parallelism splits each expert 16 ways: 96 per GPU
    assert "1536/16 = 96" in (fp8_block_problem(QWEN, OLD, tp=8, dp=2) or "")
    assert fp8_block_problem(QWEN, OLD, tp=8, dp=2, expert_parallel=True) is None


def test_refining_version_loads_192_but_not_a_shard_below_32():
    assert fp8_block_problem(QWEN, REFINING, tp=8) is None  # gcd(128, 128, 192, 4096) = 64
    # 1536 / 32 = 48: gcd(128, 128, 48, 4096) = 16 < 32, no refinement, refused
    assert "1536/32 = 48" in (fp8_block_problem(QWEN, REFINING, tp=32) or "")


def test_unquantized_and_dense_models_are_never_refused():
    assert fp8_block_problem(CATALOG["qwen3-235b-a22b"], OLD, tp=8) is None  # bf16 sibling
    assert fp8_block_problem(CATALOG["llama3-70b"], OLD, tp=8) is None


def test_forced_layout_is_a_plan_error_with_the_ways_out():
    with pytest.raises(PlanError) as err:
        plan_model(QWEN, ONE_NODE, PlanOptions(vllm_version="0.29.0", tp=8))
    assert "192" in err.value.message and "--expert-parallel" in (err.value.hint or "")
    assert plan_model(QWEN, ONE_NODE, PlanOptions(vllm_version="0.29.0", tp=8, expert_parallel=True)).tp == 8
    assert plan_model(QWEN, ONE_NODE, PlanOptions(vllm_version="0.32.0", tp=8)).tp == 8


def test_automatic_choice_skips_the_refused_tp_and_says_why():
    plan = plan_model(QWEN, ONE_NODE, OLD)
    assert plan.tp != 8
    assert any(r.startswith("TP sizes 8 skipped") and "192" in r for r in plan.reasons), plan.reasons


def test_deepseek_v3_dp_group_without_ep_is_refused_only_where_vllm_refuses():
    v3 = CATALOG["deepseek-v3"]  # moe_intermediate 2048, [128, 128] blocks, hidden 7168
    assert fp8_block_problem(v3, OLD, tp=8, dp=2) is None  # 2048 / 16 = 128
    assert "2048/32 = 64" in (fp8_block_problem(v3, OLD, tp=8, dp=4) or "")
    assert fp8_block_problem(v3, REFINING, tp=8, dp=4) is None  # gcd(128, 128, 64, 7168) = 64
