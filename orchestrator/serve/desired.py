"""What a rollout deploys: the desired Serve application, from a plan or a recorded revision.

``desired_from_plan``: where the model is (``serve.location``) + the pipeline's ParallelPlan ->
rendered Serve app (stage pins from the free GPUs Ray reports). ``desired_from_revision``: a
recorded revision's stored config (orch rollback). Each returns a factory (Ray's node list, the
nodes' cores -> ``Desired``) that the rollout workflow calls once it has read the cluster.
Pure: the I/O before them (building the demo model, reading config.json files, the calibration
record and the recorded revisions) is ``workflows.desired``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.bench.goodput import Goodput
from orchestrator.cluster.node_state import current_by_name
from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import PlanError, ServeConfigError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.calibration import model_fingerprint
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.engine_features import LoraOptions, SpeculativeOptions
from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM
from orchestrator.plan.planner import PLANNED_ENGINE_ARGS, ParallelPlan
from orchestrator.plan.shape import ClusterShape
from orchestrator.serve.config import AppTarget, RenderedApp, ServeDefaults, ServingPlan, render_app, serve_in_flight
from orchestrator.serve.decisions import public_app_name
from orchestrator.serve.in_flight import SOURCE_FLAG, SOURCE_MANIFEST
from orchestrator.serve.location import ModelLocation
from orchestrator.serve.lora import LoraAdapter, check_adapters, with_adapters
from orchestrator.serve.node_hooks import uses_hooks
from orchestrator.serve.placement import ray_accelerator_type, stage_nodes_for
from orchestrator.serve.scaling import autoscaling_for
from orchestrator.serve.shapes import llm_configs


@dataclass(frozen=True)
class Desired:
    """What should serve: a rendered app (placeholder key) and what it came from."""

    model: str
    served_name: str
    model_source: str
    rendered: RenderedApp
    plan: dict
    weights_gib_per_node: float | None = None
    rollback_of: int | None = None  # the revision whose config this is (orch rollback)


@dataclass(frozen=True)
class RolloutRequest:
    """`orch rollout` flags: the model and what is forwarded to the planner."""

    model: str
    served_name: str | None = None
    model_path: str | None = None  # the folder on the nodes, when --model is a catalog name
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None  # data-parallel ranks per group (PlanOptions.dp); None: the planner chooses
    expert_parallel: bool | None = None  # PlanOptions.expert_parallel
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_gib: float | None = None
    dtype: str | None = None
    kv_cache_dtype: str = "auto"
    replicas: int | None = None
    engine_args: tuple[tuple[str, Any], ...] = ()
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    block_size: int | None = None
    vllm_version: str | None = None  # None: the planner's default (the gpu extra's pin)
    flashinfer_sampler: bool | None = None  # None: the version's default (engine_terms.default_flashinfer_sampler)
    request_router: str | None = None  # None: the manifest's serve.request_router
    max_ongoing_requests: int | None = None  # Serve's cap per replica; None: the manifest's, else the engine's batch
    lora: LoraOptions | None = None  # PlanOptions.lora: LoRA slots, rendered as enable_lora/max_loras/...
    speculative: SpeculativeOptions | None = None  # PlanOptions.speculative: rendered as speculative_config
    # --lora NAME=SOURCE: adapters served on the base (serve.lora), rendered as runtime adapters or
    # vLLM's lora_modules (serve/lora.py); they imply LoRA slots (``lora`` None: one per adapter,
    # vLLM's default rank; `orch rollout` passes the running engine's slots instead: workflows/desired.py)
    adapters: tuple[LoraAdapter, ...] = ()


def _free_gpus(manifest: Manifest, nodes: list, use_total: bool) -> dict[str, float]:
    current = current_by_name(nodes)
    out: dict[str, float] = {}
    for spec in manifest.nodes:
        state = current.get(spec.name)
        if state is None or not state.alive:
            continue
        out[spec.name] = state.gpus_total if use_total else state.resources_available.get("GPU", 0.0)
    return out


def accelerator_type_for(manifest: Manifest, nodes: list) -> tuple[str | None, str | None]:
    """Ray's accelerator type for the cluster's GPUs, and a note when it is left out.

    Serve LLM adds ``accelerator_type:X`` to every bundle; Ray registers that resource only on
    nodes where it detected such GPUs itself, so orch sets it only when the nodes have it."""
    if manifest.accelerator == "cpu":
        return None, None
    types = {ray_accelerator_type(n.gpu_type) for n in manifest.nodes if n.gpus}
    types.discard(None)
    if len(types) != 1:
        return None, "mixed or unknown GPU types: accelerator_type left out"
    accel = types.pop()
    if not nodes:
        return accel, None
    key = f"accelerator_type:{accel}"
    if any(key in getattr(n, "resources_total", {}) for n in nodes):
        return accel, None
    return None, f"Ray reports no {key} resource on the nodes: accelerator_type left out"


# (model, tp, pp) -> (the per-replica goodput recorded for them, a note): workflows.plan.recorded_goodput
CapacityLookup = Callable[[Any, int, int], "tuple[Goodput | None, str | None]"]


def plan_options(request: RolloutRequest) -> PlanOptions:
    """The planner's options from `orch rollout`'s flags; an --engine-arg that sizes memory is
    refused (the plan must know it: it has its own flag)."""
    planned = {arg: flag for flag, arg in PLANNED_ENGINE_ARGS}
    for key, _ in request.engine_args:
        if key == "lora_modules":
            raise UsageError("--engine-arg lora_modules: orch renders the adapters itself",
                             hint="give each adapter with --lora NAME=SOURCE (a folder on the nodes or s3://bucket/prefix)")  # fmt: skip
        if key in planned:
            flag = {"tp": "tp", "pp": "pp", "online_quantization": "dtype", "speculative_config": "speculative-method"}.get(
                planned[key], planned[key]).replace("_", "-")  # fmt: skip
            raise UsageError(
                f"--engine-arg {key} sizes the engine's memory, so the plan must know it",
                hint=f"use --{flag} instead: the planner sizes with it and the rollout passes it to vLLM",
            )
    return PlanOptions(
        tp=request.tp, pp=request.pp, dp=request.dp, expert_parallel=request.expert_parallel, max_model_len=request.max_model_len,
        kv_cache_gib=request.kv_cache_gib, dtype=request.dtype, kv_cache_dtype=request.kv_cache_dtype,
        gpu_memory_utilization=request.gpu_memory_utilization, max_num_seqs=request.max_num_seqs,
        max_num_batched_tokens=request.max_num_batched_tokens, enforce_eager=request.enforce_eager,
        block_size=request.block_size, vllm_version=request.vllm_version or GPU_EXTRA_VLLM,
        flashinfer_sampler=request.flashinfer_sampler, lora=lora_options(request), speculative=request.speculative,
    )  # fmt: skip


def lora_options(request: RolloutRequest) -> LoraOptions | None:
    """The LoRA slots to plan: the flags' (--enable-lora ...), else one slot per --lora adapter
    at vLLM's default rank (``LoraOptions``), so every adapter can be in one batch."""
    if request.lora is not None or not request.adapters:
        return request.lora
    return LoraOptions(max_loras=len(request.adapters))


