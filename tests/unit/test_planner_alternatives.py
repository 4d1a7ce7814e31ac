"""Layouts a user would weigh (issue 26 item 6): when the plan runs pipeline stages inside one
node, it also shows TP=1 replicas at the longest context one GPU holds and TP over PCIe on the same
GPUs, each with KV tokens and concurrency, and says why it chose. Every figure of an alternative is
the planner's own evaluation of that layout (checked here against plan_model of the same layout)."""

from __future__ import annotations

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

L4X4 = make_shape(gpu_type_name="L4-24GB", gpus_per_node=4, nodes=1)  # PCIe cards: no NVLink
L40SX8 = make_shape(gpu_type_name="L40S-48GB", gpus_per_node=8, nodes=1)


def test_llama_8b_at_128k_on_pcie_l4s_weighs_short_tp1_replicas_and_tp_over_pcie():
    plan = plan_model(CATALOG["llama3-8b"], L4X4)
    assert (plan.tp, plan.pp, plan.replicas) == (1, 2, 2)
    one, wide = plan.alternatives
    # TP=1 at the longest max_model_len one L4 holds: that plan, forced, fits with exactly those figures
    tp1 = plan_model(CATALOG["llama3-8b"], L4X4, PlanOptions(tp=1, pp=1, max_model_len=one["max_model_len"]))
    assert one["max_model_len"] < 131072 and one["max_model_len"] % 16 == 0
    assert (one["replicas"], one["kv_cache_tokens"], one["fits"]) == (tp1.replicas, tp1.kv_cache_tokens, True) == (4, tp1.kv_cache_tokens, True)
    with pytest.raises(PlanError, match="the forced layout does not fit"):  # and no longer one
        plan_model(CATALOG["llama3-8b"], L4X4, PlanOptions(tp=1, pp=1, max_model_len=one["max_model_len"] + 16))
    # TP=2 over PCIe on the same two GPUs
    tp2 = plan_model(CATALOG["llama3-8b"], L4X4, PlanOptions(tp=2, pp=1))
    assert (wide["tp"], wide["kv_cache_tokens"], wide["max_concurrency"]) == (2, tp2.kv_cache_tokens, round(tp2.max_concurrency, 2))
    said = [r for r in plan.reasons if r.startswith(("alternative: ", "chose "))]
    assert said[0] == (f"alternative: TP=1 PP=1 at --max-model-len {one['max_model_len']}: 4 replica(s), {one['kv_cache_tokens']:,} KV tokens "
                       f"each, 1.00 x max_model_len {one['max_model_len']:,} (4 replicas instead of 2, each sequence at most "
                       f"{one['max_model_len']:,} tokens instead of 131,072)")  # fmt: skip
    assert said[2].startswith("chose TP=1 PP=2 inside one node: pipeline stages hand one batch of hidden states to the next stage "
                              "where TP all-reduces every layer over PCIe; TP=1 replicas serve")  # fmt: skip


def test_a_model_one_gpu_cannot_hold_says_so():
    plan = plan_model(CATALOG["llama3-70b"], L40SX8)
    assert (plan.tp, plan.pp) == (1, 8)
    one, wide = plan.alternatives
    assert (one["fits"], one["replicas"]) == (False, 0) and one["note"].startswith("one GPU is short by ")
    assert (wide["tp"], wide["fits"]) == (8, True)
    assert plan.reasons[-2].endswith("over PCIe; one GPU cannot hold the model")


def test_no_alternatives_for_tp_inside_an_nvlink_node_or_a_forced_layout():
    assert plan_model(CATALOG["llama3-70b"], make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1)).alternatives == ()
    assert plan_model(CATALOG["llama3-8b"], L4X4, PlanOptions(tp=1, pp=2)).alternatives == ()
