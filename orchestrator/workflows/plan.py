"""The I/O edge of planning: the one plan pipeline (``size_model``: model reference -> ModelSpec ->
ParallelPlan, the calibration record included) that `orch plan` and `orch rollout` both use, which
shape and vLLM version to plan for (from the state `orch up` recorded when the manifest is the one
up), the reserve a rollout measured (calibration) and the per-replica goodput a load run recorded
(replicas for a target rate, autoscaling). Reads config.json files and orch's state, downloads a
repo's config (``workflows.hf_fetch``); the planning itself is ``orchestrator.plan`` (and
``serve.scaling``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.bench.goodput import Goodput
from orchestrator.manifest.model import Manifest
from orchestrator.plan.calibration import calibration_key, model_fingerprint, why_not_reusable
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.engine_terms import (
    GPU_EXTRA_VLLM,
    default_flashinfer_sampler,
    parse_vllm_version,
    probed_flashinfer,
    probed_vllm_version,
)
from orchestrator.plan.model_ref import ModelRef, spec_for_ref
from orchestrator.plan.planner import ParallelPlan, plan_model
from orchestrator.plan.shape import ClusterShape, recorded_facts, shape_from_facts, shape_from_manifest
from orchestrator.state import StateStore
from orchestrator.workflows.calibration import load_calibrations
from orchestrator.workflows.hf_fetch import fetch_repo_config
from orchestrator.workflows.load_record import goodput_of, recorded_load
from orchestrator.workflows.served_models import serving_by_name


@dataclass(frozen=True)
class SizedModel:
    """What the pipeline made of a model reference: its spec and its plan (calibrated when a
    record allows), and a note when a repo's config was downloaded for it."""

    spec: ModelSpec
    plan: ParallelPlan
    fetched: str | None = None


def size_model(ref: ModelRef, shape: ClusterShape, options: PlanOptions, manifest: Manifest | None = None,
               state: StateStore | None = None) -> SizedModel:  # fmt: skip
    """The plan pipeline: ``ref`` (what the planner reads: ``serve.location`` says which for a
    rollout, ``serve.location.stored_copy`` for `orch plan --cluster`) -> its ModelSpec (a repo
    id's config downloaded into the cache first when allowed) -> the ParallelPlan on ``shape`` ->
    recalibrated with the reserve the engine measured on this cluster when ``manifest`` is the one
    up in ``state`` and a record of the same configuration exists (``calibrated``)."""
    fetched = fetch_repo_config(ref)
    spec = spec_for_ref(ref)
    if fetched:
        shape = replace(shape, notes=(*shape.notes, fetched))
    result = plan_model(spec, shape, options)
    if manifest is not None and state is not None and result.fits:
        result = calibrated(spec, shape, options, result, manifest, state)
    return SizedModel(spec, result, fetched)


def planning_shape(manifest: Manifest, state: StateStore) -> ClusterShape:
    """The shape to plan on: the GPUs `orch up` probed when this manifest is the one up, else
    what the manifest declares (preflight has already held the nodes to it)."""
    record = state.get_cluster(manifest.name)
    probed = None
    if record is not None and record.state == "up" and record.fingerprint == manifest.fingerprint():
        probed = state.load_facts(manifest.name)
    if not probed:
        return shape_from_manifest(manifest)
    shape = shape_from_facts(manifest, recorded_facts(probed))
    return replace(shape, notes=shape.notes + ("shape from the GPUs that `orch up` probed on the nodes",))


def probed_facts(manifest: Manifest, state: StateStore) -> dict:
    """What `orch up` probed on the nodes, when this manifest is the one up (else empty)."""
    record = state.get_cluster(manifest.name)
    if record is None or record.state != "up" or record.fingerprint != manifest.fingerprint():
        return {}
    return state.load_facts(manifest.name) or {}


def vllm_version_for(flag: str | None, manifest: Manifest | None, state_dir: Path | None) -> tuple[str, str]:
    """(vLLM version to size for, where it comes from): --vllm-version, else the version `orch up`
    probed on the manifest's nodes, else the version the gpu extra pins."""
    if flag:
        parse_vllm_version(flag)
        return flag, "--vllm-version"
    if manifest is not None and state_dir is not None:
        probed = probed_vllm_version(probed_facts(manifest, StateStore(state_dir)))
        if probed:
            return probed, f"the vLLM that `orch up` probed on the nodes of {manifest.name}"
    return GPU_EXTRA_VLLM, "the version the gpu extra pins (ray[llm]==2.60.0 requires vllm 0.29.0)"


