"""plan/dp_choice.py at its edges: groups as large as the experts, as a node, as the cluster; a
rank's TP at a node's size; TP equal to the KV heads; the one-group-per-node advice; the figures of
the side-by-side table.

The counts come from the models' config.json (Mixtral-8x7B: ``num_local_experts`` 8,
``num_key_value_heads`` 8; DeepSeek-V3: ``n_routed_experts`` 256, tests/data/checkpoints;
Qwen3-235B-A22B: 128 experts, ``num_key_value_heads`` 4) and vLLM's rules for DP x EP
(``vllm/config/parallel.py``: EP size = DP x TP, a rank's TP inside a node, ``data_parallel_size_local``
ranks per node). KV token figures are compared with another path to the same layout (a forced
``--dp`` plan), never copied from orch's output.
"""

from __future__ import annotations

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.dp_choice import dp_problem
from orchestrator.plan.memory import GIB
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape

V3 = CATALOG["deepseek-v3"]
MIXTRAL = CATALOG["mixtral-8x7b"]
QWEN3 = CATALOG["qwen3-235b-a22b"]
H100x2 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=2)
H200x2 = make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=2)
H200x1 = make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=1)
CPUx2 = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=2)


def test_the_model_counts_the_edges_come_from():
    assert (MIXTRAL.num_experts, MIXTRAL.kv_heads) == (8, 8)
    assert V3.num_experts == 256 and V3.is_mla
    assert (QWEN3.num_experts, QWEN3.kv_heads, QWEN3.is_mla) == (128, 4, False)


def test_a_group_as_large_as_the_experts_holds_one_expert_per_gpu():
    # Mixtral's 8 experts over DP=8 x TP=1: EP size 8, one whole expert per GPU
    assert dp_problem(MIXTRAL, H100x2, 8, 1) is None
    assert dp_problem(MIXTRAL, H100x2, 4, 2) is None
    assert "DP x TP = 16 GPUs exceeds the 8 experts" in (dp_problem(MIXTRAL, H100x2, 8, 2) or "")
    plan = plan_model(MIXTRAL, H100x2, PlanOptions(dp=8))
    assert (plan.dp, plan.tp, plan.replicas, plan.expert_parallel) == (8, 1, 2, True)
    assert plan.layouts["dp_ep"]["ep_size"] == 8


def test_a_group_as_large_as_the_cluster_and_a_rank_as_large_as_a_node():
    assert dp_problem(V3, H200x2, 16, 1) is None  # every GPU of 2 x 8
    assert dp_problem(V3, H200x2, 2, 8) is None  # TP=8 fills a node: one rank per node
    assert "the cluster has 16" in (dp_problem(V3, H200x2, 32, 1) or "")
    assert "the cluster has 8" in (dp_problem(V3, H200x1, 2, 8) or "")
    assert "exceeds the 8 GPU(s) per node" in (dp_problem(V3, H200x2, 1, 16) or "")
    plan = plan_model(V3, H200x2, PlanOptions(dp=2, tp=8))
    assert (plan.dp, plan.tp, plan.replicas) == (2, 8, 1)
    dp = plan.layouts["dp_ep"]
    assert (dp["ep_size"], dp["gpus_per_replica"], dp["dp_ranks_per_node"], dp["nodes_per_replica"]) == (16, 16, 1, 2)
    assert "forced DP=2, TP=8 per rank:" in " ".join(plan.reasons)
    assert "(the smallest TP" not in " ".join(plan.reasons)  # TP was given, not chosen


def test_groups_within_a_node_divide_it_and_larger_ones_take_whole_nodes():
    assert dp_problem(V3, H200x2, 8, 1) is None  # one node exactly
    assert dp_problem(V3, H200x2, 4, 1) is None and dp_problem(V3, H200x2, 2, 1) is None
    assert "takes whole nodes: DP x TP = 12" in (dp_problem(V3, H200x2, 12, 1) or "")


