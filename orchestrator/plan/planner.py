"""The TP/PP choice: a model on a cluster shape -> ``ParallelPlan`` with its reasons. Pure.

Entry point (what ``orch plan`` and ``orch rollout`` call)::

    plan_model(spec: ModelSpec, shape: ClusterShape, options: PlanOptions = PlanOptions()) -> ParallelPlan

The rule (vLLM's "Parallelism and Scaling" page, the memory formulas and the multi-GPU deployment guide):

1. fits one GPU: TP=1, PP=1;
2. no NVLink inside the node: pipeline parallelism across the node's GPUs (TP=1, smallest PP);
3. fits one node: the smallest TP that divides the attention heads (and the KV heads, or is a
   multiple of them), is at most the GPUs per node, and fits;
4. does not fit a node: TP = GPUs per node, PP = the number of nodes needed (layers split
   unevenly as vLLM does);
5. replicas = how many such groups the cluster holds.

"Fits" means vLLM would start and serve: every stage's weights and reserve leave room for KV
cache, and the KV cache holds at least ``min_concurrency`` sequences of ``max_model_len`` tokens
(vLLM refuses to start below one). The memory model is in ``orchestrator.plan.capacity``. Forced
``tp``/``pp`` are checked (divisibility, GPUs per node, fit) and refused with ``PlanError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from orchestrator.errors import PlanError
from orchestrator.plan.alternatives import alternatives, why_chosen
from orchestrator.plan.capacity import (
    VLLM_BLOCK_SIZE,
    PlanOptions,
    StageCapacity,
    batch_limits,
    cpu_kv_cache_bytes,
    resolved_kv_cache_dtype,
    terms_for,
    utilization,
)
from orchestrator.plan.catalog import DTYPE_BYTES, ModelSpec
from orchestrator.plan.choice import choose_tp_pp, first_fit, fit_suggestions
from orchestrator.plan.dp_choice import best_dp, choose_layout, forced_dp, side_by_side
from orchestrator.plan.dtype_rules import check_dtype, online_quantization, quantization_json, weights_reason
from orchestrator.plan.engine_features import check_features, describe_features, features_json
from orchestrator.plan.engine_terms import parse_vllm_version
from orchestrator.plan.kv_groups import TOKENS_AS_CONCURRENCY, state_page_note
from orchestrator.plan.layout import (
    Candidate,
    evaluate,
    fp8_block_hint,
    idle_gpus,
    replicas_for,
    tp_problem,
    tp_refusal,
    valid_tps,
)
from orchestrator.plan.memory import GIB, count_params, kv_dtype_bytes
from orchestrator.plan.quant_names import check_quantization_names
from orchestrator.plan.shape import ClusterShape, make_shape, shape_from_facts, shape_from_manifest

__all__ = [
    "PLANNED_ENGINE_ARGS", "Candidate", "ClusterShape", "ParallelPlan", "PlanOptions", "evaluate", "make_shape", "plan_model", "tp_problem",
    "replicas_for", "shape_from_facts", "shape_from_manifest",
]  # fmt: skip


# The one mapping from a plan to the vLLM engine arguments that size memory: `orch rollout` renders
# exactly these into Ray Serve LLM's engine_kwargs (and refuses an --engine-arg that would override
# one), so the engine that starts is the one that was planned. (plan field, vLLM argument)
PLANNED_ENGINE_ARGS: tuple[tuple[str, str], ...] = (
    ("tp", "tensor_parallel_size"),
    ("pp", "pipeline_parallel_size"),
    ("dp", "data_parallel_size"),  # only for a DP layout: each rank is one engine (Ray Serve LLM's DPServer)
    ("expert_parallel", "enable_expert_parallel"),  # only when on
    ("max_model_len", "max_model_len"),
    ("gpu_memory_utilization", "gpu_memory_utilization"),
    ("kv_cache_dtype", "kv_cache_dtype"),
    ("max_num_seqs", "max_num_seqs"),
    ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("enforce_eager", "enforce_eager"),
    ("block_size", "block_size"),  # only when set: vLLM picks per attention backend otherwise
    ("online_quantization", "quantization"),  # only when vLLM quantizes an unquantized checkpoint on load
    # only when set: LoRA slots and a speculative config take memory (orchestrator.plan.engine_features)
    ("enable_lora", "enable_lora"),
    ("max_loras", "max_loras"),
    ("max_lora_rank", "max_lora_rank"),
    ("max_cpu_loras", "max_cpu_loras"),
    ("speculative_config", "speculative_config"),
)


@dataclass(frozen=True)
class ParallelPlan:
    """The planner's answer. Memory figures are per GPU; for PP they are the tightest stage's
    (``weights_gib_per_gpu``: the heaviest stage's). ``kv_cache_tokens`` is per replica."""

    model: str
    params: int
    dtype: str
    kv_cache_dtype: str
    tp: int
    pp: int
    replicas: int
    fits: bool
    reasons: tuple[str, ...]
    stage_layers: tuple[int, ...]
    stages: tuple[StageCapacity, ...]
    weights_gib_per_gpu: float
    reserve_gib_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_cache_gib_per_gpu: float
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_gib_fixed: bool
    gpu_type: str
    gpu_memory_gib: float | None
    gpus_per_node: int
    nodes: int
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    suggestions: tuple[str, ...] = ()
    enforce_eager: bool = False
    block_size_set: bool = False
    vllm_version: str = ""
    engine_terms: dict | None = None
    dp: int = 1
    expert_parallel: bool = False
    layouts: dict | None = None  # "tp_pp"/"dp_ep" -> dp_choice.layout_json, side by side for MoE models
    quantization: dict | None = None  # the checkpoint's own (method, scheme, source), None if unquantized
    alternatives: tuple[dict, ...] = ()  # other layouts of the same GPUs, when stages share a node
    online_quantization: str | None = None  # vLLM's --quantization for on-the-fly fp8 of a 16-bit checkpoint
    features: dict | None = None  # LoRA / speculative engine arguments and their memory (engine_features)
    layer_types: str = ""  # "18 sliding-window (128) + 18 full attention"; "" for a plain transformer
    layer_sources: tuple[str, ...] = ()  # the config fields (and vLLM files) the layer types came from
    vllm_lines: dict | None = None  # the two lines one engine will print (orchestrator.plan.planner.predicted_lines)

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def kv_cache_tokens_per_rank(self) -> int:
        """One engine's KV tokens (a DP rank's; the replica's when not data parallel)."""
        return self.kv_cache_tokens // self.dp

    def _planned(self, field: str) -> bool:
        if field == "block_size":
            return self.block_size_set
        if field == "online_quantization":
            return self.online_quantization is not None
        if field == "dp":
            return self.dp > 1
        if field == "expert_parallel":
            return self.expert_parallel
        if field in FEATURE_ARGS:
            return field in (self.features or {}).get("engine_kwargs", {})
        return True

    @property
    def engine_env(self) -> dict[str, str]:
        """Environment the engine needs to behave as planned: the sampler whose warm-up the reserve
        assumed (VLLM_USE_FLASHINFER_SAMPLER, read by vllm/envs.py in 0.11.0, 0.29.0 and 0.32.0)."""
        if self.gpu_type == "cpu" or not self.engine_terms:
            return {}
        return {"VLLM_USE_FLASHINFER_SAMPLER": "1" if self.engine_terms.get("flashinfer_sampler") else "0"}

    def engine_kwargs(self) -> dict:
        """The vLLM engine arguments this plan stands for (for Ray Serve LLM's engine_kwargs)."""
        feature_args = (self.features or {}).get("engine_kwargs", {})
        out: dict = {arg: feature_args[field] if field in FEATURE_ARGS else getattr(self, field)
                     for field, arg in PLANNED_ENGINE_ARGS if self._planned(field)}  # fmt: skip
        if self.kv_cache_gib_fixed and self.gpu_type != "cpu":
            out["kv_cache_memory_bytes"] = int(self.kv_cache_gib_per_gpu * GIB)
        elif self.gpu_type == "cpu":  # a whole size is VLLM_CPU_KVCACHE_SPACE in the runtime env instead
            size = cpu_kv_cache_bytes(self.kv_cache_gib_per_gpu)
            if size is not None:
                out["kv_cache_memory_bytes"] = size
        return out

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "params": self.params,
            "dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "expert_parallel": self.expert_parallel,
            "ep_size": self.tp * self.dp if self.expert_parallel else 1,
            "replicas": self.replicas,
            "gpus_per_replica": self.gpus_per_replica,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "suggestions": list(self.suggestions),
            "stage_layers": list(self.stage_layers),
            "weights_gib_per_gpu": round(self.weights_gib_per_gpu, 3),
            "reserve_gib_per_gpu": round(self.reserve_gib_per_gpu, 3),
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_gib_per_gpu": round(self.kv_cache_gib_per_gpu, 3),
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_tokens_per_rank": self.kv_cache_tokens_per_rank,
            "max_concurrency": round(self.max_concurrency, 2),
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_gib_fixed": self.kv_cache_gib_fixed,
            "gpu_type": self.gpu_type,
            "gpu_memory_gib": None if self.gpu_memory_gib is None else round(self.gpu_memory_gib, 2),
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.nodes,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "block_size": self.block_size,
            "enforce_eager": self.enforce_eager,
            "vllm_version": self.vllm_version,
            "engine_terms": self.engine_terms,
            "quantization": self.quantization,
            "engine_env": self.engine_env,
            "alternatives": list(self.alternatives),
            "stages": [s.to_json() for s in self.stages],
            "engine_kwargs": self.engine_kwargs(),
            "layouts": self.layouts or {},
            **({"features": self.features} if self.features else {}),
            "layer_types": self.layer_types,
            "layer_sources": list(self.layer_sources),
            "vllm_lines": self.vllm_lines,
        }