def checked_adapters(manifest: Manifest, request: RolloutRequest, served: str, source: str, plan: ParallelPlan) -> tuple[LoraAdapter, ...]:
    """The request's adapters, refused where orch cannot serve them."""
    adapters = check_adapters(request.adapters, served)
    remote = [a for a in adapters if a.remote]
    if remote and not uses_hooks(source):
        raise UsageError(f"--lora {remote[0].name}={remote[0].source}: an S3 adapter is downloaded on the node by orch's Serve "
                         f"callback, which a model from {source} does not use",
                         hint="put the base model on the nodes' disks (`orch model sync`), or the adapter too and give its folder")  # fmt: skip
    if remote and manifest.accelerator != "cpu" and plan.tp * plan.pp > max(1, plan.gpus_per_node):
        raise UsageError(f"--lora {remote[0].name}={remote[0].source}: an S3 adapter is downloaded on the node of the engine's "
                         f"first worker only, and this plan's engine spans nodes (TP={plan.tp} x PP={plan.pp})",
                         hint="put the adapter on every node's disk (`orch model sync`) and give its folder")  # fmt: skip
    return adapters


def desired_from_plan(manifest: Manifest, request: RolloutRequest, location: ModelLocation, spec: ModelSpec, plan: ParallelPlan,
                      shape: ClusterShape, defaults: ServeDefaults = ServeDefaults(), capacity_for: CapacityLookup | None = None):  # fmt: skip
    """A factory (Ray nodes -> Desired) for `orch rollout --model ...`, given the plan the pipeline
    made (``workflows.model_plan.size_model``: the same plan `orch plan` prints). ``capacity_for``:
    where the recorded goodput of the planned model and layout comes from; it sizes Serve's
    autoscaling when the manifest asks for it (``serve.scaling``)."""

    defaults = replace(defaults, request_router=request.request_router or manifest.serve.request_router)
    served, source = location.served_name, location.node_path
    if not plan.fits:
        raise PlanError(
            f"{spec.name} does not fit this cluster: " + "; ".join(plan.reasons[-2:]),
            hint="; ".join(plan.suggestions) or "see `orch plan --model ... --cluster ...`",
        )
    # The layout's own arguments are rendered from the ServingPlan (they choose the builder too).
    layout_args = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel",
                   "max_model_len", "gpu_memory_utilization")  # fmt: skip
    engine_extra = {k: v for k, v in plan.engine_kwargs().items() if k not in layout_args}
    engine_extra.update(dict(request.engine_args))
    adapters = checked_adapters(manifest, request, served, source, plan) if request.adapters else ()
    serving_plan = ServingPlan.from_parallel_plan(
        plan, replicas=request.replicas, kv_cache_gib=plan.kv_cache_gib_per_gpu if plan.kv_cache_gib_fixed else None
    )
    defaults = serve_defaults(manifest, request.max_ongoing_requests, defaults)
    plan_json = plan.to_json()
    plan_json.pop("stages", None)
    plan_json["in_flight"] = serve_in_flight(serving_plan, defaults).to_json()
    plan_json["model_fingerprint"] = model_fingerprint(spec)  # the calibration record's key (orch status)
    if request.replicas:
        plan_json["replicas"] = request.replicas
        plan_json["reasons"] = [*plan_json.get("reasons", []), f"replicas set to {request.replicas} by --replicas"]
    weights_per_node = plan.weights_gib_per_gpu * min(plan.tp * plan.pp, max(1, plan.gpus_per_node))
    if manifest.serve.autoscaling:
        capacity, note = capacity_for(spec, plan.tp, plan.pp) if capacity_for is not None else (None, None)
        if capacity is None:
            plan_json["reasons"] = [*plan_json.get("reasons", []), f"autoscaling asked (serve.autoscaling) but {note or 'no goodput is recorded'}: "
                                    f"fixed replicas"]  # fmt: skip
        else:
            target = manifest.slo.target_rps if manifest.slo is not None else None
            policy = autoscaling_for(capacity, plan.tp * plan.pp, shape, target, serving_plan.replicas)
            defaults = replace(defaults, autoscaling_min_replicas=policy.min_replicas, autoscaling_max_replicas=policy.max_replicas,
                               autoscaling_target_ongoing=policy.target_ongoing_requests)  # fmt: skip
            plan_json["autoscaling"] = policy.to_dict()
            plan_json["reasons"] = [*plan_json.get("reasons", []), *(f"autoscaling: {r}" for r in policy.reasons)]

    def build(nodes: list, cores: int | None = None) -> Desired:
        accel, note = accelerator_type_for(manifest, nodes)
        stage_nodes = None
        if manifest.accelerator != "cpu" and serving_plan.pp > 1 and serving_plan.replicas == 1:
            if nodes:
                try:
                    stage_nodes = stage_nodes_for(serving_plan, _free_gpus(manifest, nodes, use_total=False))
                except ServeConfigError:
                    stage_nodes = stage_nodes_for(serving_plan, _free_gpus(manifest, nodes, use_total=True))
            else:
                stage_nodes = stage_nodes_for(serving_plan, {n.name: float(n.gpus) for n in manifest.nodes})
        rendered = render_app(
            manifest, serving_plan, AppTarget(public_app_name(), "/", served, source),
            node_resource=node_resource, accelerator_type=accel, stage_nodes=stage_nodes,
            defaults=defaults, extra_engine_kwargs=engine_extra, node_cores=cores,
        )  # fmt: skip
        # the adapters: runtime (user_config) on orch's builder, else static lora_modules (serve/lora.py)
        rendered = RenderedApp(app=with_adapters(rendered.app, adapters, served), stage_nodes=rendered.stage_nodes,
                               notes=(*rendered.notes, *([note] if note else [])))  # fmt: skip
        return Desired(model=request.model, served_name=served, model_source=source, rendered=rendered,
                       plan={**plan_json, "notes": list(rendered.notes)}, weights_gib_per_node=weights_per_node)  # fmt: skip

    return build