def test_one_rank_is_a_valid_dp_size_for_any_model_and_none_is_not():
    dense = CATALOG["llama3-8b"]
    assert dp_problem(dense, H100x2, 1, 1) is None
    assert "dense model" in (dp_problem(dense, H100x2, 2, 1) or "")
    assert "DP must be at least 1, got 0" == dp_problem(MIXTRAL, H100x2, 0, 1)


def test_a_cpu_group_takes_one_rank_per_node_up_to_the_nodes():
    assert dp_problem(MIXTRAL, CPUx2, 2, 1) is None  # as many ranks as nodes
    assert dp_problem(MIXTRAL, CPUx2, 1, 1) is None
    assert "one rank per node" in (dp_problem(MIXTRAL, CPUx2, 3, 1) or "")
    assert "one rank per node" in (dp_problem(MIXTRAL, CPUx2, 2, 2) or "")
    plan = plan_model(MIXTRAL, CPUx2, PlanOptions(dp=2, max_model_len=1024))
    assert list(plan.layouts) == ["dp_ep"]  # no side-by-side on CPU
    dp = plan.layouts["dp_ep"]
    # a CPU rank is a node: 2 ranks, 2 nodes, 1 rank per node
    assert (dp["dp_ranks_per_node"], dp["nodes_per_replica"], dp["ep_size"], dp["replicas"]) == (1, 2, 2, 1)
    assert dp["kv_cache_tokens"] == 2 * dp["kv_cache_tokens_per_rank"] == dp["kv_cache_tokens_cluster"]
    assert dp["max_concurrency"] == pytest.approx(dp["kv_cache_tokens"] / 1024, abs=0.005)


def test_one_group_over_two_nodes_names_the_group_per_node_alternative():
    """DeepSeek-V3 on 2 x 8 H200: DP=16 spans both nodes (a gang: one failed rank restarts all 16);
    the reasons name the layout of one group per node with its KV tokens, the forced --dp 8 plan's."""
    plan = plan_model(V3, H200x2)
    assert (plan.dp, plan.tp, plan.replicas) == (16, 1, 1)
    per_node = plan_model(V3, H200x2, PlanOptions(dp=8, tp=1))
    advice = [r for r in plan.reasons if r.startswith("one DP group spans all 16 GPUs")]
    assert advice == [
        "one DP group spans all 16 GPUs: a failed rank restarts the whole group (gang); "
        f"--dp 8 --tp 1 plans one group per node ({per_node.kv_cache_tokens:,} KV tokens each)"
    ]
    assert any(r.startswith("DP x EP: DP=16 x TP=1 EP=16") for r in plan.reasons)
    # the MLA reason: 16 ranks' own tokens against TP=8's 8 copies of each
    layout = next(r for r in plan.reasons if r.startswith("layout: "))
    dp_total, tp_total = plan.layouts["dp_ep"]["kv_cache_tokens_cluster"], plan.layouts["tp_pp"]["kv_cache_tokens_cluster"]
    assert f"holds {dp_total / tp_total:.1f}x the KV tokens of TP=8 PP=1 over the cluster ({dp_total:,} against {tp_total:,})" in layout
    # on one node the group is the node: nothing to advise
    single = plan_model(V3, H200x1)
    assert (single.dp, single.replicas) == (8, 1)
    assert not any(r.startswith("one DP group spans") for r in single.reasons)


def test_when_a_node_cannot_hold_a_group_the_advice_says_so():
    # DeepSeek-V3 FP8 on 8 x 80 GB does not fit a node (671B parameters at 1 byte): DP=4 x TP=4 over both
    plan = plan_model(V3, H100x2)
    assert (plan.dp, plan.tp, plan.replicas) == (4, 4, 1)
    assert any(r.endswith("a group of one node (8 GPUs) does not fit") for r in plan.reasons)
    dp, tp = plan.layouts["dp_ep"], plan.layouts["tp_pp"]
    assert (dp["dp_ranks_per_node"], dp["nodes_per_replica"], dp["ep_size"]) == (2, 2, 16)
    assert (tp["tp"], tp["pp"], tp["nodes_per_replica"], tp["ep_size"], tp["dp_ranks_per_node"]) == (8, 2, 2, 1, None)


