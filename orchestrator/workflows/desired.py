"""The I/O edge of what `orch rollout` and `orch rollback` deploy. ``desired_for_model``: where the
model is (``serve.location``; the local demo's model is built on the spot, which writes files),
the plan pipeline (``workflows.plan.size_model``, the one `orch plan` uses: the same sizing,
calibration included), then the pure rendering (``serve.desired.desired_from_plan``).
``desired_for_revision``: the revision to return to, read from the state store."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import StateError
from orchestrator.manifest.model import Manifest
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
from orchestrator.serve.lora import manifest_adapters
from orchestrator.state import StateStore
from orchestrator.workflows.plan import size_model


def desired_for_model(manifest: Manifest, request: RolloutRequest, defaults: ServeDefaults = ServeDefaults(),
                      shape: ClusterShape | None = None, capacity_for: CapacityLookup | None = None,
                      state: StateStore | None = None):  # fmt: skip
    """A factory (Ray nodes -> Desired) for `orch rollout --model ...`. ``shape``: the cluster
    shape to plan on (``workflows.plan.planning_shape``); default: the manifest's. ``state``:
    where the calibration record is read (None: the modelled plan)."""
    location = locate(manifest, request.model, request.served_name, request.model_path)
    planner_ref = location.planner_ref
    if location.build_demo is not None:
        planner_ref = resolve_ref(str(build_tiny_model(location.build_demo)))
    configured = manifest.serve.lora.get(location.served_name)
    if configured and not request.adapters:  # the manifest's adapters of this model, unless --lora gives them
        request = replace(request, adapters=manifest_adapters(location.served_name, configured))
    options = plan_options(request)
    shape = shape if shape is not None else shape_from_manifest(manifest)
    sized = size_model(planner_ref, shape, options, manifest, state)
    return desired_from_plan(manifest, request, location, sized.spec, sized.plan, shape, defaults, capacity_for)


def desired_for_revision(state: StateStore, cluster: str, to: int | None):
    """A factory for `orch rollback [--to N]`: N's stored config (default: the revision that
    served before the current one)."""

    revisions = state.list_revisions(cluster)
    current = state.current_revision(cluster)
    if to is None:
        earlier = [r for r in revisions if r.status in ("superseded", "rolled_back", "removed") and (current is None or r.number < current.number)]
        if not earlier:
            raise StateError(f"cluster {cluster!r} has no earlier revision to roll back to", hint="`orch status` lists the revisions")
        target = earlier[-1]
    else:
        found = next((r for r in revisions if r.number == to), None)
        if found is None:
            raise StateError(f"cluster {cluster!r} has no revision {to}", hint="`orch status` lists the revisions")
        if found.status in ("pending", "failed"):
            raise StateError(f"revision {to} is {found.status}: only a revision that once served can come back")
        target = found
    meta = state.revision_meta(cluster, target.number) or {}
    return desired_from_revision(target.model, target.number, target.config, target.plan, meta)
