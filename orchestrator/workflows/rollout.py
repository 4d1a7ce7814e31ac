"""`orch rollout` and `orch rollback`: a model as a Ray Serve LLM application, health-gated.

I/O only through ``ServingDeps`` (``workflows.rollout_steps``): the state store, runners
(model-path check, replica logs), the Serve REST API and the dashboard's node list (through an
SSH tunnel to the head in real use), the public endpoint (readiness probe), a clock, a sleep and
a progress callback. Decisions are ``orchestrator.serve.decisions.decide`` and ``fits``; configs
come from ``orchestrator.serve.config``.

A rollout holds the cluster's lock (``cluster_lock``): repair what an interrupted rollout left
(``rollout_repair``) -> render + validate (secrets of a stored config put back, placeholders
refused) -> decide (noop / fresh / side_by_side / in_place / refuse) -> record a pending
revision -> check the model path on the nodes -> apply (side by side: the candidate
``orch-r<N>`` on its own route; fresh and in place: the public application ``orch``, updated in
place with ``max_surge_percent: 0``) -> watch the application, deployment and replica states -> readiness (a real
completion through the public endpoint with the API key, and 401 without it) -> switch traffic
-> record ready, the previous one superseded -> record what the engines logged against the plan
(``workflows.calibration``: the record `orch plan --cluster` sizes with; a log that cannot be read
is said, and the rollout still succeeds).

Whatever stops it after the first apply (a failed gate, a Serve API error, a lost connection,
Ctrl-C, a bug) puts the previous revision back before the error is raised (side by side before
the switch: it never stopped serving), and the error says what failed, with the replica's own
error from Serve's status message or its log on the node. When even that cannot happen (SIGKILL,
a second Ctrl-C) the revision stays ``pending`` and the next rollout repairs it.

Per-revision details the state table has no column for (decision, steps, the step reached,
cold-load time) go to ``<state_dir>/clusters/<name>/revisions/<n>.json`` (``StateStore``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import cluster_lock
from orchestrator.bench.goodput import LoadLevel
from orchestrator.errors import ClusterNotUp, OrchError, RolloutFailed, RolloutInterrupted, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.runbooks import runbook
from orchestrator.serve import decisions
from orchestrator.serve.config import (
    IN_PLACE_SURGE_PERCENT,
    PUBLIC_ROUTE,
    RenderedApp,
    max_surge_of,
    with_max_surge,
    with_replicas,
)
from orchestrator.serve.desired import Desired
from orchestrator.serve.lora import runtime_adapters, with_runtime_adapters
from orchestrator.serve.ray_io.client import ServeStatus
from orchestrator.serve.slo_gate import GatePlan, gate_figures, judge_gate, plan_gate
from orchestrator.state import Revision, StateStore
from orchestrator.workflows.calibration import calibrate_rollout
from orchestrator.workflows.front_steps import settle_front
from orchestrator.workflows.load_record import (
    candidate_replicas,
    configured_replicas,
    levels_of,
    record_load,
    recorded_load,
    shape_of,
)
from orchestrator.workflows.rollout_repair import repair_interrupted
from orchestrator.workflows.rollout_result import RolloutResult
from orchestrator.workflows.rollout_steps import (
    ClusterApis,
    Failure,
    RestorePlan,
    RolloutOptions,
    ServingDeps,
    check_adapter_paths,
    check_model_path,
    check_ready,
    node_cores,
    probe_adapters,
    put,
    put_serve_hooks,
    replica_log_error,
    restore,
    restore_plan,
    serving_now,
    wait_for_app,
    what_failed,
)
from orchestrator.workflows.secrets import for_display, with_secrets
from orchestrator.workflows.served_models import no_room, other_models, place
from orchestrator.workflows.start_failures import StartWatch

__all__ = ["ClusterApis", "RolloutOptions", "RolloutResult", "ServingDeps", "execute"]

RUNBOOK = "see " + runbook("ROLLOUT_FAILED")


@dataclass(frozen=True)
class Attempt:
    """One decided rollout, everything `_carry_out` needs besides the live connections."""

    manifest: Manifest
    desired: Desired
    api_key: str
    fingerprint: str
    decision: decisions.Decision
    current: Revision | None
    serving: decisions.Serving
    status: ServeStatus  # Serve as the decision saw it
    restore: RestorePlan  # how to put back what serves now
    options: RolloutOptions
    gate: GatePlan | None = None  # --slo-gate: the load the candidate must carry with the objective met
    app_name: str = decisions.PUBLIC_APP  # the model's application (fresh and in place: the name it gets)
    route: str = PUBLIC_ROUTE  # where the model's application answers
    others: tuple[dict, ...] = field(default=(), repr=False)  # the other models' applications, carried by every PUT


@dataclass(frozen=True)
class Link:
    """The live connections of one rollout."""

    runners: Mapping[str, Runner]
    apis: ClusterApis
    nodes: list


@dataclass
class Trail:
    """What one rollout has done so far: its revision and candidate, the step reached (written to
    the revision's meta file before each step, so an interrupted one can be explained), and
    whether anything was applied (then a failure must put the previous revision back)."""

    state: StateStore
    cluster: str
    number: int
    app_name: str
    meta: dict[str, Any]
    result: RolloutResult
    progress: Callable[[str], None]
    applied: bool = False
    switched: bool = False  # the live application was given the new config (side by side)

    def step(self, text: str) -> None:
        self.result.steps.append(text)
        self.progress(text)

    def reach(self, where: str) -> None:
        self.meta["step"] = where
        self.state.save_revision_meta(self.cluster, self.number, self.meta)


# Said before the Serve config is validated: the validation imports ray.serve.llm and vLLM, the
# slow part of a dry run (13 of its 19 s in issue 25), which was silent.
VALIDATING = "validating the Serve application with Ray Serve LLM's own models (imports ray.serve.llm and vLLM: the slow step)"

# (Ray nodes with usage, [] when unknown; cores of the smallest node, None when unknown) -> Desired
DesiredFactory = Callable[[list, "int | None"], Desired]


def execute(manifest: Manifest, build: DesiredFactory, api_key: str | None, deps: ServingDeps, options: RolloutOptions) -> RolloutResult:
    """Decide and carry out a rollout of what ``build`` renders (shared by rollout and rollback)."""
    cluster = deps.state.get_cluster(manifest.name)
    if cluster is None or cluster.state != "up":
        if options.dry_run:
            deps.progress("rendering the Serve application (the cluster is not up: sized on the manifest)")
            desired = build([], None)
            deps.progress(VALIDATING)
            deps.validate(desired.rendered.app)
            decision = decisions.Decision(decisions.FRESH, f"cluster {manifest.name!r} is not up: this is the config a first rollout would apply")
            return RolloutResult(action="dry_run:" + decision.kind, decision=decision.to_dict(), cluster=manifest.name,
                                 model=desired.served_name, config=desired.rendered.app, plan=desired.plan)  # fmt: skip
        raise ClusterNotUp(f"cluster {manifest.name!r} is not up", hint=f"run `orch up {manifest.source_path or 'CLUSTER_YAML'}` first")
    if options.dry_run:
        return _decide_and_run(manifest, build, api_key, deps, options)
    if not api_key:
        raise UsageError(
            f"no API key: the environment variable {manifest.serve.api_key_env} is not set",
            hint=f"export {manifest.serve.api_key_env}=<a long random string> (the endpoint requires it)",
        )
    with cluster_lock.hold(deps.state.cluster_dir(manifest.name), manifest.name, options.command, deps.wall_clock):
        return _decide_and_run(manifest, build, api_key, deps, options)


def _decide_and_run(manifest: Manifest, build: DesiredFactory, api_key: str | None, deps: ServingDeps, options: RolloutOptions) -> RolloutResult:
    token = deps.state.read_token(manifest.name) if manifest.ray.token_auth else None
    with deps.open_runners(manifest) as runners, deps.open_apis(manifest, runners, token) as apis:
        repaired = [] if options.dry_run or not api_key else repair_interrupted(manifest, apis, api_key, deps, options, deps.progress)
        deps.progress("reading the Ray nodes and rendering the Serve application")
        nodes = apis.nodes()
        desired = build(nodes, node_cores(manifest, runners))
        if not options.dry_run:
            desired = with_secrets(desired, manifest, deps.environ)
        deps.progress(VALIDATING)
        deps.validate(desired.rendered.app)
        status = apis.serve.status()
        others = other_models(deps.state, manifest.name, status, desired.served_name)
        current, serving = serving_now(deps.state, manifest.name, status, desired.served_name, others)
        fingerprint = desired.rendered.fingerprint(api_key)
        groups, strategy = decisions.copy_demand(desired.rendered.app)
        free = decisions.free_resources(nodes)
        room = decisions.fits(groups, strategy, free)
        downtime = decisions.estimate_cold_load_s(manifest.accelerator, desired.weights_gib_per_node, serving.cold_load_s)
        live = status.app(serving.app_name) if serving.live and serving.app_name else None
        live_config = live.deployed_config if live is not None else None
        change = decisions.engine_change(live_config, desired.rendered.app)
        rescale, adapters = decisions.light_change(live_config, desired.rendered.app, api_key, serving.fingerprint)
        added = rescale is not None and rescale[1] > rescale[0] and decisions.fits(groups[: rescale[1] - rescale[0]], strategy, free)
        decision = decisions.decide(fingerprint, serving, room, options.allow_downtime, downtime, change, rescale, added, adapters)
        app_name, route = place(desired.served_name, serving, status, others)
        decision = decisions.beside(others.names, desired.served_name, decision, app_name, route,
                                    decisions.lora_restart(live_config, desired.rendered.app))  # fmt: skip
        if decision.kind == decisions.FRESH and others.names and not room:
            raise UsageError(*no_room(desired, others, nodes))
        for note in decision.notes:
            deps.progress(note)
        result = RolloutResult(
            action=decision.kind, decision=decision.to_dict(), cluster=manifest.name, model=desired.served_name,
            previous_revision=serving.revision, config=desired.rendered.app, plan=desired.plan, repaired=repaired,
        )  # fmt: skip
        if decision.kind == decisions.NOOP:
            result.revision, result.app_name = serving.revision, serving.app_name
            return result
        if decision.kind == decisions.REFUSE:
            raise UsageError(decision.reason, hint="rerun with --allow-downtime to replace it in place, or free capacity")
        gate = _gate(manifest, deps, decision, serving, desired, options)
        if gate is not None:
            result.slo_gate = {"plan": gate.to_dict()}
        if options.dry_run:
            result.action = "dry_run:" + decision.kind
            return result
        assert api_key is not None  # checked by execute before the lock
        kept = tuple(others.configs(manifest.env, deps.environ))
        plan = restore_plan(manifest, current, serving, status, api_key, deps, kept)
        if decision.kind not in (decisions.SIDE_BY_SIDE, *decisions.LIGHT):
            # Putting it back rolls the public application again, without room for two copies:
            # no surge. (Side by side the live application is put back as it ran, and after the
            # switch with the surge of the config it took: `_fail`.)
            plan = replace(plan, surge_percent=IN_PLACE_SURGE_PERCENT)
        if decision.kind in (decisions.IN_PLACE, *decisions.LIGHT) and plan.config is None:
            what = (f"replace revision {serving.revision} in place: if the new revision failed," if decision.kind == decisions.IN_PLACE
                    else f"change revision {serving.revision}'s replica count or adapters:")  # fmt: skip
            raise UsageError(f"refusing to {what} orch could not put it back ({plan.why_not})",
                             hint="export the named variables (or set them in the manifest's env) and rerun")  # fmt: skip
        attempt = Attempt(manifest, desired, api_key, fingerprint, decision, current, serving, status, plan, options, gate,
                          app_name, route, kept)  # fmt: skip
        return _carry_out(attempt, Link(runners, apis, nodes), deps, result)


def _carry_out(attempt: Attempt, link: Link, deps: ServingDeps, result: RolloutResult) -> RolloutResult:
    state, manifest, desired, options = deps.state, attempt.manifest, attempt.desired, attempt.options
    name, api_key, apis = manifest.name, attempt.api_key, link.apis
    old_live = attempt.serving.app_name if attempt.serving.live else None
    side = attempt.decision.kind == decisions.SIDE_BY_SIDE and old_live is not None
    rev = state.add_revision(name, desired.model, plan=desired.plan, config_fingerprint=attempt.fingerprint, config=desired.rendered.app)
    number = rev.number
    before = None  # the public application as Serve ran it before an in-place update of it
    if side and old_live is not None:
        # The candidate IS revision N, on its own route. At the switch the live application
        # takes the config under its own name, also the orch-r<N> of an older orch: renaming it
        # would move the public route to another application, and HAProxy refused requests
        # during such a move ("router_unreachable"). So the name is kept; status and messages
        # name the revision from the record.
        served_as = desired.rendered.renamed(old_live, attempt.route)
        app = desired.rendered.renamed(decisions.candidate_app_name(number), decisions.candidate_route(number))
        body = app.with_api_key(api_key)
    elif attempt.decision.kind in decisions.LIGHT and attempt.restore.config is not None:
        # The live application as Serve runs it with only its replica count and/or its runtime
        # LoRA adapters changed, as app-level overrides (num_replicas, user_config): the same code
        # version, so Serve adds or stops replicas and reconfigures the ones serving, which keep
        # running (config.with_replicas, lora.with_runtime_adapters). Recorded as it runs, secrets redacted.
        body = attempt.restore.config
        if attempt.decision.kind == decisions.SCALE:
            body = with_replicas(body, configured_replicas(desired.rendered.app) or 1)
        if (adapters := runtime_adapters(desired.rendered.app)) is not None:
            body = with_runtime_adapters(body, adapters)
        served_as = app = RenderedApp(app=for_display(body), stage_nodes=desired.rendered.stage_nodes)
        before = attempt.status.app(app.name)
    else:
        # Fresh and in place: the public application under its stable name, updated in place
        # (an older orch's orch-r<N> is replaced by it in the same PUT). No room for two copies,
        # so no surge: Serve stops the old replica, then starts the new one.
        served_as = app = desired.rendered.renamed(attempt.app_name, attempt.route)
        before = attempt.status.app(app.name)
        body = app.with_api_key(api_key)
        if before is not None:  # Serve rolls it (nothing to roll when it is new)
            body = with_max_surge(body, IN_PLACE_SURGE_PERCENT)
    live_body = body  # what Serve runs for the model once it serves (side by side: set at the switch)
    # What the revision serves as: side by side, the live application takes its config at the
    # switch (the candidate on its own route is only the proof), so that is what is recorded.
    state.set_served_as(name, number, served_as.name, served_as.app)
    result.revision, result.app_name = number, app.name
    meta: dict[str, Any] = {"app_name": served_as.name, "candidate": app.name, "decision": attempt.decision.to_dict(),
                            "served_name": desired.served_name, "model_source": desired.model_source,
                            "rollback_of": desired.rollback_of, "steps": result.steps}  # fmt: skip
    trail = Trail(state, name, number, app.name, meta, result, deps.progress)
    step, reach = trail.step, trail.reach
    try:
        reach("check the model path on the nodes")
        if options.check_model_path:
            check_model_path(manifest, link.runners, desired.model_source)
            check_adapter_paths(manifest, link.runners, app.app)
        reach("put orch's Serve hook module on the nodes")
        put_serve_hooks(manifest, link.runners, app.app)
        keep = [*attempt.others, *([attempt.restore.config] if side and attempt.restore.config else [])]
        reach(f"apply {app.name} ({attempt.decision.kind})")
        t_apply = deps.clock()
        trail.applied = True
        # An update of an application Serve runs: wait for the new deploy, not the RUNNING it
        # reports before it has begun.
        since = before.last_deployed_time_s if before is not None and before.deployed_config != body else None
        put(apis.serve, [*keep, body], manifest)
        if side:
            step(f"applied candidate {app.name} (revision {number}) on {app.app['route_prefix']} ({attempt.decision.kind})")
        else:
            how = "; max_surge_percent 0: Serve stops the old replica, then starts the new one" if before is not None else ""
            if attempt.decision.kind in decisions.LIGHT:
                how = f"; num_replicas {configured_replicas(body)}, the LoRA adapters as user_config: the replicas serving keep running"
            step(f"applied revision {number} as {app.name} on {attempt.route} ({attempt.decision.kind}{how})")
        reach(f"wait for {app.name} to run")
        wait_for_app(apis.serve, app.name, options.timeout_s, deps, options.poll_s, since=since,
                     watch=StartWatch(manifest, link.runners, link.nodes, deps.progress))  # fmt: skip
        reach(f"readiness probe of {app.name}")
        probe = check_ready(apis, app.app["route_prefix"], desired.served_name, api_key, deps, options)
        result.cold_load_s = round(deps.clock() - t_apply, 2)
        result.first_token_s = probe.first_token_s
        step(f"{app.name} answered a completion ({probe.output_tokens} tokens) {result.cold_load_s:.1f} s after the apply")
        if names := probe_adapters(apis, app.app["route_prefix"], app.app, api_key):
            step(f"each LoRA adapter answered a completion on {app.name}: {', '.join(names)}")
        if attempt.gate is not None:
            reach(f"SLO gate of {app.name}")
            _run_gate(attempt.gate, app, attempt, apis, deps, trail)
        if side and old_live is not None:
            # The switch: the live application takes the new config and Serve rolls it with a
            # surge (max_surge_percent): the new replica starts beside the old one, which serves
            # until its replacement is healthy. The route and the application's router never
            # change hands, so no request finds nobody to answer it (deleting the old app and
            # moving the route made HAProxy refuse a few: "router_unreachable"). The candidate,
            # which proved the config with a real completion, is removed by the same apply.
            old_app = attempt.status.app(old_live)
            since = old_app.last_deployed_time_s if old_app else None
            reach(f"switch {old_live} to revision {number}'s config")
            trail.switched = True
            live_body = served_as.with_api_key(api_key)
            put(apis.serve, [*attempt.others, live_body], manifest)
            result.app_name = old_live
            older = "" if decisions.revision_of_app(old_live) is None else " (the name an older orch gave it, kept: renaming would move the route)"
            step(f"{old_live}{older} on {attempt.route} takes revision {number}'s config: its new replica starts beside the old one, "
                 f"which serves until the new one is healthy; candidate {app.name} removed")  # fmt: skip
            reach(f"wait for {old_live} to take revision {number}'s config")
            wait_for_app(apis.serve, old_live, options.timeout_s, deps, options.poll_s, since=since,
                         watch=StartWatch(manifest, link.runners, link.nodes, deps.progress))  # fmt: skip
            reach(f"readiness probe of {old_live} on {attempt.route}")
            check_ready(apis, attempt.route, desired.served_name, api_key, deps, options)
            step(f"{old_live} serves revision {number}; the old replica is gone")
        reach("route the front to every model")
        settle_front(manifest, apis, deps, options, step, attempt.others, live_body, api_key)
        reach("record the revision as ready")
        state.update_revision(name, number, "ready")
        if attempt.current is not None and attempt.current.number != number:
            state.update_revision(name, attempt.current.number, "rolled_back" if desired.rollback_of is not None else "superseded")
    except BaseException as exc:  # every way out puts the previous revision back
        _fail(attempt, link, deps, trail, exc)
    _calibrate(attempt, link, deps, trail)
    # A count-only change starts no engine of a new config: the model's cold load stays the one measured before.
    cold = attempt.serving.cold_load_s if attempt.decision.kind in decisions.LIGHT else result.cold_load_s
    meta.update({"step": "done", "cold_load_s": cold, "first_token_s": result.first_token_s})
    state.save_revision_meta(name, number, meta)
    result.config = served_as.app
    return result


def _gate(manifest: Manifest, deps: ServingDeps, decision: decisions.Decision, serving: decisions.Serving, desired: Desired,
          options: RolloutOptions) -> GatePlan | None:  # fmt: skip
    """--slo-gate: the load the candidate must carry (refused up front when there is none)."""
    if not options.slo_gate or decision.kind == decisions.NOOP:
        return None
    if decision.kind != decisions.SIDE_BY_SIDE:
        raise UsageError(
            f"--slo-gate measures a candidate beside the live revision before the switch; this rollout is {decision.kind} ({decision.reason})",
            hint="free room for a second copy, or roll out without --slo-gate",
        )
    entry = recorded_load(deps.state, manifest.name, serving.revision) if serving.revision is not None else None
    return plan_gate(entry, manifest.objective, serving.revision, candidate_replicas(desired.rendered.app))


def _run_gate(gate: GatePlan, app: RenderedApp, attempt: Attempt, apis: ClusterApis, deps: ServingDeps, trail: Trail) -> None:
    """Send the gate's load to the candidate's route and judge it; the measurement is the
    candidate revision's load record. A miss is a Failure: the live revision keeps serving."""
    trail.step(f"SLO gate: {app.name} gets {gate.describe()}")
    bench = apis.endpoint.load(app.app["route_prefix"], attempt.desired.served_name, attempt.api_key, gate)
    levels = levels_of(bench)
    measured = levels[0] if levels else LoadLevel(f"concurrency={gate.concurrency}", gate.concurrency, None, 0, 0, 1.0, 0.0, None, None, None)
    why = judge_gate(gate, measured)
    figures = gate_figures(gate, measured)
    trail.result.slo_gate = {"plan": gate.to_dict(), "measured": measured.to_dict(), "passed": not why, "misses": why,
                             "stopped_early": measured.requests < gate.requests}  # fmt: skip
    trail.meta["slo_gate"] = trail.result.slo_gate
    # The candidate's measurement becomes its revision's record (the level the next gate holds to).
    record = deps.state.get_revision(attempt.manifest.name, trail.number)
    if record is not None and levels:
        entry = record_load(deps.state, record, levels, shape_of(bench), gate.candidate_replicas, attempt.manifest.objective,
                            "slo gate", deps.wall_clock())  # fmt: skip
        trail.meta["load"] = entry
    if why:
        raise Failure(f"SLO gate: {app.name} misses the objective at {gate.describe()}", f"{figures}: {'; '.join(why)}")
    trail.step(f"SLO gate passed: {figures}")


def _calibrate(attempt: Attempt, link: Link, deps: ServingDeps, trail: Trail) -> None:
    """The revision serves: record what its engines logged (after the gate, outside the restore's
    reach; a failure to read is said, never raised)."""
    result = trail.result
    try:
        app = link.apis.serve.status().app(result.app_name or trail.app_name)
    except OrchError as exc:
        trail.step(f"calibration: could not read Serve's status ({exc.message}); the rollout stands, `orch status` tries again")
        return
    outcome = calibrate_rollout(deps.state, attempt.manifest, link.runners, link.nodes, app, trail.number, attempt.desired.plan,
                                link.apis.actors)
    result.calibration, result.calibration_note = outcome.record, outcome.note
    trail.meta["calibration"] = outcome.note
    trail.step(outcome.note)


def _fail(attempt: Attempt, link: Link, deps: ServingDeps, trail: Trail, exc: BaseException) -> None:
    """Put the previous revision back, record what happened, raise the error to report.

    A second interrupt during the restore is not caught: the revision stays pending and the next
    rollout repairs it. A restore that cannot reach Serve leaves it pending for the same reason."""
    state, name = deps.state, attempt.manifest.name
    number, app_name, meta, step, applied = trail.number, trail.app_name, trail.meta, trail.step, trail.applied
    what, detail = what_failed(exc)
    if isinstance(exc, Failure) and (not detail or "Traceback" in detail):
        try:
            detail = replica_log_error(attempt.manifest, link.runners, link.nodes, link.apis.serve.status().app(app_name)) or detail
        except Exception:
            pass
    error = what + (f": {detail}" if detail else "")
    if applied:
        step(f"revision {number} failed ({what}): putting revision {attempt.restore.revision or '-'} back")
        plan = attempt.restore
        if trail.switched and plan.config is not None:
            # The live application holds (some of) the new config: roll back with the surge the
            # switch had (there was room for two copies), not the one it last ran with.
            plan = replace(plan, surge_percent=max_surge_of(attempt.desired.rendered.app))
        try:
            restored = restore(plan, attempt.manifest, link.apis, deps, attempt.options, step)
        except Exception as again:
            unreached = getattr(again, "message", None) or str(again)
            meta.update({"error": error, "restore_error": unreached})
            state.save_revision_meta(name, number, meta)
            raise RolloutFailed(
                f"revision {number} failed: {error}; putting revision {attempt.restore.revision} back failed too: {unreached}",
                hint="the revision stays pending: the next `orch rollout` (or `orch rollback`) repairs it; see " + runbook("ROLLOUT_INTERRUPTED"),
            ) from exc
    else:
        restored = attempt.serving.live  # nothing was applied: what served still serves
    state.update_revision(name, number, "failed", error=error)
    if restored and attempt.current is not None:
        state.update_revision(name, attempt.current.number, "ready")  # an interrupt may have come after it was superseded
    meta.update({"error": error, "restored": restored})
    state.save_revision_meta(name, number, meta)
    back = f"revision {attempt.serving.revision} is serving" if restored else "nothing is serving"
    if isinstance(exc, KeyboardInterrupt):
        raise RolloutInterrupted(f"revision {number} interrupted; {back}", hint=RUNBOOK, rolled_back=restored) from None
    if not isinstance(exc, Exception):
        raise exc
    # A known cause (a replica that failed to start in a way no retry fixes) names its own runbook.
    hint = exc.hint if isinstance(exc, Failure) and exc.hint else RUNBOOK
    raise RolloutFailed(f"revision {number} failed: {error}; {back}", hint=hint, rolled_back=restored) from (None if isinstance(exc, Failure) else exc)