def test_tp_equal_to_the_kv_heads_caches_each_head_once():
    """Qwen3-235B-A22B (4 KV heads) at TP=4 on H200s: each rank holds one head, no copies, and the
    reason says nothing of copies; at TP=8 on H100s each head is cached twice."""
    h200 = plan_model(QWEN3, H200x2)
    assert (h200.dp, h200.tp) == (1, 4)
    layout = next(r for r in h200.reasons if r.startswith("layout: "))
    assert "caches each head" not in layout
    assert layout.startswith("layout: TP=4 PP=1 holds at least as many KV tokens over the cluster")
    # side by side: the best DP x EP layout of the replica's own 4 GPUs, not chosen
    dp = h200.layouts["dp_ep"]
    assert (dp["dp"] * dp["tp"], dp["chosen"], dp["layout"]) == (4, False, "dp_ep")
    assert h200.layouts["tp_pp"]["chosen"] is True and h200.layouts["tp_pp"]["layout"] == "tp_pp"
    h100 = plan_model(QWEN3, H100x2)
    assert (h100.dp, h100.tp) == (2, 4)
    assert any(r.endswith("TP=8 past the 4 KV heads caches each head 2 times") for r in h100.reasons)


def test_a_replica_whose_gpus_hold_no_dp_layout_shows_the_best_of_the_cluster_beside_it():
    # Mixtral-8x22B at TP=4 on H100s: no DP x EP layout of 4 GPUs fits, so TP x PP stays, and the
    # table shows the best DP layout of any size instead
    plan = plan_model(CATALOG["mixtral-8x22b"], H100x2)
    assert (plan.dp, plan.tp) == (1, 4)
    assert any(r.startswith("layout: no DP x EP layout of the 4 GPUs of a TP=4 PP=1 replica fits, so TP=4 PP=1") for r in plan.reasons)
    dp = plan.layouts["dp_ep"]
    assert dp["fits"] and dp["gpus_per_replica"] > 4 and dp["chosen"] is False


def test_a_forced_dp_that_no_tp_makes_fit_is_refused():
    with pytest.raises(PlanError, match="DP x TP = 16 GPUs, but the cluster has 8") as err:
        plan_model(V3, H200x1, PlanOptions(dp=16))
    assert "--dp" in (err.value.hint or "")