# the PLANNED_ENGINE_ARGS whose values come from ParallelPlan.features (set only when asked for)
FEATURE_ARGS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "speculative_config")


# ---- checks ----


def _check_options(spec: ModelSpec, options: PlanOptions) -> int:
    if options.gpu_memory_utilization is not None and not 0 < options.gpu_memory_utilization <= 1:
        raise PlanError(f"gpu_memory_utilization must be in (0, 1], got {options.gpu_memory_utilization}")
    for name, value in (("max_num_seqs", options.max_num_seqs), ("max_num_batched_tokens", options.max_num_batched_tokens)):
        if value is not None and not 1 <= value <= 10_000_000:
            raise PlanError(f"--{name.replace('_', '-')} must be between 1 and 10,000,000, got {value}")
    if options.block_size is not None and options.block_size not in (1, 8, 16, 32, 64, 128, 256):
        raise PlanError(f"--block-size must be one of 1, 8, 16, 32, 64, 128, 256 (vLLM's choices), got {options.block_size}")
    if options.kv_cache_gib is not None and options.kv_cache_gib <= 0:
        raise PlanError(f"--kv-cache-gib must be positive, got {options.kv_cache_gib}")
    if options.dtype is not None and options.dtype not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype '{options.dtype}'", hint=f"use one of {', '.join(DTYPE_BYTES)}")
    check_dtype(spec, options.dtype)
    check_features(spec, options.lora, options.speculative)
    if options.kv_cache_dtype not in ("auto", "fp8"):
        raise PlanError(f"unknown kv cache dtype '{options.kv_cache_dtype}'", hint="use auto or fp8")
    length = options.max_model_len or spec.max_position
    if length < 1:
        raise PlanError(f"max_model_len must be positive, got {length}")
    if length > spec.max_position and spec.max_position_set:
        raise PlanError(
            f"max_model_len {length:,} exceeds the model's {spec.max_position:,} positions",
            hint=f"use --max-model-len {spec.max_position} or less (vLLM refuses longer without rope scaling)",
        )
    for name, value in (("tp", options.tp), ("pp", options.pp), ("dp", options.dp)):
        if value is not None and value < 1:
            raise PlanError(f"--{name} must be at least 1, got {value}")
    return length


