"""The I/O edge of what `orch rollout` and `orch rollback` deploy. ``desired_for_model``: where the
model is (``serve.location``; the local demo's model is built on the spot, which writes files),
the plan pipeline (``workflows.plan.size_model``, the one `orch plan` uses: the same sizing,
calibration included), then the pure rendering (``serve.desired.desired_from_plan``).
``desired_for_revision``: the revision to return to, read from the state store."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import StateError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.engine_features import LoraOptions
from orchestrator.plan.model_ref import resolve_ref
from orchestrator.plan.shape import ClusterShape, shape_from_manifest
from orchestrator.plan.tinymodel import build_tiny_model
from orchestrator.serve.config import ServeDefaults
from orchestrator.serve.desired import (
    CapacityLookup,
    RolloutRequest,
    desired_from_plan,
    desired_from_revision,
    plan_options,
)
from orchestrator.serve.location import locate
from orchestrator.serve.lora import lora_slots, manifest_adapters
from orchestrator.serve.shapes import llm_configs
from orchestrator.state import StateStore
from orchestrator.workflows.plan import size_model
from orchestrator.workflows.served_models import served_name_of, serving_by_name


def desired_for_model(manifest: Manifest, request: RolloutRequest, defaults: ServeDefaults = ServeDefaults(),
                      shape: ClusterShape | None = None, capacity_for: CapacityLookup | None = None,
                      state: StateStore | None = None, serving: StateStore | None = None):  # fmt: skip
    """A factory (Ray nodes -> Desired) for `orch rollout --model ...`. ``shape``: the cluster
    shape to plan on (``workflows.plan.planning_shape``); default: the manifest's. ``state``:
    where the calibration record is read (None: the modelled plan) and, unless ``serving`` is
    given, the serving engine's LoRA slots (``running_lora_slots``)."""
    location = locate(manifest, request.model, request.served_name, request.model_path)
    planner_ref = location.planner_ref
    if location.build_demo is not None:
        planner_ref = resolve_ref(str(build_tiny_model(location.build_demo)))
    configured = manifest.serve.lora.get(location.served_name)
    if configured and not request.adapters:  # the manifest's adapters of this model, unless --lora gives them
        request = replace(request, adapters=manifest_adapters(location.served_name, configured))
    serving = serving or state
    if request.adapters and request.lora is None and serving is not None:
        request = replace(request, lora=running_lora_slots(serving, manifest.name, location.served_name))
    options = plan_options(request)
    shape = shape if shape is not None else shape_from_manifest(manifest)
    sized = size_model(planner_ref, shape, options, manifest, state)
    return desired_from_plan(manifest, request, location, sized.spec, sized.plan, shape, defaults, capacity_for)


def running_lora_slots(state: StateStore, cluster: str, served_name: str) -> LoraOptions | None:
    """The LoRA slots of the engine that serves ``served_name`` now (its revision's stored config),
    or None (not served, or without LoRA). Adapters given without LoRA flags keep them, so adding
    or removing an adapter changes no engine argument and the replicas load it without a restart
    (serve/lora.py); the flags (--max-loras, --max-lora-rank...) change them, with a new engine."""
    serving = serving_by_name(state, cluster).get(served_name)
    configs = llm_configs(serving.config) if serving is not None and serving.config else []
    return lora_slots(configs[0]) if configs else None


def desired_for_revision(state: StateStore, cluster: str, to: int | None, served_name: str | None = None):
    """A factory for `orch rollback [--to N] [--model NAME]`: N's stored config (default: the
    revision that served the model before its current one; the model: ``served_name``, else the
    only one served, else the one N served)."""

    revisions = state.list_revisions(cluster)
    serving = serving_by_name(state, cluster)
    if to is None:
        if served_name is None and len(serving) > 1:
            raise UsageError(f"cluster {cluster!r} serves {len(serving)} models ({', '.join(sorted(serving))}): name the one to roll back",
                             hint=f"orch rollback --model {sorted(serving)[0]} (or --to N)")  # fmt: skip
        name = served_name if served_name is not None else next(iter(serving), None)
        current = serving.get(name) if name is not None else None
        earlier = [r for r in revisions if r.status in ("superseded", "rolled_back", "removed") and (current is None or r.number < current.number)
                   and (name is None or served_name_of(state, cluster, r) == name)]  # fmt: skip
        if not earlier:
            which = f" of {name!r}" if name is not None else ""
            raise StateError(f"cluster {cluster!r} has no earlier revision{which} to roll back to", hint="`orch status` lists the revisions")
        target = earlier[-1]
    else:
        found = next((r for r in revisions if r.number == to), None)
        if found is None:
            raise StateError(f"cluster {cluster!r} has no revision {to}", hint="`orch status` lists the revisions")
        if found.status in ("pending", "failed"):
            raise StateError(f"revision {to} is {found.status}: only a revision that once served can come back")
        if served_name is not None and served_name_of(state, cluster, found) != served_name:
            raise UsageError(f"revision {to} served {served_name_of(state, cluster, found)!r}, not {served_name!r}",
                             hint="leave out --model, or pick a revision of that model (`orch status` lists them)")  # fmt: skip
        target = found
    meta = state.revision_meta(cluster, target.number) or {}
    return desired_from_revision(target.model, target.number, target.config, target.plan, meta)