def test_on_equal_kv_tokens_more_groups_win():
    """With a fixed KV cache of 20 GiB per GPU (vLLM's kv_cache_memory_bytes) every DeepSeek-V3 rank
    at TP=1 caches the same tokens, so DP=8 (two groups) and DP=16 (one) hold as many over the
    cluster; the module's rule then takes more groups (a failed rank restarts only its group)."""
    latent = 61 * (512 + 64) * 2  # bytes per token: one MLA latent per layer, bf16
    rank = (20 * 2**30 // (16 * latent)) * 16  # whole blocks of 16 tokens
    plan = plan_model(V3, H200x2, PlanOptions(kv_cache_gib=20))
    assert (plan.dp, plan.tp, plan.replicas) == (8, 1, 2)
    assert plan.kv_cache_tokens_per_rank == rank
    assert plan.layouts["dp_ep"]["kv_cache_tokens_cluster"] == 16 * rank
    one_group = plan_model(V3, H200x2, PlanOptions(kv_cache_gib=20, dp=16))
    assert one_group.kv_cache_tokens == 16 * rank and one_group.replicas == 1


def test_the_side_by_side_figures_of_a_dp_group():
    """DeepSeek-V3 as DP=16 x TP=1 on 2 x 8 H200: the weights per GPU worked out from its FP8
    checkpoint (test_planner_dp.v3_weights_at_tp1, 16 of 256 experts per GPU), GiB to 3 places as
    the plan table prints them; concurrency as vLLM logs it (``Maximum concurrency for %s tokens per
    request: %.2fx``, vllm/v1/core/kv_cache_utils.py): tokens / max_model_len to 2 places."""
    from tests.unit.test_planner_dp import v3_weights_at_tp1

    plan = plan_model(V3, H200x2)
    dp = plan.layouts["dp_ep"]
    assert dp["weights_gib_per_gpu"] == round(v3_weights_at_tp1(16) / GIB, 3)
    assert dp["kv_cache_gib_per_gpu"] == round(plan.kv_cache_gib_per_gpu, 3)
    assert dp["kv_cache_tokens"] == 16 * dp["kv_cache_tokens_per_rank"] == plan.kv_cache_tokens
    assert dp["max_concurrency"] == round(dp["kv_cache_tokens"] / 163840, 2) == dp["max_concurrency_cluster"]
    assert (dp["expert_parallel"], dp["pp"], dp["fits"], dp["summary"]) == (True, 1, True, plan.layouts["dp_ep"]["summary"])
    tp = plan.layouts["tp_pp"]  # TP=8 on one node, two replicas
    assert tp["max_concurrency_cluster"] == round(2 * tp["kv_cache_tokens"] / 163840, 2)
    assert tp["kv_cache_tokens_cluster"] == 2 * tp["kv_cache_tokens"]
    assert (tp["expert_parallel"], tp["fits"]) == (False, True)


def test_a_forced_rank_tp_past_a_node_is_refused_with_the_way_out():
    with pytest.raises(PlanError) as err:
        plan_model(V3, H200x2, PlanOptions(dp=2, tp=16))
    assert err.value.message == "TP=16 of a DP rank exceeds the 8 GPU(s) per node (a rank's TP stays inside a node)"
    assert err.value.hint == "choose --dp so that DP x TP divides a node's GPUs or takes whole nodes, or leave --dp out"


def test_a_forced_dp_whose_every_tp_splits_fp8_blocks_is_refused_with_vllms_numbers():
    """Qwen3-235B-A22B-Instruct-2507-FP8 (experts 1,536 wide, [128, 128] scale blocks) forced to DP=8
    without expert parallelism on vLLM 0.29: DP x TP = 8 splits each expert to 192 and 16 to 96,
    neither a multiple of block_n 128, which vLLM before 0.32 refuses at load
    (fp8_utils.py validate_fp8_block_shape_moe; vllm-project/vllm#48173 quotes the 192)."""
    from tests.unit.test_fp8_moe_blocks import QWEN

    options = PlanOptions(vllm_version="0.29.0", dp=8, expert_parallel=False)
    with pytest.raises(PlanError) as err:
        plan_model(QWEN, H100x2, options)
    assert err.value.message.startswith("DP x TP=8 splits each expert to 1536/8 = 192, and vLLM 0.29.0 refuses")
    assert (err.value.hint or "").startswith(f"--expert-parallel keeps each of {QWEN.name}'s experts whole on one GPU")
    # with expert parallelism each GPU holds whole experts: no split, no refusal
    plan = plan_model(QWEN, H100x2, PlanOptions(vllm_version="0.29.0", dp=8))
    assert (plan.dp, plan.expert_parallel) == (8, True)


def _layout_reason(plan) -> str:
    return next(r for r in plan.reasons if r.startswith("layout: "))


def test_when_nothing_fits_the_reason_says_so():
    # DeepSeek-V3 FP8 (about 671 GB of weights) on one node of 8 x 80 GB: no layout holds it
    plan = plan_model(V3, make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1))
    assert plan.replicas == 0 and plan.dp == 1
    assert _layout_reason(plan) == "layout: no DP x EP layout fits either"
    # Kimi-K2 (about 1 TB at FP8) on 2 x 8 H100: TP=8 x PP=2 fits, no DP group does (each rank keeps
    # the attention and dense layers whole)
    kimi = plan_model(CATALOG["kimi-k2"], H100x2)
    assert (kimi.dp, kimi.tp, kimi.pp) == (1, 8, 2)
    assert _layout_reason(kimi) == "layout: no DP x EP layout fits, so TP x PP"
    assert kimi.layouts["dp_ep"]["fits"] is False  # the table still shows the DP layout tried
    # ... as serving nothing: no replica, no KV token over the cluster
    assert (kimi.layouts["dp_ep"]["replicas"], kimi.layouts["dp_ep"]["kv_cache_tokens_cluster"]) == (0, 0)
    assert kimi.layouts["dp_ep"]["max_concurrency_cluster"] == 0