def _check_forced(spec: ModelSpec, shape: ClusterShape, tp: int | None, pp: int | None, options: PlanOptions) -> None:
    if options.expert_parallel and not spec.is_moe:
        raise PlanError(f"{spec.name} is a dense model: expert parallelism needs an MoE model", hint="leave out --expert-parallel")
    if options.dp is not None and options.dp > 1:
        if not spec.is_moe:
            raise PlanError(
                f"{spec.name} is a dense model: data parallelism is for MoE models (vLLM: not useful for dense models)",
                hint="leave out --dp: a dense model scales by replicas, which the plan counts",
            )
        if (pp or 1) > 1:
            raise PlanError(f"DP={options.dp} with PP={pp}: orch plans DP groups without pipeline parallelism", hint="leave out --pp with --dp")
        return
    if tp is not None:
        problem = tp_problem(spec, tp)
        if problem:
            raise PlanError(problem, hint="choose a TP size that divides the attention heads, or leave --tp out")
        problem = tp_refusal(spec, options, tp)
        if problem:
            raise PlanError(problem, hint=fp8_block_hint(spec))
    if pp is not None and pp > spec.layers:
        raise PlanError(f"PP={pp} exceeds the model's {spec.layers} layers")
    total = shape.total_gpus
    if (tp or 1) * (pp or 1) > total:
        raise PlanError(f"TP x PP = {(tp or 1) * (pp or 1)} GPUs, but the cluster has {total}", hint="lower --tp/--pp or add nodes")
    if shape.is_cpu and ((tp or 1) > 1 or (pp or 1) > 1):
        raise PlanError("on a CPU cluster each replica runs on one node (TP=1, PP=1)", hint="leave out --tp/--pp")