def sampler_for(flag: str | None, version: str, manifest: Manifest | None, state_dir: Path | None) -> tuple[bool, str]:
    """(FlashInfer sampler or not, why): --sampler, else the version's default given whether `orch up`
    found flashinfer on the manifest's nodes (engine_terms.default_flashinfer_sampler)."""
    if flag is not None:
        return flag == "flashinfer", f"--sampler {flag}"
    installed = None
    if manifest is not None and state_dir is not None:
        installed = probed_flashinfer(probed_facts(manifest, StateStore(state_dir)))
    choice = default_flashinfer_sampler(parse_vllm_version(version), installed)
    where = {True: "installed on the nodes `orch up` probed", False: "missing on the nodes `orch up` probed", None: "not probed"}[installed]
    return choice, f"vLLM {version}'s default with flashinfer {where}"


def calibrated(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, result: ParallelPlan, manifest: Manifest, state: StateStore) -> ParallelPlan:
    """The plan again with the reserve the engine measured on this cluster, when a rollout of the same
    model, GPU type, vLLM version, layout and flags was recorded (the rollout records it) by an engine
    that ran on that GPU type; a record that may not be used is named in the plan's notes."""
    if not probed_facts(manifest, state):
        return result
    key = calibration_key(spec, result.gpu_type, result.vllm_version, result.tp, result.pp, result.engine_kwargs())
    records = load_calibrations(state, manifest.name)
    record = records.get(key)
    why = why_not_reusable(record, result.gpu_type) if record is not None else None
    if record is None or why is not None:
        # a record of this configuration under another device (a CPU engine standing in for the GPU)
        other = record or next((r for r in records.values() if r.get("planned_key") == key), None)
        if other is None:
            return result
        why = why or why_not_reusable(other, result.gpu_type)
        note = f"not calibrated: the record of revision {other.get('revision', '?')} of this configuration is not used ({why})"
        return replace(result, reasons=(*result.reasons, note))
    measured = replace(options, reserve_gib=float(record["measured_reserve_gib"]), tp=result.tp, pp=result.pp, dp=result.dp,
                       expert_parallel=result.expert_parallel)  # fmt: skip
    note = f"calibrated: revision {record.get('revision', '?')} of this configuration measured {record['measured_reserve_gib']:.2f} GiB of reserve per GPU"
    return plan_model(spec, replace(shape, notes=(*shape.notes, note)), measured)


def recorded_goodput(manifest: Manifest, state: StateStore, spec: ModelSpec, tp: int, pp: int) -> tuple[Goodput | None, str | None]:
    """(the per-replica goodput recorded for this model and layout, a note saying where it comes
    from or why none is used). Read from the serving revision's load record (`orch bench`,
    `orch accept`, the SLO gate), judged by the manifest's objective as it is now; used only when
    that revision runs the same model (fingerprint) at the same TP and PP."""
    objective = manifest.objective
    if objective is None:
        return None, "no goodput: the manifest sets no slo: to judge measured levels by"
    serving = list(serving_by_name(state, manifest.name).values())
    if not serving:
        return None, "no goodput: no revision serves on this cluster yet"
    # several models: the one whose revision serves this model (its fingerprint), else the newest
    same_model = [r for r in serving if (r.plan or {}).get("model_fingerprint") == model_fingerprint(spec)]
    current = max(same_model or serving, key=lambda r: r.number)
    entry = recorded_load(state, manifest.name, current.number)
    if entry is None:
        return None, f"no goodput: revision {current.number} has no recorded load (`orch bench CLUSTER_YAML` records one)"
    plan = current.plan or {}
    same = (plan.get("model_fingerprint") == model_fingerprint(spec), int(plan.get("tp") or 0) == tp, int(plan.get("pp") or 0) == pp)
    if not all(same):
        return None, (f"no goodput: revision {current.number}'s recorded load is for another model or layout "
                      f"(TP={plan.get('tp')} PP={plan.get('pp')}), not this plan's TP={tp} PP={pp}")  # fmt: skip
    found = goodput_of(entry, objective)
    if found is None:
        return None, f"no goodput: revision {current.number} met the objective at none of its recorded levels"
    return found, f"goodput recorded on revision {current.number} ({entry.get('source')}): {found.describe()}"