def test_equal_kv_tokens_keep_tp_x_pp():
    """Qwen3-235B-A22B (4 KV heads, 94 layers, head size 128) with a fixed 12 GiB KV cache per GPU
    (vLLM's kv_cache_memory_bytes): at TP=4 a GPU caches 1 KV head (2 x 1 x 128 x 2 bytes x 94
    layers = 48,128 bytes per token), at DP=4 x TP=1 four ranks cache all 4 heads each (192,512
    bytes); in whole blocks of 16 both hold the same tokens per 4 GPUs, and a tie keeps TP x PP
    (no all-to-all traffic)."""
    fixed = 12 * 2**30
    tp4 = (fixed // (48_128 * 16)) * 16
    dp4 = 4 * (fixed // (192_512 * 16)) * 16
    assert tp4 == dp4
    plan = plan_model(QWEN3, H200x2, PlanOptions(kv_cache_gib=12))
    assert (plan.dp, plan.tp, plan.replicas) == (1, 4, 4)
    assert plan.kv_cache_tokens == tp4
    assert _layout_reason(plan) == (
        f"layout: TP=4 PP=1 holds at least as many KV tokens over the cluster ({4 * tp4:,}) as any DP x EP layout of "
        f"its 4 GPUs (DP=4 x TP=1 EP=4: {4 * dp4:,}), without the all-to-all traffic of expert parallelism"
    )


def test_the_reasons_give_both_layouts_figures():
    mixtral = plan_model(MIXTRAL, H100x2)
    tp, dp = mixtral.layouts["tp_pp"], mixtral.layouts["dp_ep"]
    assert _layout_reason(mixtral) == (
        f"layout: TP=2 PP=1 holds at least as many KV tokens over the cluster ({tp['kv_cache_tokens_cluster']:,}) as any "
        f"DP x EP layout of its 2 GPUs (DP=2 x TP=1 EP=2: {dp['kv_cache_tokens_cluster']:,}), without the all-to-all "
        "traffic of expert parallelism"
    )
    qwen = plan_model(QWEN3, H100x2)
    tp, dp = qwen.layouts["tp_pp"], qwen.layouts["dp_ep"]
    assert _layout_reason(qwen) == (
        f"layout: DP=2 x TP=4 EP=8 on the same 8 GPUs holds {dp['kv_cache_tokens_cluster'] / tp['kv_cache_tokens_cluster']:.2f}x "
        f"the KV tokens of TP=8 PP=1 ({dp['kv_cache_tokens_cluster']:,} against {tp['kv_cache_tokens_cluster']:,}); "
        "TP=8 past the 4 KV heads caches each head 2 times"
    )
    forced = plan_model(V3, H200x2, PlanOptions(dp=8))
    assert any(r.startswith("forced DP=8, TP=1 per rank (the smallest TP that fits: the most groups): ") for r in forced.reasons)


def test_a_forced_cpu_group_that_does_not_fit_says_no_dp_layout_fits():
    # Mixtral-8x7B over 2 CPU nodes at its full 32,768-token context: each rank's 1 GiB KV cache
    # (VLLM_CPU_KVCACHE_SPACE=1) holds far fewer tokens than one sequence, and a CPU cluster has no
    # other DP layout to offer
    with pytest.raises(PlanError, match="the forced layout does not fit") as err:
        plan_model(MIXTRAL, CPUx2, PlanOptions(dp=2))
    assert err.value.hint == "no DP x EP layout fits this cluster"


def test_dp_layouts_leave_out_the_splits_vllm_refuses_for_block_fp8_experts():
    """Qwen3-235B-A22B-Instruct-2507-FP8 on vLLM 0.29 without expert parallelism: DP x TP splits each
    1,536-wide expert, and only splits of 2 and 4 (768, 384) are multiples of block_n 128; 8 (192)
    and 16 (96) are refused (validate_fp8_block_shape_moe). With expert parallelism, vLLM's default
    for DP here, experts stay whole and every group of 2, 4, 8 or 16 GPUs is listed."""
    from orchestrator.plan.dp_choice import dp_layouts
    from tests.unit.test_fp8_moe_blocks import QWEN

    assert dp_layouts(QWEN, H100x2, PlanOptions(vllm_version="0.29.0", expert_parallel=False)) == [(2, 1), (4, 1), (2, 2)]
    with_ep = dp_layouts(QWEN, H100x2, PlanOptions(vllm_version="0.29.0"))
    assert {dp * tp for dp, tp in with_ep} == {2, 4, 8, 16} and (2, 8) in with_ep and (8, 1) in with_ep


def test_a_rank_tp_vllm_refuses_for_the_model_is_a_dp_problem_too():
    # Qwen3-235B-A22B: 64 attention heads, 4 KV heads (config.json); vLLM splits both by the rank's TP
    assert (QWEN3.heads, QWEN3.kv_heads) == (64, 4)
    assert dp_problem(QWEN3, H200x1, 2, 3) == "TP=3 does not divide the 64 attention heads"
    assert dp_problem(QWEN3, H200x1, 2, 0) == "TP must be at least 1, got 0"
    with pytest.raises(PlanError, match="TP=3 does not divide the 64 attention heads"):
        plan_model(QWEN3, H200x1, PlanOptions(dp=2, tp=3))


def test_a_group_over_nodes_counts_whole_ranks_and_nodes_in_the_json():
    # DeepSeek-V3, DP=16 over 2 x 8 H200: 8 ranks on each node (data_parallel_size_local), 2 nodes, as integers
    dp = plan_model(V3, H200x2).layouts["dp_ep"]
    assert (dp["dp_ranks_per_node"], dp["nodes_per_replica"]) == (8, 2)
    assert type(dp["dp_ranks_per_node"]) is int and type(dp["nodes_per_replica"]) is int
    # one GPU per node: a DP=2 group of Mixtral-8x7B takes 2 nodes, one rank each
    one_gpu = make_shape(gpu_type_name="H200-141GB", gpus_per_node=1, nodes=2)
    pair = plan_model(MIXTRAL, one_gpu, PlanOptions(dp=2)).layouts["dp_ep"]
    assert (pair["dp_ranks_per_node"], pair["nodes_per_replica"], pair["gpus_per_replica"]) == (1, 2, 2)


def test_the_dp_layout_beside_a_forced_tp_x_pp_is_the_automatic_one():
    # --tp 8 --dp 1 force the TP x PP layout; the DP x EP layout shown beside it is the one the automatic choice
    # weighs (any TP, any DP), not one bound by the forced flags
    forced = plan_model(V3, H200x1, PlanOptions(tp=8, dp=1))
    assert (forced.dp, forced.tp) == (1, 8)
    auto = plan_model(V3, H200x1)
    assert forced.layouts["dp_ep"]["tp"] == auto.layouts["dp_ep"]["tp"] == 1
    assert forced.layouts["dp_ep"]["dp"] == auto.layouts["dp_ep"]["dp"] == 8
    # for MLA the choice weighs groups of any size: on 2 nodes the DP=16 group of the automatic plan, not one of TP=8's 8 GPUs
    two_nodes = plan_model(V3, H200x2, PlanOptions(tp=8, dp=1))
    assert (two_nodes.layouts["dp_ep"]["dp"], two_nodes.layouts["dp_ep"]["tp"]) == (plan_model(V3, H200x2).dp, 1) == (16, 1)
