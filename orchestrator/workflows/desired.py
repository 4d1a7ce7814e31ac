"""The I/O edge of what `orch rollout` deploys: where the model is (``serve.location``; the local
demo's model is built on the spot, which writes files), the plan pipeline
(``workflows.plan.size_model``, the one `orch plan` uses: the same sizing, calibration included)
and then the pure rendering (``serve.desired.desired_from_plan``)."""

from __future__ import annotations

from orchestrator.manifest.model import Manifest
from orchestrator.plan.model_ref import resolve_ref
from orchestrator.plan.shape import ClusterShape, shape_from_manifest
from orchestrator.plan.tinymodel import build_tiny_model
from orchestrator.serve.config import ServeDefaults
from orchestrator.serve.desired import CapacityLookup, RolloutRequest, desired_from_plan, plan_options
from orchestrator.serve.location import locate
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
    options = plan_options(request)
    shape = shape if shape is not None else shape_from_manifest(manifest)
    sized = size_model(planner_ref, shape, options, manifest, state)
    return desired_from_plan(manifest, request, location, sized.spec, sized.plan, shape, defaults, capacity_for)
