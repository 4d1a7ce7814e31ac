"""KV cache capacity as vLLM computes it, per pipeline stage. Pure.

vLLM (V1 ``gpu_worker.determine_available_memory``) gives the KV cache

    total_gpu_memory * gpu_memory_utilization
      - weights on this GPU - peak activation of a profiling run - non-torch memory
      - CUDA graph memory estimate (subtracted by default since 0.21)

then ``num_blocks = kv_memory // (block_size * bytes per token)`` per worker, the engine takes
the smallest worker's block count (the tightest PP stage), and logs ``KV cache size: N tokens``
= blocks * block_size and ``Maximum concurrency`` = N / max_model_len.

orch cannot run the profile, so it models the reserve (all figures per GPU); what changes with
the vLLM version is in ``orchestrator.plan.engine_terms``:

- non-torch memory: 0.30 GiB, plus 0.25 GiB when the replica spans GPUs (NCCL and custom
  all-reduce buffers). vLLM logged 0.13-0.35 GiB on one GPU and 0.54-0.55 GiB at TP=2.
- peak activation = max(forward pass, sampler warm-up), because the profile runs them one after
  the other:
  - forward: ``max_num_batched_tokens * (3*I/tp + 3*H) * 2`` bytes (gate/up output, activation
    and hidden-size buffers; MoE: top-k experts' ``3*I_moe/tp + H`` each, plus ``3*I_moe/tp`` per
    shared expert, in place of ``3*I/tp``, whose dense MLP only counts when the model has dense
    layers (DeepSeek's ``first_k_dense``): then the wider of the two; 4 bytes instead of 2 for an
    fp32 model). Fits vLLM's logged peaks of 2.07 and 2.99 GiB for Llama-3.1-8B at 20,000 and
    29,000 tokens (V0 logs).
  - sampler (last stage only): ``max_num_seqs * vocab * bytes per logit``, the bytes depending on
    the version's top-k/top-p path (38.5 for PyTorch's sort, fitted to vLLM 0.11's 4.76 / 5.56 GiB
    at 1,024 sequences for vocab 128,256 / 151,936).
- pipeline buffers (PP > 1): ``max_num_batched_tokens * H * 18.7`` bytes, fitted to one PP=2 log.
- CUDA graphs: subtracted from 0.21 on (0.36 GiB, the estimate vLLM 0.27.1 logged), 0 with
  enforce_eager or before 0.21.

``max_num_batched_tokens`` and ``max_num_seqs`` default to the version's API-server values
(``EngineTerms.batch_defaults``). ``kv_cache_gib`` replaces the estimate with a fixed size, as
vLLM's ``kv_cache_memory_bytes`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.engine_features import LoraOptions, SpeculativeOptions, feature_bytes
from orchestrator.plan.engine_terms import CUDA_GRAPH_GIB, GPU_EXTRA_VLLM, EngineTerms, engine_terms, parse_vllm_version
from orchestrator.plan.kv_groups import KvSizing, size_kv
from orchestrator.plan.memory import (
    GIB,
    kv_bytes_per_token,
    kv_dtype_bytes,
    stage_layer_ranges,
    stage_weight_bytes,
)
from orchestrator.plan.shape import ClusterShape
from orchestrator.plan.sharding import Sharding

VLLM_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
NON_TORCH_GIB = 0.30
NON_TORCH_DISTRIBUTED_GIB = 0.25
# Pipeline stages hold send/receive buffers of a whole batch's hidden states (and residual) besides
# the profile's activations: fitted to vLLM 0.27.1's Qwen3-32B at PP=2 (row N of
# tests/data/planner/vllm_logs.json: 6.92 GiB of KV cache where TP=2 on the same GPUs left 8.22).
PP_BYTES_PER_TOKEN_HIDDEN = 18.7
CPU_KV_CACHE_GIB = 1.0  # orch's default VLLM_CPU_KVCACHE_SPACE on CPU clusters


def cpu_kv_cache_bytes(gib: float) -> int | None:
    """The ``kv_cache_memory_bytes`` a CPU engine is given for a KV cache of ``gib`` GiB; None for a
    whole number of GiB, which goes as ``VLLM_CPU_KVCACHE_SPACE``. vLLM's CPU platform reads the
    variable as whole GiB (``int()`` in ``check_and_update_config``, vllm/platforms/cpu.py, 0.32)
    and, when it is set and not empty,
    puts it in place of the engine's ``kv_cache_memory_bytes``; the CPU worker takes
    ``kv_cache_memory_bytes`` as the explicit size otherwise (``determine_available_memory`` in
    vllm/v1/worker/cpu_worker.py). A whole size keeps the variable; a fraction (0.25 GiB) goes as
    the engine argument, with the variable left out (``serve.config`` refuses a manifest that
    sets it, and an empty value would stop the engine, vllm/envs.py reads it with ``int()``)."""
    return None if gib >= 1 and float(gib).is_integer() else int(gib * GIB)


@dataclass(frozen=True)
class PlanOptions:
    """What the operator may set; None means "as vLLM would" (or: let the planner choose)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None  # data-parallel ranks per group; None: the planner chooses (MoE models only)
    expert_parallel: bool | None = None  # None: on for DP layouts of MoE models, off otherwise
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # None: the vLLM version's default
    kv_cache_gib: float | None = None
    dtype: str | None = None  # None: the checkpoint's dtype
    kv_cache_dtype: str = "auto"  # "auto" | "fp8"
    block_size: int | None = None  # None: vLLM's default (16)
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cuda_graph_gib: float | None = None  # None: CUDA_GRAPH_GIB, or 0 with enforce_eager
    enforce_eager: bool = False
    min_concurrency: float = 1.0  # vLLM refuses to start below one max_model_len sequence
    vllm_version: str = GPU_EXTRA_VLLM
    flashinfer_sampler: bool | None = None  # True/False: the sampler the engine is told to use; None: the version's default
    reserve_gib: float | None = None  # a measured reserve per GPU (calibration) instead of the model
    lora: LoraOptions | None = None  # LoRA slots vLLM allocates at load (orchestrator.plan.engine_features)
    speculative: SpeculativeOptions | None = None  # the draft's weights and KV layers (same module)
    enable_prefix_caching: bool | None = None  # None: vLLM's default (on; for Mamba hybrids from 0.26, kv_groups)