def serve_defaults(manifest: Manifest | None, flag: int | None, defaults: ServeDefaults = ServeDefaults()) -> ServeDefaults:
    """``defaults`` with Serve's max_ongoing_requests from --max-ongoing-requests (``flag``), else
    the manifest's ``serve.max_ongoing_requests``, else as given (None: the engine's batch)."""
    if flag:
        return replace(defaults, max_ongoing_requests=flag, max_ongoing_source=SOURCE_FLAG)
    configured = manifest.serve.max_ongoing_requests if manifest is not None else None
    if configured:
        return replace(defaults, max_ongoing_requests=configured, max_ongoing_source=SOURCE_MANIFEST)
    return defaults


def desired_from_revision(model: str, number: int, config: Mapping[str, Any], plan: Mapping[str, Any], meta: Mapping[str, Any]):
    """A factory that deploys revision ``number``'s stored ``config`` again (orch rollback);
    ``meta``: what its rollout recorded beside it (served name, model source)."""
    app = dict(config)
    llm = (llm_configs(app) or [{}])[0]
    served = meta.get("served_name") or llm.get("model_loading_config", {}).get("model_id") or model
    source = meta.get("model_source") or llm.get("model_loading_config", {}).get("model_source") or ""

    def build(nodes: list, cores: int | None = None) -> Desired:
        return Desired(model=model, served_name=served, model_source=source, rendered=RenderedApp(app=app),
                       plan=dict(plan), rollback_of=number)  # fmt: skip

    return build