def _terms_reason(spec: ModelSpec, options: PlanOptions) -> str:
    terms = terms_for(spec, options)
    if options.reserve_gib is not None:
        return f"sized for vLLM {options.vllm_version} with the reserve the engine measured on this cluster: {options.reserve_gib:.2f} GiB per GPU"
    graphs = "CUDA graph estimate subtracted" if terms.cuda_graph_subtracted and not options.enforce_eager else "no CUDA graph estimate"
    return (
        f"sized for vLLM {options.vllm_version} ({terms.engine}, sampler warm-up: {terms.sampler}, {graphs}, "
        f"gpu_memory_utilization {utilization(spec, options):g})"
    )


def plan_model(spec: ModelSpec, shape: ClusterShape, options: PlanOptions = PlanOptions()) -> ParallelPlan:
    """Choose TP/PP for ``spec`` on ``shape`` and size the KV cache as vLLM would. Pure.

    Raises ``PlanError`` for invalid options and for a forced ``tp``/``pp`` that vLLM would
    refuse or that does not fit (the message says by how much and what would).
    """
    length = _check_options(spec, options)
    terms_for(spec, options)  # a bad --vllm-version is a PlanError before anything is sized
    _check_forced(spec, shape, options.tp, options.pp, options)
    dp_forced = options.dp is not None and options.dp > 1
    reasons: list[str] = list(shape.notes)
    if not shape.is_cpu:
        reasons.append(_terms_reason(spec, options))
    if spec.layout is not None:
        reasons.append(f"layer types: {spec.layout.describe()}, from {'; '.join(spec.layout.sources)}; "
                       "each type's KV cache is sized as vLLM's KV cache manager sizes it (orchestrator.plan.kv_groups)")
    weights = weights_reason(spec, options)
    if weights:
        reasons.append(weights)
    if (options.dtype or spec.dtype) == spec.dtype:  # names of the checkpoint's quantization config that match nothing
        reasons.extend(check_quantization_names(spec))
    assumption = shape.interconnect_assumption()
    if assumption:
        reasons.append(assumption)
    features = None
    if dp_forced:
        chosen = forced_dp(spec, shape, options, reasons)
    elif shape.is_cpu:
        chosen = evaluate(spec, shape, options, 1, 1)
        whole = cpu_kv_cache_bytes(chosen.tightest.kv_bytes / GIB) is None
        how = "VLLM_CPU_KVCACHE_SPACE" if whole else "kv_cache_memory_bytes: VLLM_CPU_KVCACHE_SPACE takes whole GiB"
        reasons.append(
            f"CPU cluster: one replica per node (Ray Serve LLM keeps a CPU replica on one node); "
            f"KV cache {chosen.tightest.kv_bytes / GIB:.2f} GiB ({how}) = {chosen.kv_tokens:,} tokens"
        )
    elif options.tp is not None or options.pp is not None:
        chosen = _forced(spec, shape, options, reasons)
    else:
        chosen, why = choose_tp_pp(spec, shape, options)
        reasons.extend(why)
        if spec.is_moe and options.dp is None:
            chosen = choose_layout(spec, shape, options, chosen, reasons)
    if dp_forced and not chosen.fits:
        auto, _ = best_dp(spec, shape, replace(options, dp=None, tp=None))
        hint = f"--dp {auto.dp} --tp {auto.tp} would fit: {auto.summary()}" if auto else "no DP x EP layout fits this cluster"
        raise PlanError(f"the forced layout does not fit: {chosen.summary()}", hint=hint)
    suggestions: list[str] = [] if chosen.fits else fit_suggestions(spec, shape, options, chosen)
    if options.tp is not None or options.pp is not None:
        if not chosen.fits:
            raise PlanError(f"the forced layout does not fit: {chosen.summary()}", hint="; ".join(suggestions) or None)
    replicas = replicas_for(shape, chosen.tp, chosen.pp, chosen.dp) if chosen.fits else 0
    alts = () if options.tp is not None or options.pp is not None else alternatives(
        shape, options, chosen, lambda tp, pp, opts: evaluate(spec, shape, opts, tp, pp), lambda tp: tp_problem(spec, tp) is None,
    )  # fmt: skip
    chosen_why = why_chosen(shape, chosen, alts) if chosen.fits else None
    reasons.extend([a.describe() for a in alts] + ([chosen_why] if chosen_why else []))
    if chosen.fits and not shape.is_cpu:
        reasons.append(f"{shape.total_gpus} GPU(s) / {chosen.gpus} per replica = {replicas} replica(s)")
        idle = idle_gpus(shape, chosen.tp, chosen.pp, chosen.dp)
        if idle:
            reasons.append(idle)
    block_note = _block_note(spec, chosen)
    if block_note:
        reasons.append(block_note)
    tp_choice = lambda: choose_tp_pp(spec, shape, replace(options, dp=None, tp=None, pp=None))[0]  # noqa: E731
    layouts = side_by_side(spec, shape, options, chosen, tp_choice)
    tight = chosen.tightest
    if options.lora is not None or options.speculative is not None:
        s_kv = kv_dtype_bytes(options.dtype or spec.dtype, resolved_kv_cache_dtype(spec, options))
        features = features_json(spec, options.lora, options.speculative, tp=chosen.tp, pp=chosen.pp, first_layers=chosen.stages[0].layers,
                                 dtype=options.dtype or spec.dtype, s=s_kv)  # fmt: skip
        reasons.extend(describe_features(options.lora, options.speculative, features))
    tokens, seqs = batch_limits(spec, shape, options)
    terms = terms_for(spec, options)
    dtype = options.dtype or spec.dtype
    return ParallelPlan(
        model=spec.name,
        params=count_params(spec).total,
        dtype=dtype,
        kv_cache_dtype=options.kv_cache_dtype,
        tp=chosen.tp,
        pp=chosen.pp,
        replicas=replicas,
        fits=chosen.fits,
        reasons=tuple(reasons),
        stage_layers=tuple(s.layers for s in chosen.stages),
        stages=chosen.stages,
        weights_gib_per_gpu=max(s.weights_bytes for s in chosen.stages) / GIB,
        reserve_gib_per_gpu=tight.reserve_bytes / GIB,
        kv_bytes_per_token_per_gpu=tight.kv_bytes_per_token,
        kv_cache_gib_per_gpu=tight.kv_bytes / GIB,
        kv_cache_tokens=chosen.kv_tokens,
        max_concurrency=chosen.kv_tokens / length,
        max_model_len=length,
        gpu_memory_utilization=utilization(spec, options),
        kv_cache_gib_fixed=options.kv_cache_gib is not None or shape.is_cpu,
        gpu_type=shape.gpu_type,
        gpu_memory_gib=shape.gpu_memory_gib,
        gpus_per_node=shape.gpus_per_node,
        nodes=shape.nodes,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        block_size=options.block_size or VLLM_BLOCK_SIZE,
        suggestions=tuple(suggestions),
        enforce_eager=options.enforce_eager,
        block_size_set=options.block_size is not None,
        vllm_version=options.vllm_version,
        engine_terms=terms.to_json(),
        dp=chosen.dp,
        expert_parallel=chosen.expert_parallel,
        layouts=layouts,
        quantization=quantization_json(spec) if dtype == spec.dtype else None,
        online_quantization=online_quantization(spec, dtype, options.vllm_version),
        alternatives=tuple(a.to_json() for a in alts),
        features=features,
        layer_types=spec.layout.describe() if spec.layout is not None else "",
        layer_sources=spec.layout.sources if spec.layout is not None else (),
        vllm_lines=predicted_lines(chosen, options),
    )


