"""Each family's layers read from its own config fields, as vLLM's model file reads them; a layer
type orch does not know is refused naming the field; the plan's words fit the model.

The configs are the published ones' fields as public code copies them (sources in
tests/data/planner/SOURCES.md, "configs/" and "Family configs in tests/unit/test_layer_types.py")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.memory import count_params
from orchestrator.plan.planner import plan_model
from orchestrator.plan.seed import kv_formula, seed_tables
from orchestrator.plan.shape import make_shape

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"

# unsloth/Llama-4-Scout-17B-16E text_config, as a Llama 4 port's unit test mirrors it ("Mirror the
# published unsloth/Llama-4-Scout-17B-16E text_config"; no_rope_layers [] = derived from the interval)
SCOUT = {
    "attention_bias": False, "attention_chunk_size": 8192, "head_dim": 128, "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "max_position_embeddings": 262144, "no_rope_layers": [], "num_attention_heads": 40,
    "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "use_qk_norm": True, "vocab_size": 202048, "interleave_moe_layer_step": 1,
    "tie_word_embeddings": False, "model_type": "llama4_text",
}  # fmt: skip
# Maverick: the same text model with 128 experts on every second layer (TensorRT-LLM's
# LLAMA_4_MAVERICK_TWO_LAYER_CONFIG, "Llama4 Maverick config but with only 2 layers": interleave_moe_layer_step 2)
MAVERICK = {**SCOUT, "num_local_experts": 128, "interleave_moe_layer_step": 2, "max_position_embeddings": 1048576}
# nvidia/NVIDIA-Nemotron-Nano-9B-v2 (a memory model's formula tests, "published config.json values")
NEMOTRON_NANO_9B = {
    "model_type": "nemotron_h", "num_hidden_layers": 56, "hidden_size": 4480, "intermediate_size": 15680, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "ssm_state_size": 128, "conv_kernel": 4, "n_groups": 8, "mamba_num_heads": 128, "mamba_head_dim": 80,
}  # fmt: skip
# Falcon-H1 (the same formula tests: attention and SSM side by side in every block)
FALCON_H1 = {
    "model_type": "falcon_h1", "num_hidden_layers": 24, "hidden_size": 2048, "intermediate_size": 4608, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 65537, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_n_groups": 1,
    "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_ssm": 3072,
}  # fmt: skip
# deepseek-ai/DeepSeek-V3.2's architecture fields (a Rust port's deepseek_v32_config(), 4 layers)
DEEPSEEK_V32 = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "index_topk": 2048,
    "index_n_heads": 64, "index_head_dim": 128, "vocab_size": 129280, "torch_dtype": "bfloat16",
}  # fmt: skip


def _spec(cfg: dict, name: str = "m"):
    return spec_from_config(cfg, name, name=name)


def test_gpt_oss_even_layers_are_its_128_token_window():
    spec = _spec(json.loads((CONFIGS / "gpt-oss-20b" / "config.json").read_text()), "gpt-oss-20b")
    assert spec.layout.describe() == "12 sliding-window (128) + 12 full attention"
    assert [c[0].kind for c in spec.layout.caches[:4]] == ["sliding", "full", "sliding", "full"]
    assert "gpt_oss.py" in spec.layout.sources[0]
    assert spec.is_moe and spec.mlp_kind(0) == "m"  # the experts stay MoE on every layer


def test_llama4_rope_layers_are_chunked_and_every_fourth_is_full():
    scout = _spec(SCOUT, "scout")
    assert scout.layout.describe() == "36 chunked-local (8,192) + 12 full attention"
    assert [c[0].kind for c in scout.layout.caches[:4]] == ["chunked", "chunked", "chunked", "full"]
    maverick = _spec(MAVERICK, "maverick")
    # interleave_moe_layer_step 2: layers 1, 3, ... are MoE, the others a dense MLP of intermediate_size_mlp
    assert [maverick.mlp_kind(i) for i in range(4)] == ["d", "m", "d", "m"]
    assert maverick.intermediate == 16384 and maverick.moe_intermediate == 8192
    # Meta publishes Maverick as 400B total parameters (Scout 109B), vision tower included: the text
    # model must come out within 5% below those, never as a uniform-MoE 780B
    assert 0.95 * 388e9 <= count_params(maverick).total <= 400e9
    assert 0.95 * 104e9 <= count_params(scout).total <= 109e9


def test_nemotron_h_pattern_letters_are_its_blocks():
    spec = _spec(NEMOTRON_NANO_9B, "nemotron-nano-9b-v2")
    assert spec.layout.describe() == "27 Mamba2 + 4 full attention"
    assert [spec.mlp_kind(i) for i in range(3)] == ["-", "d", "-"]  # M, -, M: a Mamba block, an MLP block
    # NVIDIA-Nemotron-Nano-9B-v2: 8.89B parameters (its model card); orch counts its blocks one by one
    assert count_params(spec).total == pytest.approx(8.89e9, rel=0.05)


def test_falcon_h1_keeps_attention_and_a_state_in_every_layer():
    spec = _spec(FALCON_H1, "falcon-h1")
    assert spec.layout.describe() == "24 Mamba2 + 24 full attention"
    assert spec.layout.state.bytes_per_gpu(1, 2) > 0


def test_deepseek_v32_caches_an_indexer_key_beside_the_latent():
    spec = _spec(DEEPSEEK_V32, "deepseek-v3.2")
    assert spec.is_mla
    assert spec.layout.indexer_bytes == 132  # index_head_dim 128 fp8 + 128 / 128 x 4 scale bytes (deepseek_v2.py Indexer)
    assert spec.layout.describe() == "4 full attention + 4 sparse-attention indexer"  # (the indexer is in the weights' attention)


def test_mistral_window_without_layer_types_covers_every_layer_and_qwen2s_disabled_one_none():
    mistral = _spec({**_plain("mistral"), "sliding_window": 4096}, "mistral")
    assert mistral.layout.describe() == "32 sliding-window (4,096) + 0 full attention".replace(" + 0 full attention", "")
    qwen2 = json.loads((CONFIGS / "Qwen2-7B-Instruct" / "config.json").read_text())
    assert _spec(qwen2).layout is None  # sliding_window set, use_sliding_window false


def _plain(kind: str) -> dict:
    return {"model_type": kind, "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 32000}  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({**_plain("gemma3_text"), "sliding_window": 1024, "layer_types": ["sliding_attention"] * 31 + ["bidirectional_attention"]}, "layer_types[31]"),
        ({**NEMOTRON_NANO_9B, "hybrid_override_pattern": "M-X" + NEMOTRON_NANO_9B["hybrid_override_pattern"][3:]}, "hybrid_override_pattern[2]"),
        ({**_plain("some_new_hybrid"), "layers_block_type": ["mamba"] * 32}, "'layers_block_type'"),
        ({**_plain("qwen3"), "layer_types": ["full_attention"] * 31 + ["linear_attention"]}, "layer_types[31]"),
    ],
    ids=["gemma-unknown-layer-type", "nemotron-unknown-letter", "unread-family-with-hybrid-field", "qwen3-non-full-layer"],
)
def test_a_layer_type_orch_does_not_know_is_refused_naming_the_field(cfg, field):
    with pytest.raises(ModelSpecError) as err:
        _spec(cfg)
    assert field in str(err.value)


def test_the_kv_formula_line_names_the_formula_of_the_model_in_front_of_it():
    llama = CATALOG["llama3-8b"]
    assert kv_formula(llama, 8192) == "2 * N_layer * H_kv * d * s = 2 * 32 * 8 * 128 * s"
    assert "MLA" not in kv_formula(llama, 8192)
    assert "MLA: one latent per layer" in kv_formula(CATALOG["deepseek-v3"], 8192)
    assert kv_formula(_spec(SCOUT), 8192).startswith("by layer type (36 chunked-local (8,192) + 12 full attention)")


def test_b_max_on_a_replica_counts_every_gpu_of_a_dp_group():
    shape = make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=2)
    plan = plan_model(CATALOG["deepseek-v3"], shape, PlanOptions(dp=16))
    assert plan.gpus_per_replica == 16
    seed = seed_tables(CATALOG["deepseek-v3"], plan, shape.gpu_memory_bytes)
    assert {row["gpus"] for row in seed["b_max"]} == {16}


def test_a_sliding_window_takes_its_window_plus_the_in_flight_tokens_of_the_version():
    # gpt-oss-20b, one GPU, 10 GiB of KV cache, max_model_len 131,072, 8,192 batched tokens, block 16.
    # Page: 16 tokens x 2 x 8 KV heads x 64 x 2 bytes = 32,768 B; 12 sliding + 12 full layers make two
    # groups of 12, so a pool block is 12 pages: 10 GiB // 393,216 B = 27,306 blocks. A request takes
    # cdiv(131072, 16) = 8,192 full-attention blocks plus, for the window (kv_cache_interface.py
    # SlidingWindowSpec), cdiv(min(128 - 1 + in-flight, L), 16) + 1 blocks: in-flight 2 x 8,192 from
    # 0.26 (async scheduling's max_concurrent_batches), 8,192 up to 0.25.
    spec = _spec(json.loads((CONFIGS / "gpt-oss-20b" / "config.json").read_text()), "gpt-oss-20b")
    shape = make_shape(gpu_type_name="H100-80GB", gpus_per_node=1, nodes=1, gpu_memory_gib=1024)
    expected = {"0.29.0": (27306, 8192 + 1033), "0.25.0": (27306, 8192 + 521), "0.20.0": (27306, 8192 + 521)}
    for version, (blocks, per_request) in expected.items():
        opts = PlanOptions(tp=1, pp=1, max_model_len=131072, max_num_batched_tokens=8192, kv_cache_gib=10, vllm_version=version, dtype="bf16")
        plan = plan_model(spec, shape, opts)
        lines = plan.vllm_lines
        assert lines["max_concurrency"] == round(blocks / per_request, 2), version
        # 0.21 on: int(concurrency x L); up to 0.20: blocks // groups x block size
        tokens = int(blocks / per_request * 131072) if version != "0.20.0" else blocks // 2 * 16
        assert lines["kv_cache_size_tokens"] == tokens, version
