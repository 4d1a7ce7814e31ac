"""The memory formulas: parameters, weights, KV cache per token, layer split, B_max. Pure.

Parameter count from the architecture: attention (Wq, Wk, Wv, Wo with GQA; MLA projections),
the MLP (SwiGLU: three matrices; MoE: routed + shared experts and the router), token embeddings
and the output head (once when tied), RMSNorm weights (optional: the seed leaves them out).

Two ways to turn parameters into bytes:
- ``weight_bytes(params, dtype)`` is the seed's ``M_w = Psi * s`` (every parameter at ``s``).
- ``stage_weight_bytes`` is what one GPU holds under TP/PP, as vLLM loads it: quantized dtypes
  (fp8/int8/int4) apply to the transformer's linear layers; embeddings, output head and norms
  stay 16-bit (vLLM's quantization methods skip them). Calibrated: Llama-3.3-70B FP8 at TP=2
  gives 33.84 GiB per GPU, vLLM logged 33.88 GiB (docs/planner.md).

KV bytes per token (seed): ``2 * N_layer * H_kv * d * s``. Per GPU under TP the KV heads are
split (``max(1, H_kv / tp)``: replicated when TP exceeds them); MLA caches one latent of
``kv_lora_rank + qk_rope_head_dim`` numbers per layer, the same on every TP rank (vLLM's
MLAAttentionSpec has one KV head and is not sharded). Under PP each stage holds its layers'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.catalog import DTYPE_BYTES, ModelSpec
from orchestrator.plan.modules import head_bytes_per_param, quantized_layer_bytes_per_gpu
from orchestrator.plan.sharding import Sharding, linear_params_per_gpu

GIB = 2**30
KIB = 2**10


@dataclass(frozen=True)
class ParamCount:
    """Parameters by part. ``per_layer_*`` hold the totals over all layers of that part."""

    embedding: int
    lm_head: int
    attention: int
    mlp: int
    norms: int
    towers: int = 0  # a multimodal checkpoint's vision/audio towers and projector

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.attention + self.mlp + self.norms + self.towers

    @property
    def linear(self) -> int:
        """The transformer's linear layers: what weight quantization shrinks."""
        return self.attention + self.mlp


def attention_params(spec: ModelSpec) -> int:
    """One layer's attention projections (Wq, Wk, Wv, Wo; MLA: q_a/q_b, kv_a, kv_b, o)."""
    h = spec.hidden
    if spec.is_mla:
        qk_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            q = h * spec.q_lora_rank + spec.q_lora_rank * spec.heads * qk_dim
        else:
            q = h * spec.heads * qk_dim
        kv_a = h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        kv_b = spec.kv_lora_rank * spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        o = spec.heads * spec.v_head_dim * h
        return q + kv_a + kv_b + o
    q = h * spec.heads * spec.head_dim
    kv = 2 * h * spec.kv_heads * spec.head_dim
    o = spec.heads * spec.head_dim * h
    return q + kv + o


def mlp_params(spec: ModelSpec, layer: int) -> int:
    """One layer's MLP: SwiGLU (gate, up, down = 3 matrices) or MoE experts + router."""
    h = spec.hidden
    kind = spec.mlp_kind(layer)
    m = spec.mlp_matrices
    if kind == "m":
        experts = (spec.num_experts + spec.shared_experts) * m * h * spec.moe_intermediate
        return experts + h * spec.num_experts  # + router
    return m * h * spec.intermediate if kind == "d" else 0


def mixer_params(spec: ModelSpec, layer: int) -> int:
    """One layer's Mamba / linear-attention mixer (0 for an attention-only layer)."""
    return spec.layout.mixer_params if spec.layout is not None and spec.has_mixer(layer) else 0


def norm_params(spec: ModelSpec) -> int:
    """One layer's RMSNorm weights (input + post-attention; MLA adds its q/kv latent norms)."""
    extra = (spec.q_lora_rank + spec.kv_lora_rank) if spec.is_mla else 0
    return 2 * spec.hidden + extra


def count_params(spec: ModelSpec, *, include_norms: bool = True) -> ParamCount:
    """Parameters of the whole model. ``include_norms=False`` is the seed's convention."""
    attention = sum(attention_params(spec) * spec.has_attention(i) + mixer_params(spec, i) for i in range(spec.layers))
    mlp = sum(mlp_params(spec, i) for i in range(spec.layers))
    norms = (spec.layers * norm_params(spec) + spec.hidden) if include_norms else 0
    embedding = spec.vocab * spec.hidden
    lm_head = 0 if spec.tie_embeddings else spec.vocab * spec.hidden
    return ParamCount(embedding=embedding, lm_head=lm_head, attention=attention, mlp=mlp, norms=norms, towers=spec.tower_params)


def weight_bytes(params: int, dtype: str) -> float:
    """Weights: ``M_w = Psi * s``."""
    return params * DTYPE_BYTES[dtype]


