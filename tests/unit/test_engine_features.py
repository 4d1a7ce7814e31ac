"""LoRA slots and speculative decoding in the plan (issue 43 item 4).

Every expected figure is written out from vLLM 0.32.0's allocation code (the derivation is in each
test's comment), never from orch's functions:

- LoRA: ``create_lora_weights`` of ``MergedQKVParallelLinearWithLoRA`` / ``MergedColumnParallelLinearWithLoRA``
  (column-parallel: per slice A = [max_loras, 1, rank, hidden], B = [max_loras, 1, slice/tp, rank]),
  ``RowParallelLinearWithLoRA`` (A = [max_loras, 1, rank, in/tp], B = [max_loras, 1, hidden, rank]),
  ``VocabParallelEmbeddingWithLoRA`` (A = [max_loras, vocab, rank], B = [max_loras, 1, hidden, rank])
  and ``LogitsProcessorWithLoRA`` (A = [max_loras, 1, rank, hidden], B = [max_loras, 1, vocab, rank]),
  at the model's dtype (``LoRAConfig.lora_dtype: auto``).
- speculative: ``llama_eagle.py`` (decoder layers + ``fc`` ReplicatedLinear(2H, H)), ``llama_eagle3.py``
  (layer 0's qkv from 2H, ``fc`` from 3H, a head of ``draft_vocab_size`` rows, an int64 ``d2t``),
  ``deepseek_mtp.py`` (one DeepSeek decoder layer, ``eh_proj`` nn.Linear(2H, H), enorm/hnorm and the
  shared head's norm; embeddings and head shared with the target, ``llm_base_proposer.py``).
Architectures: the real config.json files in tests/data/planner/configs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, spec_from_config
from orchestrator.plan.engine_features import (
    LoraOptions,
    SpeculativeOptions,
    draft_kv_bytes_per_token,
    draft_weight_bytes,
    lora_bytes_per_gpu,
)
from orchestrator.plan.memory import GIB
from orchestrator.plan.modules import quantized_layer_bytes_per_gpu
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from orchestrator.plan.sharding import Sharding

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"
H100X8 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=8, nodes=1)


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


LLAMA8B = spec_from_config(_config("Llama-3.1-8B-Instruct"), "Llama-3.1-8B-Instruct/config.json", name="llama-3.1-8b")
# hidden 4096, 32 heads x 128, 8 KV heads, intermediate 14336, vocab 128256, 32 layers, bf16
H, Q, KVH, INTER, V, L = 4096, 32 * 128, 8 * 128, 14336, 128256, 32


def _lora_elements_per_slot(rank: int, tp: int) -> int:
    """LoRA elements of ONE slot for Llama-3.1-8B on one GPU at TP=tp, from the shapes above."""
    qkv = 3 * rank * H + rank * (Q // tp + 2 * (KVH // tp))  # 3 A slices [rank, H]; B slices [q/tp | k/tp | v/tp, rank]
    o = rank * (Q // tp) + H * rank  # row-parallel: A [rank, 4096/tp], B [H, rank]
    gate_up = 2 * rank * H + rank * 2 * (INTER // tp)  # 2 A slices [rank, H]; B [INTER/tp, rank] x 2
    down = rank * (INTER // tp) + H * rank  # row-parallel: A [rank, INTER/tp], B [H, rank]
    embed = V * rank + H * rank  # A [vocab, rank] (whole), B [H, rank]
    logits = rank * H + V * rank  # A [rank, H], B [vocab, rank] (whole)
    return L * (qkv + o + gate_up + down) + embed + logits


@pytest.mark.parametrize(("loras", "rank", "tp"), [(1, 16, 1), (4, 64, 1), (8, 32, 2)])
def test_lora_slots_are_vllms_a_and_b_matrices_on_every_module(loras, rank, tp):
    ours = lora_bytes_per_gpu(LLAMA8B, LoraOptions(loras, rank), layers=L, tp=tp, first=True, last=True, dtype="bf16")
    assert ours == loras * _lora_elements_per_slot(rank, tp) * 2  # bf16


def test_four_rank_64_loras_on_llama_8b_take_1_376_gib_out_of_the_kv_cache():
    # 4 slots x 184,713,216 elements x 2 bytes = 1,477,705,728 bytes = 1.376 GiB
    assert 4 * _lora_elements_per_slot(64, 1) * 2 == 1_477_705_728
    base = plan_model(LLAMA8B, H100X8, PlanOptions(tp=1))
    lora = plan_model(LLAMA8B, H100X8, PlanOptions(tp=1, lora=LoraOptions(4, 64)))
    assert lora.weights_gib_per_gpu - base.weights_gib_per_gpu == pytest.approx(1_477_705_728 / GIB)
    assert base.kv_cache_gib_per_gpu - lora.kv_cache_gib_per_gpu == pytest.approx(1_477_705_728 / GIB)
    assert lora.kv_cache_tokens < base.kv_cache_tokens
    kwargs = lora.engine_kwargs()
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 4, 64) and "max_cpu_loras" not in kwargs
    assert "enable_lora" not in base.engine_kwargs()
    assert plan_model(LLAMA8B, H100X8, PlanOptions(tp=1, lora=LoraOptions(4, 64, 16))).engine_kwargs()["max_cpu_loras"] == 16
    assert any(r.startswith("LoRA: 4 slot(s) of rank 64") for r in lora.reasons)


@pytest.mark.parametrize(("lora", "needle"), [
    (LoraOptions(1, 7), "--max-lora-rank must be one of 1, 8, 16"),  # vllm/config/lora.py MaxLoRARanks
    (LoraOptions(4, 16, 2), "--max-cpu-loras (2) must be at least --max-loras (4)"),  # LoRAConfig._validate_lora_config
    (LoraOptions(0, 16), "--max-loras must be at least 1"),
])  # fmt: skip
def test_lora_values_vllm_refuses_are_plan_errors_naming_the_flag(lora, needle):
    with pytest.raises(PlanError) as err:
        plan_model(LLAMA8B, H100X8, PlanOptions(lora=lora))
    assert needle in str(err.value)


def test_lora_on_an_moe_model_is_refused_rather_than_undercounted():
    with pytest.raises(PlanError, match="--enable-lora: orch sizes LoRA slots for dense attention models"):
        plan_model(CATALOG["mixtral-8x7b"], H100X8, PlanOptions(lora=LoraOptions()))


# An EAGLE head for Llama-3.1-8B: the target's architecture with one decoder layer (yuhuili/EAGLE-LLaMA3-Instruct-8B's shape)
EAGLE_HEAD = spec_from_config({**_config("Llama-3.1-8B-Instruct"), "num_hidden_layers": 1}, "eagle/config.json", name="eagle-head")
LAYER = (Q + 2 * KVH) * H + Q * H + 3 * H * INTER  # q, k, v, o and gate/up/down of one layer: 218,103,808 weights


def test_an_eagle_head_is_its_layers_and_fc_with_embeddings_and_head_shared():
    sd = SpeculativeOptions("eagle", 3, "/models/eagle", draft=EAGLE_HEAD)
    # one layer (bf16) + its two norms + fc [H, 2H]
    assert draft_weight_bytes(LLAMA8B, sd, tp=1, dtype="bf16") == (LAYER + 2 * H + 2 * H * H) * 2
    # the draft's attention layer is one more layer of KV: 2 (K, V) x 8 heads x 128 x 2 bytes
    assert draft_kv_bytes_per_token(LLAMA8B, sd, tp=1, s=2) == 2 * 8 * 128 * 2
    # at TP=2 the layer is split, fc is a ReplicatedLinear (whole), KV heads split
    assert draft_weight_bytes(LLAMA8B, sd, tp=2, dtype="bf16") == (LAYER / 2 + 2 * H + 2 * H * H) * 2
    assert draft_kv_bytes_per_token(LLAMA8B, sd, tp=2, s=2) == 2 * 4 * 128 * 2


def test_an_eagle3_head_adds_the_wider_qkv_the_3h_fc_its_own_head_and_the_d2t_map():
    sd = SpeculativeOptions("eagle3", 3, "/models/eagle3", draft=EAGLE_HEAD, draft_vocab=32000)
    expected = (LAYER + 2 * H) * 2  # the layer and its norms
    expected += H * (Q + 2 * KVH) * 2  # layer 0's qkv_proj reads 2H: one more H of inputs
    expected += 3 * H * H * 2  # fc: ReplicatedLinear(3 x target hidden, H)
    expected += 32000 * H * 2  # lm_head: ParallelLMHead(draft_vocab_size, H)
    expected += 32000 * 8  # d2t: int64 [draft_vocab_size]
    assert draft_weight_bytes(LLAMA8B, sd, tp=1, dtype="bf16") == expected


def test_deepseek_v3_mtp_is_one_more_decoder_layer_with_eh_proj_and_one_more_mla_kv_layer():
    spec = CATALOG["deepseek-v3"]
    sd = SpeculativeOptions("mtp", 1)
    h = 7168
    layer = quantized_layer_bytes_per_gpu(spec, 60, Sharding(tp=8))  # the MTP block is a DeepSeek MoE layer, FP8 like the rest
    norms = 2 * h + 1536 + 512 + 3 * h  # the layer's norms (input, post-attention, q_a, kv_a) + enorm, hnorm, shared_head.norm
    assert draft_weight_bytes(spec, sd, tp=8, dtype="fp8") == pytest.approx(layer + norms * 2 + 2 * h * h * 2)
    assert draft_kv_bytes_per_token(spec, sd, tp=8, s=2) == (512 + 64) * 2  # one MLA latent per token, not split by TP
    plan = plan_model(spec, make_shape(gpu_type_name="H200-141GB", gpus_per_node=8, nodes=1), PlanOptions(tp=8, speculative=sd))
    assert plan.engine_kwargs()["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert plan.kv_bytes_per_token_per_gpu == 62 * (512 + 64) * 2  # 61 layers + the MTP layer


def test_a_draft_model_is_a_whole_second_model_and_ngram_takes_nothing():
    target = spec_from_config(_config("Qwen3-32B"), "Qwen3-32B/config.json", name="qwen3-32b")
    draft = spec_from_config(_config("Qwen3-0.6B"), "Qwen3-0.6B/config.json", name="qwen3-0.6b")
    # Qwen3-0.6B: 28 layers of hidden 1024, 16 heads x 128, 8 KV heads, intermediate 3072; tied
    # embeddings of 151,936 x 1024, so the head is the embedding; norms 2 x 1024 per layer + the final
    # one, and Qwen3's q_norm/k_norm (128 each per layer), which orch leaves out (28 x 256 weights)
    layer = 1024 * (16 * 128 + 2 * 8 * 128) + 16 * 128 * 1024 + 3 * 1024 * 3072
    params = 28 * (layer + 2 * 1024 + 2 * 128) + 151936 * 1024 + 1024
    sd = SpeculativeOptions("draft_model", 4, "/models/qwen3-0.6b", draft=draft)
    assert draft_weight_bytes(target, sd, tp=1, dtype="bf16") == pytest.approx(params * 2, rel=1e-4)
    assert draft_kv_bytes_per_token(target, sd, tp=1, s=2) == 28 * 2 * 8 * 128 * 2
    ngram = SpeculativeOptions("ngram", 5)
    assert draft_weight_bytes(target, ngram, tp=1, dtype="bf16") == 0 and draft_kv_bytes_per_token(target, ngram, tp=1, s=2) == 0
    plan = plan_model(target, H100X8, PlanOptions(tp=1, speculative=ngram))
    assert plan.engine_kwargs()["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5}


@pytest.mark.parametrize(("spec", "sd", "needle"), [
    (LLAMA8B, SpeculativeOptions("mtp", 1), "--speculative-method mtp: llama-3.1-8b (llama) has no MTP layers"),
    (LLAMA8B, SpeculativeOptions("eagle", 3), "--speculative-method eagle needs --speculative-model"),
    (LLAMA8B, SpeculativeOptions("ngram", 3, "/models/x"), "--speculative-model: --speculative-method ngram takes no draft model"),
    (LLAMA8B, SpeculativeOptions("draft_model", 3, "/m", draft=CATALOG["qwen2.5-7b"]), "the draft's vocabulary (152,064) differs"),
    (LLAMA8B, SpeculativeOptions("eagle", 0, "/m", draft=EAGLE_HEAD), "--num-speculative-tokens must be at least 1"),
])  # fmt: skip
def test_speculative_configs_vllm_refuses_are_plan_errors_naming_the_flag(spec, sd, needle):
    with pytest.raises(PlanError) as err:
        plan_model(spec, H100X8, PlanOptions(speculative=sd))
    assert needle in str(err.value)
