"""The TP/PP choice, rule by rule (orchestrator/plan/planner.py's docstring, vLLM's "Parallelism and
Scaling" page, seed 000/001): which layout each branch picks and the reasons it gives.

Every expected layout is worked by hand. To keep that arithmetic exact, the models are small custom
specs and every plan is sized with ``gpu_memory_utilization=1.0`` and a fixed reserve of 1 GiB per
GPU (``reserve_gib``, the calibrated-reserve path), so what a GPU holds is just
``memory - weights - 1 GiB`` and the KV cache must hold one 4,096-token sequence. Margins are kept
at 0.2 GiB or more so that rounding in the hand figures cannot flip a verdict.

MHA24: 40 layers, hidden 3072 (24 heads x 128), 24 KV heads, MLP 8192, vocab 32000, bf16.
  per layer: attention 4 x 3072^2 = 37,748,736 + MLP 3 x 3072 x 8192 = 75,497,472 parameters
  = 113,246,208 x 2 bytes = 0.2109 GiB; 40 layers = 8.44 GiB; embedding and head 32000 x 3072 x 2
  bytes = 0.183 GiB each: the whole model is 8.80 GiB.
  KV per token: 2 (K, V) x 40 layers x 3072 x 2 bytes = 480 KiB; 4,096 tokens = 1.875 GiB.
  Needed per GPU (weights + 1 GiB + KV of one sequence), split over TP:
    TP=1 11.7 GiB, TP=2 6.34, TP=3 4.56, TP=4 3.67; PP=2 (20 layers a stage) 6.34;
    PP=3 (13, 14, 13 layers; the middle stage has no embedding or head) 4.61; PP=4 (10 layers)
    3.76; TP=4 PP=2 2.33.
GQA24: the same with 3 KV heads: TP 2, 4 and 8 break vLLM's KV-head rule (3 is neither a multiple
  nor a divisor of them); 3 and 6 are valid (6 replicates each KV head on two ranks).
  TP=3: 2.52 GiB of weights + 1 + 0.08 KV = 3.60 GiB; TP=6: 1.23 GiB of layers + 0.06 of embedding/head + 1 + 0.08 KV = 2.37 GiB;
  TP=6 PP=2: 0.62 + 0.03 + 1 + 0.04 = 1.69 GiB.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, ModelSpec
from orchestrator.plan.planner import ParallelPlan, plan_model, tp_problem
from orchestrator.plan.shape import ClusterShape, make_shape

MHA24 = ModelSpec("mha-24", 40, 3072, 8192, 24, 24, 128, 32000, max_position=4096)
GQA24 = replace(MHA24, name="gqa-24-3", kv_heads=3)
EXACT = PlanOptions(max_model_len=4096, gpu_memory_utilization=1.0, reserve_gib=1.0)


def gpus(nodes: int, per_node: int, gib: float, nvlink: bool) -> ClusterShape:
    return make_shape(gpu_type_name=None, gpu_memory_gib=gib, gpus_per_node=per_node, nodes=nodes, nvlink=nvlink)


def layout(plan: ParallelPlan) -> tuple[int, int, int, bool]:
    return plan.tp, plan.pp, plan.replicas, plan.fits


def reason(plan: ParallelPlan, start: str) -> str:
    found = [r for r in plan.reasons if r.startswith(start)]
    assert len(found) == 1, (start, plan.reasons)
    return found[0]


# ---- vLLM's TP rule ----


def test_tp_must_divide_the_attention_heads_and_be_a_divisor_or_multiple_of_the_kv_heads():
    assert tp_problem(GQA24, 2) == "TP=2 neither divides nor is a multiple of the 3 KV heads"
    assert tp_problem(GQA24, 5) == "TP=5 does not divide the 24 attention heads"
    assert tp_problem(GQA24, 3) is None
    assert tp_problem(GQA24, 6) is None  # a multiple of the KV heads: each is replicated
    assert tp_problem(GQA24, 0) == "TP must be at least 1, got 0"
    assert [t for t in range(1, 9) if tp_problem(GQA24, t) is None] == [1, 3, 6]


# ---- rule 3: one node, the smallest valid TP that fits, then filling the node ----


def test_tp_that_leaves_gpus_idle_gives_way_to_one_that_fills_the_node_with_as_many_replicas():
    # 8 GPUs of 5 GiB: TP=2 needs 6.34 GiB, TP=3 fits (4.56) but 8 % 3 leaves 2 GPUs idle with 2
    # replicas; TP=4 (3.67) also gives 2 replicas and uses all 8 GPUs.
    plan = plan_model(MHA24, gpus(1, 8, 5, nvlink=True), EXACT)
    assert layout(plan) == (4, 1, 2, True)
    assert reason(plan, "fits one node with the smallest TP that divides the 24 attention heads, TP=3 PP=1")
    assert "TP=4 PP=1 uses every GPU with as many replicas (2)" in reason(plan, "TP=3 PP=1 would leave GPUs idle")
    # Each layout tried is reported once, in the order of the rule.
    order = [r.split(":")[0] for r in plan.reasons[1:]]
    assert order[:3] == ["one GPU is not enough at TP=1 PP=1", "not enough at TP=2 PP=1", "fits one node with the smallest TP that divides the 24 attention heads, TP=3 PP=1"]  # fmt: skip
    assert sum("TP=1 PP=1" in r for r in plan.reasons) == 1
    assert plan.reasons[-1] == "8 GPU(s) / 4 per replica = 2 replica(s)"


def test_filling_is_judged_per_tp_group_of_one_stage():
    # 3 nodes of 4 GPUs: TP=3 leaves one GPU of each node idle (3 replicas); TP=4 fills every node
    # with the same 3 replicas. (Judged as TP=3 x PP=2 the 12 GPUs would look full: they are not.)
    plan = plan_model(MHA24, gpus(3, 4, 5, nvlink=True), EXACT)
    assert layout(plan) == (4, 1, 3, True)
    assert "TP=4 PP=1 uses every GPU with as many replicas (3)" in reason(plan, "TP=3 PP=1 would leave GPUs idle")


def test_filling_takes_the_first_larger_tp_that_fills_not_only_the_largest():
    # 455 heads (5 x 7 x 13) on 14-GPU nodes: valid TP sizes 5, 7 and 13. TP=5 is the smallest that fits
    # and leaves 4 GPUs idle (2 replicas); TP=7 fills the node with the same 2 replicas; TP=13 would not.
    # 10 layers, hidden 3640 (455 x 8), MLP 8192: 0.265 GiB a layer, 3.09 GiB in all with embedding and
    # head, 0.555 GiB KV per 4,096 tokens: TP=1 needs 4.64 GiB of the 2.5, TP=5 1.73, TP=7 1.52.
    wide = ModelSpec("mha-455", 10, 3640, 8192, 455, 455, 8, 32000, max_position=4096)
    plan = plan_model(wide, gpus(1, 14, 2.5, nvlink=True), EXACT)
    assert layout(plan) == (7, 1, 2, True)
    assert "TP=7 PP=1 uses every GPU with as many replicas (2)" in reason(plan, "TP=5 PP=1 would leave GPUs idle")


def test_tp_sizes_the_model_cannot_use_are_named_and_pipeline_stages_take_the_largest_valid_tp():
    # GQA24 on 2 nodes of 8 GPUs of 2 GiB: TP 2, 4, 8 break the KV-head rule; TP=3 and TP=6 do not fit
    # (3.60 and 2.37 GiB), so TP=6 per stage and PP=2 (1.69 GiB): 12 GPUs over 2 nodes, 1 replica.
    plan = plan_model(GQA24, gpus(2, 8, 2, nvlink=True), EXACT)
    assert layout(plan) == (6, 2, 1, True)
    assert (
        reason(plan, "TP sizes ")
        == "TP sizes 2, 4, 8 skipped: TP=2 neither divides nor is a multiple of the 3 KV heads"
    )
    assert reason(plan, "TP=8 is not possible") == "TP=8 is not possible for this model, so TP=6 per pipeline stage"
    assert reason(plan, "does not fit one node").startswith(
        "does not fit one node: TP=6 inside each node, PP=2 across 2 node(s), layers split [20, 20]: TP=6 PP=2:"
    )
    assert reason(plan, "4 of 16 GPU(s) stay idle")


# ---- rule 4: does not fit a node ----


def test_a_model_larger_than_a_node_takes_tp_per_node_and_pp_across_nodes():
    # 2 nodes of 4 GPUs of 3 GiB: TP=4 needs 3.67 GiB; TP=4 PP=2 2.33 GiB on 8 GPUs = 2 nodes.
    plan = plan_model(MHA24, gpus(2, 4, 3, nvlink=True), EXACT)
    assert layout(plan) == (4, 2, 1, True)
    assert reason(plan, "does not fit one node").startswith(
        "does not fit one node: TP=4 inside each node, PP=2 across 2 node(s), layers split [20, 20]: TP=4 PP=2:"
    )
    assert not any("is not possible" in r for r in plan.reasons)  # TP=4 is the whole node


def test_nodes_of_one_gpu_take_the_fewest_pipeline_stages():
    # One GPU per node, no NVLink: nothing inside a node to choose, so rule 4: PP = the nodes needed
    # (2 of the 3: PP=2 needs 6.34 GiB of 8), not a deeper pipeline that fills the third.
    plan = plan_model(MHA24, gpus(3, 1, 8, nvlink=False), EXACT)
    assert layout(plan) == (1, 2, 1, True)
    assert reason(plan, "does not fit one node").startswith(
        "does not fit one node: TP=1 inside each node, PP=2 across 2 node(s)"
    )
    assert not any("the node has no NVLink" in r for r in plan.reasons)


def test_nothing_fits_names_the_largest_layout_tried():
    # 4 nodes of 4 GPUs of 0.5 GiB: the 1 GiB reserve alone is too much. The largest layout tried is
    # TP=4 with PP = 16 / 4 = 4.
    plan = plan_model(MHA24, gpus(4, 4, 0.5, nvlink=True), EXACT)
    assert layout(plan) == (4, 4, 0, False)
    assert reason(plan, "nothing fits").startswith(
        "nothing fits on 4 x 4 0.5GiB-GPU (0.50 GiB each, NVLink); the largest layout: TP=4 PP=4:"
    )


# ---- rule 2: no NVLink inside the node ----


def test_without_nvlink_two_gpus_of_a_node_take_pipeline_stages_not_tp():
    # 2 GPUs of 8 GiB without NVLink: TP=1 needs 11.7 GiB; PP=2 fits (6.34) inside the node.
    plan = plan_model(MHA24, gpus(1, 2, 8, nvlink=False), EXACT)
    assert layout(plan) == (1, 2, 1, True)
    assert reason(plan, "the node has no NVLink").startswith(
        "the node has no NVLink, so pipeline parallelism inside one node (layers split [20, 20]) instead of tensor "
        "parallelism: TP=1 PP=2:"
    )


def test_without_nvlink_pipeline_stages_may_span_nodes():
    # 2 nodes of 2 GPUs of 4.3 GiB: PP=2 needs 6.34, PP=3 4.61, PP=4 3.76 GiB: 4 stages on 2 nodes.
    plan = plan_model(MHA24, gpus(2, 2, 4.3, nvlink=False), EXACT)
    assert layout(plan) == (1, 4, 1, True)
    assert reason(plan, "the node has no NVLink").startswith(
        "the node has no NVLink, so pipeline parallelism across 2 nodes (layers split [10, 10, 10, 10])"
    )


def test_without_nvlink_no_layout_needs_more_gpus_than_the_cluster_has():
    # 2 GPUs of 5 GiB: PP=2 needs 6.34 and TP=2 6.34 GiB. PP=3 (4.61) would fit, but there are only
    # 2 GPUs: the plan does not fit.
    plan = plan_model(MHA24, gpus(1, 2, 5, nvlink=False), EXACT)
    assert plan.fits is False and plan.replicas == 0
    assert plan.tp * plan.pp <= 2
    assert reason(plan, "no NVLink and even PP=2 does not fit").startswith(
        "no NVLink and even PP=2 does not fit: TP=1 PP=2:"
    )


def test_without_nvlink_the_deepest_pipeline_tried_is_named_when_nothing_fits():
    plan = plan_model(MHA24, gpus(1, 4, 1.5, nvlink=False), EXACT)
    assert plan.fits is False
    assert reason(plan, "no NVLink and even").startswith("no NVLink and even PP=4 does not fit: TP=1 PP=4:")
    assert reason(plan, "nothing fits").startswith(
        "nothing fits on 1 x 4 1.5GiB-GPU (1.50 GiB each, no NVLink); the largest layout: TP=4 PP=1:"
    )


def test_a_one_layer_model_that_fits_no_gpu_is_planned_without_error():
    # One layer cannot be split into stages: the no-NVLink branch has no PP to try.
    one_layer = replace(MHA24, name="one-layer", layers=1)
    plan = plan_model(one_layer, gpus(1, 2, 0.5, nvlink=False), EXACT)
    assert plan.fits is False
    assert reason(plan, "no NVLink and even").startswith("no NVLink and even PP=1 does not fit: TP=1 PP=1:")


# ---- forced PP: the smallest TP that fits, TP=1 included ----


def test_forced_pp_keeps_tp_1_when_it_fits():
    plan = plan_model(MHA24, gpus(1, 8, 8, nvlink=True), replace(EXACT, pp=2))
    assert layout(plan) == (1, 2, 4, True)
    assert reason(plan, "forced PP=2").startswith("forced PP=2; the smallest TP that fits is 1:")
    single = plan_model(MHA24, gpus(2, 1, 8, nvlink=False), replace(EXACT, pp=2))
    assert layout(single) == (1, 2, 1, True)


# ---- the reason that names the engine terms ----


@pytest.mark.parametrize(
    ("version", "eager", "expected"),
    [
        # 0.29: V1 with Model Runner V2 for every dense model (from 0.25), CUDA graph estimate
        # subtracted and utilization 0.92 (from 0.21); engine_terms.py's docstring, vllm#38284.
        ("0.29.0", False, "sized for vLLM 0.29.0 (V1 (Model Runner V2), sampler warm-up: mrv2, CUDA graph estimate subtracted, gpu_memory_utilization 0.92)"),
        ("0.29.0", True, "sized for vLLM 0.29.0 (V1 (Model Runner V2), sampler warm-up: mrv2, no CUDA graph estimate, gpu_memory_utilization 0.92)"),
        # 0.20: before the estimate was subtracted (and the 0.92 default); the Triton top-k/top-p
        # sampler is there from 0.18.
        ("0.20.0", False, "sized for vLLM 0.20.0 (V1, sampler warm-up: triton, no CUDA graph estimate, gpu_memory_utilization 0.9)"),
    ],
)  # fmt: skip
def test_the_plan_says_which_engine_terms_it_sized_for(version, eager, expected):
    options = PlanOptions(vllm_version=version, enforce_eager=eager)
    plan = plan_model(CATALOG["llama3-8b"], make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1), options)
    assert plan.reasons[0] == expected


def test_a_measured_reserve_is_named_instead_of_the_engine_terms():
    plan = plan_model(MHA24, gpus(1, 8, 8, nvlink=True), replace(EXACT, reserve_gib=1.23456, vllm_version="0.20.0"))
    assert (
        plan.reasons[0]
        == "sized for vLLM 0.20.0 with the reserve the engine measured on this cluster: 1.23 GiB per GPU"
    )


def test_plan_json_rounds_the_reserve_to_three_decimals():
    plan = plan_model(MHA24, gpus(1, 8, 8, nvlink=True), replace(EXACT, reserve_gib=1.23456))
    assert plan.to_json()["reserve_gib_per_gpu"] == 1.235


def test_forced_tp_that_breaks_the_kv_head_rule_is_refused():
    with pytest.raises(PlanError, match="TP=2 neither divides nor is a multiple of the 3 KV heads"):
        plan_model(GQA24, gpus(1, 8, 8, nvlink=True), replace(EXACT, tp=2))


# ---- what the plan hands on: engine_kwargs and the JSON of `orch plan --json` ----

# MHA24 at TP=4 on 8 GPUs of 5 GiB, worked to the byte:
#   weights per GPU: 40 x 113,246,208 / 4 linear parameters x 2 bytes = 2,264,924,160 B, plus 16-bit
#   norms (40 x 2 x 3072 + 3072 final) and the vocab-parallel embedding and head (2 x 32000 x 3072 / 4)
#   = 49,400,832 x 2 = 98,801,664 B: 2,363,725,824 B = 2.2014 GiB;
#   KV memory: 5 GiB - weights - 1 GiB = 1,931,241,472 B = 1.7986 GiB;
#   KV per token per GPU: 2 x 40 layers x 6 heads x 128 x 2 bytes = 122,880 B; blocks of 16 tokens:
#   floor(1,931,241,472 / 1,966,080) = 982 blocks = 15,712 tokens = 3.836 x 4,096;
#   parameters: 40 x 113,246,208 + 40 x 6144 + 3072 + 2 x 32000 x 3072 = 4,726,705,152;
#   vLLM 0.29's scheduler defaults below 70 GiB: 2048 batched tokens, 256 sequences.
TP4_ENGINE_KWARGS = {
    "tensor_parallel_size": 4,
    "pipeline_parallel_size": 1,
    "max_model_len": 4096,
    "gpu_memory_utilization": 1.0,
    "kv_cache_dtype": "auto",
    "max_num_seqs": 256,
    "max_num_batched_tokens": 2048,
    "enforce_eager": False,
}


def test_engine_kwargs_are_the_planned_vllm_arguments():
    plan = plan_model(MHA24, gpus(1, 8, 5, nvlink=True), EXACT)
    assert plan.engine_kwargs() == TP4_ENGINE_KWARGS  # no block_size: vLLM picks one per attention backend
    sized = plan_model(MHA24, gpus(1, 8, 5, nvlink=True), replace(EXACT, block_size=32))
    assert sized.engine_kwargs() == {**TP4_ENGINE_KWARGS, "block_size": 32}


def test_a_fixed_kv_cache_on_gpus_becomes_kv_cache_memory_bytes():
    # One 16 GiB GPU: 16 - 8.80 - 1 = 6.2 GiB of room holds the fixed 2 GiB (4,368 tokens >= 4,096).
    plan = plan_model(MHA24, gpus(1, 1, 16, nvlink=False), replace(EXACT, kv_cache_gib=2))
    assert plan.fits is True
    assert plan.engine_kwargs()["kv_cache_memory_bytes"] == 2 * 2**30
    cpu = plan_model(
        CATALOG["tiny"],
        make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1),
        PlanOptions(max_model_len=1024, kv_cache_gib=2),
    )
    assert (
        cpu.kv_cache_gib_fixed is True and "kv_cache_memory_bytes" not in cpu.engine_kwargs()
    )  # VLLM_CPU_KVCACHE_SPACE instead


def test_plan_json_carries_every_figure_rounded_as_documented():
    plan = plan_model(MHA24, gpus(1, 8, 5, nvlink=True), EXACT)
    data = plan.to_json()
    stage = {"stage": 0, "layers": [0, 40], "weights_gib": 2.201, "reserve_gib": 1.0, "kv_cache_gib": 1.799,
             "kv_bytes_per_token": 122880, "kv_cache_tokens": 15712}  # fmt: skip
    expected = {
        "model": "mha-24", "params": 4_726_705_152, "dtype": "bf16", "kv_cache_dtype": "auto",
        "tp": 4, "pp": 1, "dp": 1, "expert_parallel": False, "ep_size": 1, "replicas": 2, "gpus_per_replica": 4, "fits": True,
        "reasons": list(plan.reasons), "suggestions": [], "stage_layers": [40],
        "weights_gib_per_gpu": 2.201, "reserve_gib_per_gpu": 1.0, "kv_bytes_per_token_per_gpu": 122880,
        "kv_cache_gib_per_gpu": 1.799, "kv_cache_tokens": 15712, "kv_cache_tokens_per_rank": 15712, "max_concurrency": 3.84,
        "max_model_len": 4096,
        "gpu_memory_utilization": 1.0, "kv_cache_gib_fixed": False, "gpu_type": "5GiB-GPU", "gpu_memory_gib": 5.0,
        "gpus_per_node": 8, "nodes": 1, "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16,
        "enforce_eager": False, "vllm_version": "0.29.0", "stages": [stage], "engine_kwargs": TP4_ENGINE_KWARGS,
        "quantization": None,  # an unquantized checkpoint
        # vLLM 0.29 requires flashinfer and samples with it by default: the rollout says so explicitly
        "engine_env": {"VLLM_USE_FLASHINFER_SAMPLER": "1"},
        "alternatives": [],  # TP inside a node: nothing to weigh against pipeline stages
        "layer_types": "", "layer_sources": [],  # every layer full attention
        # what vLLM 0.29 will print (kv_cache_utils.py get_kv_cache_capacity): 982 blocks over
        # cdiv(4096, 16) = 256 blocks per request = 3.84x, int(3.836 x 4096) = 15,712 tokens
        "vllm_lines": {"kv_cache_size_tokens": 15712, "max_concurrency": 3.84, "max_model_len": 4096},
    }  # fmt: skip
    terms = data.pop("engine_terms")
    layouts = data.pop("layouts")
    assert data == expected
    # a dense model has one kind of layout (data parallelism is for MoE models): the chosen TP x PP, same figures
    assert layouts == {"tp_pp": {
        "layout": "tp_pp", "chosen": True, "tp": 4, "pp": 1, "dp": 1, "expert_parallel": False, "ep_size": 1,
        "gpus_per_replica": 4, "dp_ranks_per_node": None, "nodes_per_replica": 1, "replicas": 2, "fits": True,
        "weights_gib_per_gpu": 2.201, "kv_cache_gib_per_gpu": 1.799, "kv_cache_tokens_per_rank": 15712,
        "kv_cache_tokens": 15712, "kv_cache_tokens_cluster": 31424, "max_concurrency": 3.84, "max_concurrency_cluster": 7.67,
        "summary": layouts["tp_pp"]["summary"],
    }}  # fmt: skip
    assert layouts["tp_pp"]["summary"].startswith("TP=4 PP=1: 2.2 GiB weights")
    assert (terms["engine"], terms["sampler_warmup"], terms["cuda_graph_estimate_subtracted"]) == (
        "V1 (Model Runner V2)",
        "mrv2",
        True,
    )


def test_plan_json_rounds_the_gpu_memory_to_two_decimals():
    # nvidia-smi's 46,068 MiB less the driver's 0.47 GiB: 44.518 GiB, shown as 44.52.
    plan = plan_model(
        CATALOG["llama3-8b"],
        make_shape(gpu_type_name="L40S-48GB", gpus_per_node=1, nodes=1),
        PlanOptions(max_model_len=4096),
    )
    assert plan.to_json()["gpu_memory_gib"] == 44.52