def _block_note(spec: ModelSpec, chosen: Candidate) -> str | None:
    detail = chosen.tightest.kv_detail
    if spec.layout is None or detail is None:
        return None
    return state_page_note(spec.layout, detail)


def predicted_lines(chosen: Candidate, options: PlanOptions) -> dict:
    """What one engine (one DP rank) will print: ``GPU KV cache size: N tokens`` and ``Maximum
    concurrency for L tokens per request: X`` (vllm/v1/core/kv_cache_utils.py; up to 0.20 the
    size line was blocks x block size, from 0.21 ``int(concurrency x max_model_len)``)."""
    tight = chosen.tightest
    length = chosen.max_model_len
    if tight.concurrency is not None and tight.logged_tokens is not None:
        tokens, concurrency = tight.logged_tokens, tight.concurrency
    else:
        block = options.block_size or VLLM_BLOCK_SIZE
        blocks = tight.kv_tokens // block
        concurrency = blocks / -(-length // block)
        new_form = parse_vllm_version(options.vllm_version) >= TOKENS_AS_CONCURRENCY
        tokens = int(concurrency * length) if new_form else tight.kv_tokens
    return {"kv_cache_size_tokens": tokens, "max_concurrency": round(concurrency, 2), "max_model_len": length}


def _forced(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, reasons: list[str]) -> Candidate:
    ev = lambda tp, pp: evaluate(spec, shape, options, tp, pp)  # noqa: E731
    if options.tp is not None and options.tp > shape.gpus_per_node:
        # Asked for explicitly (the automatic choice never does this): allowed, with a warning.
        reasons.append(
            f"warning: forced TP={options.tp} exceeds the {shape.gpus_per_node} GPU(s) per node, so one tensor-parallel "
            f"group spans {math.ceil(options.tp / shape.gpus_per_node)} nodes and every layer's all-reduce crosses the "
            f"network; --tp {shape.gpus_per_node} with --pp keeps TP inside a node"
        )
    if options.tp is not None and options.pp is not None:
        cand = ev(options.tp, options.pp)
        reasons.append(f"forced TP={options.tp} PP={options.pp}: {cand.summary()}")
        return cand
    if options.tp is not None:
        tp = options.tp
        cands = [ev(tp, p) for p in range(1, min(shape.total_gpus // tp, spec.layers) + 1)]
        found = first_fit(cands) or cands[-1]
        reasons.append(f"forced TP={tp}; the smallest PP that fits is {found.pp}: {found.summary()}")
        return found
    assert options.pp is not None
    pp = options.pp
    # TP=1 is always valid and _check_forced made sure PP <= the cluster's GPUs, so tps holds 1
    tps = valid_tps(spec, min(shape.gpus_per_node, shape.total_gpus // pp))
    cands = [ev(t, pp) for t in tps]
    found = first_fit(cands) or cands[-1]
    reasons.append(f"forced PP={pp}; the smallest TP that fits is {found.tp}: {found.summary()}")
    return found
