"""Repair after an interrupted rollout. Does I/O through ``ServingDeps`` and the cluster APIs.

A revision stays ``pending`` from the moment it is recorded until its rollout ends: ready, or
failed once what served before was put back. An orch that stopped in between (SIGKILL, a second
Ctrl-C during the restore, a machine that went away) leaves it pending. Run under the cluster's
lock, so no other rollout is in flight, ``repair_interrupted`` finds such revisions and:

1. removes every application orch put there for them (a candidate on its own route, or the new
   revision that replaced the old one in place);
2. puts the revision recorded as serving back on its application: Serve's deployed config when it
   is still the recorded one (the PUT then changes nothing), else the stored config with its
   secrets and the API key put back (a surge back after an interrupted switch, or a redeploy
   after an interrupted in-place change); then waits until it answers a real completion;
3. records each interrupted revision as failed, naming the step it stopped at.
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.errors import RolloutFailed, StateError
from orchestrator.manifest.model import Manifest
from orchestrator.runbooks import runbook
from orchestrator.serve.config import IN_PLACE_SURGE_PERCENT
from orchestrator.serve.decisions import SIDE_BY_SIDE
from orchestrator.serve.fingerprint import config_fingerprint
from orchestrator.serve.ray_io.client import ServeStatus
from orchestrator.serve.shapes import api_key_of
from orchestrator.state import Revision
from orchestrator.workflows.rollout_steps import (
    ClusterApis,
    Failure,
    Progress,
    RestorePlan,
    RolloutOptions,
    ServingDeps,
    check_ready,
    put,
    restore_plan,
    serving_now,
    wait_for_app,
)
from orchestrator.workflows.served_models import other_models, served_name_of

RUNBOOK = "see " + runbook("ROLLOUT_INTERRUPTED")


def interrupted(deps: ServingDeps, cluster: str) -> list[Revision]:
    """Revisions left pending (call it under the cluster's lock: then none is in flight)."""
    return [r for r in deps.state.list_revisions(cluster) if r.status == "pending"]


def _deployed_key(config: dict) -> str | None:
    return api_key_of(config)


def _runs_recorded_config(status: ServeStatus, plan: RestorePlan, current: Revision) -> bool:
    app = status.app(str(plan.app_name))
    if app is None or not app.deployed_config:
        return False
    return config_fingerprint(app.deployed_config, _deployed_key(app.deployed_config)) == current.config_fingerprint


def _repair_surge(deps: ServingDeps, cluster: str, orphans: list[Revision], plan: RestorePlan) -> int | None:
    """Side by side only: room for two copies, so the config as it ran (with its surge). Any
    other interrupted rollout (in place, fresh, or one whose decision was never recorded) may have
    left the public application without room for a second copy: roll back without a surge."""
    if plan.config is None:
        return None
    kinds = {((deps.state.revision_meta(cluster, r.number) or {}).get("decision") or {}).get("kind") for r in orphans}
    return None if kinds == {SIDE_BY_SIDE} else IN_PLACE_SURGE_PERCENT


def repair_interrupted(manifest: Manifest, apis: ClusterApis, api_key: str, deps: ServingDeps, options: RolloutOptions,
                       step: Progress) -> list[str]:  # fmt: skip
    """Repair what interrupted rollouts left (see the module doc), model by model (each served
    name's own application; the other models' are carried unchanged); the notes say what was done."""
    orphans = interrupted(deps, manifest.name)
    by_name: dict[str, list[Revision]] = {}
    for rev in orphans:
        by_name.setdefault(served_name_of(deps.state, manifest.name, rev), []).append(rev)
    notes: list[str] = []
    for served, revs in sorted(by_name.items()):
        notes += _repair_model(manifest, apis, api_key, deps, options, step, served, revs)
    return notes


def _repair_model(manifest: Manifest, apis: ClusterApis, api_key: str, deps: ServingDeps, options: RolloutOptions,
                  step: Progress, served: str, orphans: list[Revision]) -> list[str]:  # fmt: skip
    state, name = deps.state, manifest.name
    numbers = ", ".join(str(r.number) for r in orphans)
    step(f"revision {numbers} was interrupted (orch stopped before it finished): putting the recorded state back")
    status = apis.serve.status()
    others = other_models(state, name, status, served)
    kept = tuple(others.configs(manifest.env, deps.environ))
    current, serving = serving_now(state, name, status, served, others)
    plan = restore_plan(manifest, current, serving, status, api_key, deps, kept)
    if current is not None and not _runs_recorded_config(status, plan, current):
        # The live application holds the interrupted revision's config (or is gone): rebuild it
        # from the record, not from what Serve runs.
        plan = restore_plan(manifest, current, serving, ServeStatus(), api_key, deps, kept)
        if plan.config is None:
            raise StateError(f"cannot put revision {current.number} back: {plan.why_not}",
                             hint="export the named variables (or set them in the manifest's env) and rerun")  # fmt: skip
    plan = replace(plan, surge_percent=_repair_surge(deps, name, orphans, plan))
    body = plan.body()
    keep = [body] if body is not None else []
    stray = sorted(n for n in status.applications if n != plan.app_name and n not in others.apps)
    deadline = deps.clock() + options.timeout_s
    app = status.app(str(plan.app_name)) if plan.app_name else None
    unchanged = app is not None and body is not None and app.deployed_config == body
    since = app.last_deployed_time_s if app is not None and not unchanged else None
    if stray or not unchanged:
        put(apis.serve, [*kept, *keep], manifest, deps, deadline)
        step("removed " + (", ".join(stray) if stray else "nothing") + (f"; {plan.app_name} runs revision {plan.revision}'s config" if keep else ""))
    restored = current is None
    error = None
    if current is not None and plan.config is not None:
        try:
            wait_for_app(apis.serve, str(plan.app_name), options.timeout_s, deps, options.poll_s, since=since)
            check_ready(apis, plan.route, str(plan.served_name), _deployed_key(plan.config) or api_key, deps, options)
            restored = True
            step(f"revision {current.number} serves ({plan.app_name})")
        except Failure as failure:
            error = failure.what + (f": {failure.detail}" if failure.detail else "")
    notes = []
    for rev in orphans:
        meta = state.revision_meta(name, rev.number) or {}
        where = meta.get("step") or "before its first step was recorded"
        back = f"revision {current.number} put back" if current is not None and restored else "nothing served before" if current is None else f"revision {current.number} did not come back: {error}"
        text = f"interrupted at step '{where}' (orch stopped: killed, interrupted or disconnected); {back} by the next `orch {options.command}`"
        state.update_revision(name, rev.number, "failed", error=text)
        state.save_revision_meta(name, rev.number, {**meta, "error": text, "restored": restored, "interrupted": True})
        notes.append(f"revision {rev.number}: {text}")
    if not restored:
        raise RolloutFailed(f"revision {numbers} was interrupted and revision {current.number if current else '?'} did not come back: {error}",
                            hint=RUNBOOK, rolled_back=False)  # fmt: skip
    return notes