def terms_for(spec: ModelSpec, options: PlanOptions) -> EngineTerms:
    """The engine terms of the vLLM version the plan is for."""
    return engine_terms(
        parse_vllm_version(options.vllm_version), architecture=spec.architecture, is_moe=spec.is_moe,
        flashinfer_sampler=options.flashinfer_sampler,
    )  # fmt: skip


def utilization(spec: ModelSpec, options: PlanOptions) -> float:
    """gpu_memory_utilization as given, else the version's default (0.92 from 0.21, 0.90 before)."""
    if options.gpu_memory_utilization is not None:
        return options.gpu_memory_utilization
    return terms_for(spec, options).gpu_memory_utilization


def batch_limits(spec: ModelSpec, shape: ClusterShape, options: PlanOptions) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): as given, else the version's API-server defaults."""
    length = options.max_model_len or spec.max_position
    tokens, seqs = terms_for(spec, options).batch_defaults(shape.gpu_memory_bytes or 0, shape.gpu_type, length, multimodal=spec.tower_params > 0)
    return options.max_num_batched_tokens or tokens, options.max_num_seqs or seqs


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
    # vLLM's "Maximum concurrency" and "GPU KV cache size" lines for this stage's engine (layer-type
    # aware: orchestrator.plan.kv_groups); None for a plain transformer, where they are kv_tokens / L and kv_tokens
    concurrency: float | None = None
    logged_tokens: int | None = None
    kv_detail: KvSizing | None = None

    def to_json(self) -> dict:
        extra = {} if self.kv_detail is None else {"kv_groups": self.kv_detail.to_json()}
        return {
            **extra,
            "stage": self.index,
            "layers": [self.first_layer, self.first_layer + self.layers],
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "reserve_gib": round(self.reserve_bytes / GIB, 3),
            "kv_cache_gib": round(self.kv_bytes / GIB, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_tokens": self.kv_tokens,
        }


def activation_bytes_per_token(spec: ModelSpec, tp: int, *, dp: int = 1, expert_parallel: bool = False) -> float:
    """Forward-pass buffers per batched token on one GPU (see the module docstring).

    Data parallel: the MoE layers gather every DP rank's tokens before the experts
    (``AgRsAll2AllManager.dispatch`` all-gathers hidden states over the DP group,
    ``distributed/device_communicators/all2all.py``; the profile runs ``max_num_batched_tokens`` on
    every rank), so their buffers hold ``dp`` times the rank's tokens; with expert parallelism a GPU's
    experts are whole, so their intermediate width is ``moe_intermediate``, not split by TP."""
    act = 4 if spec.dtype == "fp32" else 2
    dense_layers = not spec.is_moe or spec.first_k_dense or (spec.layout is not None and "d" in spec.layout.mlp)
    widest = 3 * spec.intermediate / tp if dense_layers else 0.0
    if spec.is_moe:
        sh = Sharding(tp=tp, dp=dp, expert_parallel=expert_parallel)
        width = spec.moe_intermediate if (expert_parallel and sh.moe_ranks > 1) else spec.moe_intermediate / sh.moe_ranks
        moe = dp * spec.experts_per_token * (3 * width + spec.hidden)
        moe += spec.shared_experts * 3 * spec.moe_intermediate / (1 if sh.sequence_parallel_moe else tp)
        widest = max(widest, moe)
    return (widest + 3 * spec.hidden) * act


def reserve_bytes(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int, last: bool,
                  dp: int = 1, expert_parallel: bool = False) -> float:  # fmt: skip
    """Memory vLLM keeps out of the KV cache on one GPU of a stage besides the weights."""
    if options.reserve_gib is not None:
        return options.reserve_gib * GIB
    terms = terms_for(spec, options)
    tokens, seqs = batch_limits(spec, shape, options)
    non_torch = NON_TORCH_GIB + (NON_TORCH_DISTRIBUTED_GIB if tp * pp * dp > 1 else 0.0)
    forward = tokens * activation_bytes_per_token(spec, tp, dp=dp, expert_parallel=expert_parallel)
    sampler = seqs * spec.vocab * terms.sampler_bytes_per_logit if last else 0.0
    pipeline = tokens * spec.hidden * PP_BYTES_PER_TOKEN_HIDDEN if pp > 1 else 0.0
    if options.cuda_graph_gib is not None:
        graphs = options.cuda_graph_gib
    else:
        graphs = CUDA_GRAPH_GIB if terms.cuda_graph_subtracted and not options.enforce_eager else 0.0
    return non_torch * GIB + max(forward, sampler) + pipeline + graphs * GIB


def resolved_kv_cache_dtype(spec: ModelSpec, options: PlanOptions) -> str:
    """vLLM's ``auto`` KV cache dtype becomes fp8 for a checkpoint that says so (ModelOpt's
    ``kv_cache_quant_algo: FP8``; ``vllm/utils/torch_utils.py resolve_kv_cache_dtype_string``)."""
    quant = spec.quantization
    if options.kv_cache_dtype == "auto" and quant is not None and quant.kv_cache_dtype and options.dtype in (None, spec.dtype):
        return quant.kv_cache_dtype
    return options.kv_cache_dtype


def stage_capacities(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int,
                     dp: int = 1, expert_parallel: bool = False) -> tuple[StageCapacity, ...]:  # fmt: skip
    """Weights, reserve, KV memory and KV tokens of one GPU in each pipeline stage (of one DP rank:
    every rank of a DP group is sized the same, its KV cache is its own)."""
    dtype = options.dtype or spec.dtype
    s_kv = kv_dtype_bytes(dtype, resolved_kv_cache_dtype(spec, options))
    block = options.block_size or VLLM_BLOCK_SIZE
    out = []
    for i, (start, end) in enumerate(stage_layer_ranges(spec.layers, pp)):
        first, last = i == 0, i == pp - 1
        weights = stage_weight_bytes(spec, start, end, tp=tp, first=first, last=last, dtype=dtype, dp=dp, expert_parallel=expert_parallel)
        per_token = kv_bytes_per_token(spec, layers=end - start, tp=tp, s=s_kv)
        if options.lora is not None or options.speculative is not None:  # LoRA slots, the draft (on the last stage)
            extra_weights, extra_kv = feature_bytes(spec, options.lora, options.speculative, layers=end - start, tp=tp,
                                                    first=first, last=last, dtype=dtype, s=s_kv)  # fmt: skip
            weights, per_token = weights + extra_weights, per_token + extra_kv
        if shape.is_cpu:
            reserve = 0.0
            kv = (options.kv_cache_gib if options.kv_cache_gib is not None else CPU_KV_CACHE_GIB) * GIB
        else:
            assert shape.gpu_memory_bytes is not None
            reserve = reserve_bytes(spec, shape, options, tp=tp, pp=pp, last=last, dp=dp, expert_parallel=expert_parallel)
            if options.kv_cache_gib is not None:
                # vLLM then ignores gpu_memory_utilization; what must fit is the whole device.
                fixed = options.kv_cache_gib * GIB
                room = shape.gpu_memory_bytes - weights - reserve
                kv = fixed if room >= fixed else room - fixed
            else:
                kv = shape.gpu_memory_bytes * utilization(spec, options) - weights - reserve
        if spec.layout is not None:
            out.append(_layered_stage(spec, shape, options, i, start, end, weights, reserve, kv, tp=tp, pp=pp, s_kv=s_kv))
            continue
        tokens = math.floor(kv / (per_token * block)) * block if kv > 0 and per_token > 0 else 0
        out.append(StageCapacity(i, start, end - start, weights, reserve, kv, per_token, tokens))
    return tuple(out)


# vLLM 0.32's CPU platform sets block_size 128 when none is given (16 for its MLA kernel;
# check_and_update_config, vllm/platforms/cpu.py); CUDA keeps CacheConfig's 16
CPU_BLOCK_SIZE = 128


def _default_block(spec: ModelSpec, shape: ClusterShape) -> int:
    return CPU_BLOCK_SIZE if shape.is_cpu and not spec.is_mla else VLLM_BLOCK_SIZE


def _layered_stage(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, index: int, start: int, end: int, weights: float,
                   reserve: float, kv: float, *, tp: int, pp: int, s_kv: float) -> StageCapacity:  # fmt: skip
    """A stage of a model whose layers cache different things, sized group by group as vLLM does."""
    layout = spec.layout
    assert layout is not None
    length = options.max_model_len or spec.max_position
    attn = kv_bytes_per_token(spec, layers=1, tp=tp, s=s_kv)
    full = attn
    if layout.global_head_dim:  # Gemma 4: the full-attention layers' own KV heads and head size
        heads = max(1, (layout.global_kv_heads or spec.kv_heads) // tp)
        full = 2 * heads * layout.global_head_dim * s_kv
    state = layout.state.bytes_per_gpu(tp, 4 if (options.dtype or spec.dtype) == "fp32" else 2) if layout.state else 0
    tokens_cap, _ = batch_limits(spec, shape, options)
    sizing = size_kv(
        layout, start, end, attn_token_bytes=attn, global_token_bytes=full, state_bytes=state,
        indexer_token_bytes=layout.indexer_bytes, available=kv, max_model_len=length, max_num_batched_tokens=tokens_cap,
        block_size=options.block_size or _default_block(spec, shape), block_size_set=options.block_size is not None,
        version=parse_vllm_version(options.vllm_version), pp=pp, mla=spec.is_mla, gpu=not shape.is_cpu,
        enable_prefix_caching=options.enable_prefix_caching,
    )  # fmt: skip
    return StageCapacity(index, start, end - start, weights, reserve, kv, sizing.bytes_per_token, sizing.tokens,
                         sizing.concurrency, sizing.logged_tokens, sizing)  # fmt: skip
