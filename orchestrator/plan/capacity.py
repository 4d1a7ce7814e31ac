"""KV cache capacity as vLLM computes it, per pipeline stage. Pure.

vLLM (v1 ``gpu_worker.determine_available_memory``, 0.32) gives the KV cache

    total_gpu_memory * gpu_memory_utilization
      - weights on this GPU - peak activation of a profiling run - non-torch memory
      - CUDA graph memory estimate (subtracted by default since 0.21)

then ``num_blocks = kv_memory // (block_size * bytes per token)`` per worker, the engine takes
the smallest worker's block count (the tightest PP stage), and logs ``KV cache size: N tokens``
= blocks * block_size and ``Maximum concurrency`` = N / max_model_len.

orch cannot run the profile, so it models the reserve (all figures per GPU):

- non-torch memory: 0.30 GiB, plus 0.25 GiB when the replica spans GPUs (NCCL and custom
  all-reduce buffers). vLLM logged 0.13-0.35 GiB on one GPU and 0.54-0.55 GiB at TP=2.
- peak activation = max(forward pass, sampler warm-up), because the profile runs them one after
  the other:
  - forward: ``max_num_batched_tokens * (3*I/tp + 3*H) * 2`` bytes (gate/up output, activation
    and hidden-size buffers; MoE: top-k experts' ``3*I_moe/tp + H`` each). Fits vLLM's logged
    peaks of 2.07 and 2.99 GiB for Llama-3.1-8B at 20,000 and 29,000 tokens (V0 logs).
  - sampler (last stage only): ``max_num_seqs * vocab * 38.5`` bytes: logits in fp32 plus the
    top-k/top-p sort buffers of the dummy sampler run. 38.5 is fitted to vLLM 0.11 on H100
    (4.76 GiB for vocab 128,256 and 5.56 GiB for 151,936 at 1,024 sequences).
- CUDA graphs: 0.75 GiB (vLLM 0.19+ logs estimates of 0.1-0.84 GiB), 0 with enforce_eager.

``max_num_batched_tokens`` and ``max_num_seqs`` default to vLLM 0.32's API-server values for the
GPU's size (8192/1024 on >= 70 GiB GPUs other than A100, 16384/1024 on >= 160 GiB, else
2048/256). ``kv_cache_gib`` replaces the estimate with a fixed size, as vLLM's
``kv_cache_memory_bytes`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.memory import GIB, kv_bytes_per_token, kv_dtype_bytes, stage_layer_ranges, stage_weight_bytes
from orchestrator.plan.shape import ClusterShape

VLLM_GPU_MEMORY_UTILIZATION = 0.92  # vllm 0.32 config/cache.py: Field(default=0.92)
VLLM_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
NON_TORCH_GIB = 0.30
NON_TORCH_DISTRIBUTED_GIB = 0.25
SAMPLER_BYTES_PER_LOGIT = 38.5
CUDA_GRAPH_GIB = 0.75
CPU_KV_CACHE_GIB = 1.0  # orch's default VLLM_CPU_KVCACHE_SPACE on CPU clusters


@dataclass(frozen=True)
class PlanOptions:
    """What the operator may set; None means "as vLLM would" (or: let the planner choose)."""

    tp: int | None = None
    pp: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    kv_cache_gib: float | None = None
    dtype: str | None = None  # None: the checkpoint's dtype
    kv_cache_dtype: str = "auto"  # "auto" | "fp8"
    block_size: int = VLLM_BLOCK_SIZE
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cuda_graph_gib: float | None = None  # None: CUDA_GRAPH_GIB, or 0 with enforce_eager
    enforce_eager: bool = False
    min_concurrency: float = 1.0  # vLLM refuses to start below one max_model_len sequence


@dataclass(frozen=True)
class StageCapacity:
    """One pipeline stage, per GPU. ``kv_bytes`` < 0 means the stage is short by that much."""

    index: int
    first_layer: int
    layers: int
    weights_bytes: float
    reserve_bytes: float
    kv_bytes: float
    kv_bytes_per_token: float
    kv_tokens: int

    def to_json(self) -> dict:
        return {
            "stage": self.index,
            "layers": [self.first_layer, self.first_layer + self.layers],
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "reserve_gib": round(self.reserve_bytes / GIB, 3),
            "kv_cache_gib": round(self.kv_bytes / GIB, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_tokens,
        }


def vllm_scheduler_defaults(shape: ClusterShape) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.32 picks for its API server on this GPU
    (engine/arg_utils.py ``get_batch_defaults``)."""
    mem = shape.gpu_memory_bytes or 0
    if mem >= 160 * GIB:
        return 16384, 1024
    if mem >= 70 * GIB and "a100" not in shape.gpu_type.lower():
        return 8192, 1024
    return 2048, 256