def kv_dtype_bytes(model_dtype: str, kv_cache_dtype: str) -> float:
    """Bytes per cached number. ``auto`` follows vLLM: the model's activation dtype, which is
    16-bit for quantized weights (fp8/int8/int4 checkpoints compute in bf16)."""
    if kv_cache_dtype == "fp8":
        return 1
    if kv_cache_dtype != "auto":
        raise ValueError(f"unknown kv cache dtype {kv_cache_dtype!r}")
    return 4 if model_dtype == "fp32" else 2


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    """KV heads one TP rank caches: split across ranks, replicated once TP exceeds them."""
    return max(1, spec.kv_heads // tp)


def kv_bytes_per_token(spec: ModelSpec, *, layers: int | None = None, tp: int = 1, s: float = 2) -> float:
    """KV cache bytes per token on one GPU holding ``layers`` layers (default: all) at TP ``tp``.

    Seed: ``2 * N_layer * H_kv * d * s``; MLA: ``N_layer * (kv_lora_rank + qk_rope_head_dim) * s``.
    """
    n = spec.layers if layers is None else layers
    if spec.is_mla:
        return n * (spec.kv_lora_rank + spec.qk_rope_head_dim) * s
    return 2 * n * kv_heads_per_gpu(spec, tp) * spec.head_dim * s


def kv_bytes(spec: ModelSpec, seq_len: int, batch: int, s: float = 2) -> float:
    """KV cache: ``M_KV = 2 * N_layer * H_kv * d * s * L * B`` for the whole model on one GPU."""
    return kv_bytes_per_token(spec, s=s) * seq_len * batch


def b_max(gpu_bytes: float, weights: float, kv_per_sequence: float) -> int:
    """Largest batch: ``B_max = floor((M_GPU - M_w) / M_KV(L, B=1))`` (0 when the weights do not fit)."""
    if kv_per_sequence <= 0:
        raise ValueError("kv_per_sequence must be positive")
    return max(0, math.floor((gpu_bytes - weights) / kv_per_sequence))


def pp_layer_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage exactly as vLLM's ``get_pp_indices`` splits them.

    Even split; the remainder goes one layer each to the stages before the last, counting back
    from the second-to-last (vllm/distributed/utils.py: ``partitions[-i] += 1`` for i in
    2..remainder+1), because the last stage also holds the final norm and output head.
    """
    if pp < 1 or pp > num_layers:
        raise ValueError(f"pipeline size {pp} must be between 1 and the {num_layers} layers")
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return tuple(parts)


def stage_layer_ranges(num_layers: int, pp: int) -> tuple[tuple[int, int], ...]:
    """(start, end) layer indices of each stage."""
    out, start = [], 0
    for n in pp_layer_split(num_layers, pp):
        out.append((start, start + n))
        start += n
    return tuple(out)


def stage_weight_bytes(spec: ModelSpec, start: int, end: int, *, tp: int, first: bool, last: bool, dtype: str | None = None,
                       dp: int = 1, expert_parallel: bool = False) -> float:  # fmt: skip
    """Weight bytes on one GPU of the stage holding layers [start, end) at TP ``tp`` (in a DP rank of
    ``dp`` when data parallel; the experts over DP x TP, whole when ``expert_parallel``).

    Linear layers at ``dtype`` (default: the spec's); embeddings (first stage), output head and
    final norm (last stage) and per-layer norms at 16 bits (fp32 for an fp32 model). Embedding and
    head are vocab-parallel (split over TP); norms are replicated. A tied head is stored once when
    the first stage is also the last, and loaded again on the last stage otherwise (as vLLM does).
    """
    dtype = dtype or spec.dtype
    s_dense = 4 if dtype == "fp32" else 2
    # How each module is cut over the GPUs (replicated K/V heads past the KV heads, MLA's whole
    # down-projections, the router on every GPU, experts over DP x TP) is orchestrator.plan.sharding's
    sh = Sharding(tp=tp, dp=dp, expert_parallel=expert_parallel)
    if spec.quantization is not None and dtype == spec.dtype:
        # The checkpoint's own quantization, module by module (orchestrator.plan.modules), each
        # module's bytes times the share of it this GPU holds
        linear_bytes = sum(quantized_layer_bytes_per_gpu(spec, i, sh) for i in range(start, end))
    else:
        linear_bytes = sum(linear_params_per_gpu(spec, i, sh) for i in range(start, end)) * DTYPE_BYTES[dtype]
    dense: float = (end - start) * norm_params(spec)
    head = 0.0
    if first:
        dense += spec.vocab * spec.hidden / tp
    if last:
        dense += spec.hidden
        if not (spec.tie_embeddings and first):
            head_quantized = head_bytes_per_param(spec) if dtype == spec.dtype else None
            if head_quantized is None:
                dense += spec.vocab * spec.hidden / tp
            else:
                head = spec.vocab * spec.hidden / tp * head_quantized
    # vLLM builds a multimodal checkpoint's towers on every stage, their linear layers split over TP
    dense += spec.tower_params / tp
    return linear_bytes + dense * s_dense + head


def gib(value: float) -> float:
    return value / GIB