def activation_bytes_per_token(spec: ModelSpec, tp: int) -> float:
    """Forward-pass buffers per batched token on one TP rank (see the module docstring)."""
    act = 4 if spec.dtype == "fp32" else 2
    widest = 3 * spec.intermediate / tp if (not spec.is_moe or spec.first_k_dense) else 0.0
    if spec.is_moe:
        moe = spec.experts_per_token * (3 * spec.moe_intermediate / tp + spec.hidden)
        moe += spec.shared_experts * 3 * spec.moe_intermediate / tp
        widest = max(widest, moe)
    return (widest + 3 * spec.hidden) * act


def reserve_bytes(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int, last: bool) -> float:
    """Memory vLLM keeps out of the KV cache on one GPU of a stage besides the weights."""
    default_tokens, default_seqs = vllm_scheduler_defaults(shape)
    tokens = options.max_num_batched_tokens or default_tokens
    seqs = options.max_num_seqs or default_seqs
    non_torch = NON_TORCH_GIB + (NON_TORCH_DISTRIBUTED_GIB if tp * pp > 1 else 0.0)
    forward = tokens * activation_bytes_per_token(spec, tp)
    sampler = seqs * spec.vocab * SAMPLER_BYTES_PER_LOGIT if last else 0.0
    if options.cuda_graph_gib is not None:
        graphs = options.cuda_graph_gib
    else:
        graphs = 0.0 if options.enforce_eager else CUDA_GRAPH_GIB
    return non_torch * GIB + max(forward, sampler) + graphs * GIB


def stage_capacities(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int) -> tuple[StageCapacity, ...]:
    """Weights, reserve, KV memory and KV tokens of one GPU in each pipeline stage."""
    dtype = options.dtype or spec.dtype
    s_kv = kv_dtype_bytes(dtype, options.kv_cache_dtype)
    block = options.block_size
    out = []
    for i, (start, end) in enumerate(stage_layer_ranges(spec.layers, pp)):
        first, last = i == 0, i == pp - 1
        weights = stage_weight_bytes(spec, start, end, tp=tp, first=first, last=last, dtype=dtype)
        per_token = kv_bytes_per_token(spec, layers=end - start, tp=tp, s=s_kv)
        if shape.is_cpu:
            reserve = 0.0
            kv = (options.kv_cache_gib if options.kv_cache_gib is not None else CPU_KV_CACHE_GIB) * GIB
        else:
            assert shape.gpu_memory_bytes is not None
            reserve = reserve_bytes(spec, shape, options, tp=tp, pp=pp, last=last)
            if options.kv_cache_gib is not None:
                # vLLM then ignores gpu_memory_utilization; what must fit is the whole device.
                fixed = options.kv_cache_gib * GIB
                room = shape.gpu_memory_bytes - weights - reserve
                kv = fixed if room >= fixed else room - fixed
            else:
                kv = shape.gpu_memory_bytes * options.gpu_memory_utilization - weights - reserve
        tokens = math.floor(kv / (per_token * block)) * block if kv > 0 and per_token > 0 else 0
        out.append(StageCapacity(i, start, end - start, weights, reserve, kv, per_token, tokens))
    return tuple(out)
