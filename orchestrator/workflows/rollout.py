"""`orch rollout` and `orch rollback`: a model as a Ray Serve LLM application, health-gated.

I/O only through ``ServingDeps``: the state store, runners (model-path check, replica logs), the
Serve REST API and the dashboard's node list (through an SSH tunnel to the head in real use),
the public endpoint (readiness probe), a clock, a sleep and a progress callback. Decisions are
``orchestrator.serve.decisions.decide`` and ``fits``; configs come from ``orchestrator.serve.config``.

A rollout: render + validate -> decide (noop / fresh / side_by_side / in_place / refuse) ->
check the model path on the nodes -> record a pending revision -> apply -> watch the
application, deployment and replica states -> readiness (a real completion through the public
endpoint with the API key, and 401 without it) -> switch traffic -> record ready, the previous
one superseded. On DEPLOY_FAILED, no healthy replica within the timeout or a failed probe: the
previous revision is put back (side by side: it never stopped serving) and the error says what
failed, with the replica's own error from Serve's status message or its log on the node.

Per-revision details the state table has no column for (application name, route, cold-load
time, decision) go to ``<state_dir>/clusters/<name>/revisions/<n>.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.errors import RolloutFailed, StateError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.runbooks import runbook
from orchestrator.serve import decisions
from orchestrator.serve.client import APP_RUNNING, AppStatus, ServeStatus, failure_messages
from orchestrator.serve.config import PUBLIC_ROUTE, RenderedApp, deploy_body, mask_api_key
from orchestrator.serve.readiness import ProbeResult
from orchestrator.state import Revision, StateStore

RUNBOOK = runbook("ROLLOUT_FAILED")
Progress = Callable[[str], None]


class ServeApi(Protocol):
    def apply(self, body: Mapping[str, Any]) -> None: ...
    def status(self) -> ServeStatus: ...


class Endpoint(Protocol):
    """The public OpenAI endpoint (``readiness`` bound to one base URL)."""

    def probe(self, route_prefix: str, model: str, api_key: str | None) -> ProbeResult: ...
    def unauthenticated_status(self, route_prefix: str, model: str) -> int | None: ...


@dataclass
class ClusterApis:
    serve: ServeApi
    nodes: Callable[[], list]  # -> list[ray_cluster.NodeState] with usage
    endpoint: Endpoint


def _quiet(_message: str) -> None:
    pass


@dataclass
class ServingDeps:
    state: StateStore
    open_runners: Callable[[Manifest], AbstractContextManager[Mapping[str, Runner]]]
    open_apis: Callable[[Manifest, Mapping[str, Runner], str | None], AbstractContextManager[ClusterApis]]
    validate: Callable[[Mapping[str, Any]], None]
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    progress: Progress = _quiet


@dataclass(frozen=True)
class RolloutOptions:
    dry_run: bool = False
    allow_downtime: bool = False
    timeout_s: float = 900.0  # for the application to be RUNNING
    probe_timeout_s: float = 120.0  # for the first completion once RUNNING
    poll_s: float = 2.0
    check_model_path: bool = True


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


@dataclass
class RolloutResult:
    action: str
    decision: dict
    cluster: str
    revision: int | None = None
    previous_revision: int | None = None
    app_name: str | None = None
    endpoint: str | None = None
    model: str | None = None
    cold_load_s: float | None = None
    first_token_s: float | None = None
    config: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "decision": self.decision,
            "cluster": self.cluster,
            "revision": self.revision,
            "previous_revision": self.previous_revision,
            "app_name": self.app_name,
            "endpoint": self.endpoint,
            "model": self.model,
            "cold_load_s": self.cold_load_s,
            "first_token_s": self.first_token_s,
            "steps": self.steps,
            "plan": self.plan,
            "config": mask_api_key(self.config),
        }


class _Failure(Exception):
    def __init__(self, what: str, detail: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.detail = detail


# ------------------------------------------------------------------------------ revision details


def _meta_path(state: StateStore, cluster: str, number: int) -> Path:
    return state.cluster_dir(cluster) / "revisions" / f"{number}.json"


def save_meta(state: StateStore, cluster: str, number: int, meta: Mapping[str, Any]) -> None:
    path = _meta_path(state, cluster, number)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(meta), indent=1, sort_keys=True, default=str))


def load_meta(state: StateStore, cluster: str, number: int) -> dict[str, Any]:
    try:
        return json.loads(_meta_path(state, cluster, number).read_text())
    except (FileNotFoundError, ValueError):
        return {}


def serving_now(state: StateStore, cluster: str, status: ServeStatus) -> tuple[Revision | None, decisions.Serving]:
    current = state.current_revision(cluster)
    if current is None:
        return None, decisions.Serving()
    meta = load_meta(state, cluster, current.number)
    name = meta.get("app_name") or decisions.app_name(current.number)
    app = status.app(name)
    return current, decisions.Serving(
        revision=current.number,
        fingerprint=current.config_fingerprint,
        app_name=name,
        app_status=app.status if app else None,
        cold_load_s=meta.get("cold_load_s"),
    )


# ------------------------------------------------------------------------------ watching


def _settled(app: AppStatus, since: float | None) -> bool:
    """RUNNING, and when ``since`` is given (the deploy time before a config change): deployed
    after it, with every replica RUNNING (a surge leaves old replicas STOPPING for a while)."""
    if app.status != APP_RUNNING:
        return False
    if since is None:
        return True
    if app.last_deployed_time_s is None or app.last_deployed_time_s == since:
        return False
    return all(r.state == "RUNNING" for d in app.deployments for r in d.replicas)


def wait_for_app(serve: ServeApi, name: str, timeout_s: float, deps: ServingDeps, poll_s: float, since: float | None = None) -> AppStatus:
    """Poll Serve until ``name`` is RUNNING (and, with ``since``, has taken a newer config); the
    live view goes to ``deps.progress``."""
    deadline = deps.clock() + timeout_s
    last_line = ""
    app: AppStatus | None = None
    while True:
        app = serve.status().app(name)
        if app is not None:
            line = app.summary()
            if line != last_line:
                deps.progress(line)
                last_line = line
            if _settled(app, since):
                return app
            if app.failed:
                raise _Failure(f"application {name} is {app.status}", _app_error(app))
        if deps.clock() >= deadline:
            detail = _app_error(app) if app is not None else "Serve never listed the application"
            raise _Failure(f"no healthy replica of {name} within {timeout_s:g} s", detail)
        deps.sleep(poll_s)


def _last_error_line(text: str) -> str:
    """The exception line at the end of a traceback, else the last non-empty line."""
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith((" ", "\t")) and ("Error" in ln or "Exception" in ln):
            return ln.strip()
    return lines[-1].strip() if lines else ""


def _app_error(app: AppStatus | None) -> str | None:
    if app is None:
        return None
    messages = failure_messages(app)
    if not messages:
        # Not failed yet (still starting): say what each deployment waits for.
        waiting = [f"{d.name}: {d.message.strip()}" for d in app.deployments if d.message.strip()]
        return " | ".join(m.splitlines()[0] for m in waiting) or None
    return " | ".join(_last_error_line(m) for m in messages)


def replica_log_error(manifest: Manifest, runners: Mapping[str, Runner], nodes: list, app: AppStatus | None) -> str | None:
    """The last error line of a replica's log on its node (under the node's Ray session logs)."""
    if app is None:
        return None
    by_id = {getattr(n, "node_id", None): getattr(n, "name", None) for n in nodes}
    for dep in app.deployments:
        for rep in dep.replicas:
            node = by_id.get(rep.node_id)
            runner = runners.get(node) if node else None
            if runner is None or not rep.log_file_path:
                continue
            path = f"{manifest.ray.temp_dir.rstrip('/')}/session_latest/logs/{rep.log_file_path.lstrip('/')}"
            res = runner.run(["tail", "-n", "80", path], timeout=20)
            if res.ok and res.stdout.strip():
                line = _last_error_line(res.stdout)
                if line:
                    return f"{node}:{path}: {line}"
    return None


# ------------------------------------------------------------------------------ readiness


def check_ready(apis: ClusterApis, route: str, model: str, api_key: str, deps: ServingDeps, options: RolloutOptions) -> ProbeResult:
    """A real completion through ``route`` (retried until the probe timeout: the proxies learn a
    new route a moment after Serve says RUNNING), then the same without a key must get 401."""
    deadline = deps.clock() + options.probe_timeout_s
    while True:
        result = apis.endpoint.probe(route, model, api_key)
        if result.ok:
            break
        if deps.clock() >= deadline:
            raise _Failure(f"readiness probe failed on {result.url}", result.error)
        deps.sleep(options.poll_s)
    status = apis.endpoint.unauthenticated_status(route, model)
    if status != 401:
        raise _Failure(
            f"the endpoint answered {status} to a completion without the API key (expected 401)",
            "vLLM's api_key is not active: Serve LLM direct streaming must be on (RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1)",
        )
    return result


def node_cores(manifest: Manifest, runners: Mapping[str, Runner]) -> int | None:
    """The fewest cores (`nproc`) of the nodes, on a CPU cluster (a CPU engine's thread count)."""
    if manifest.accelerator != "cpu":
        return None
    counts = []
    for runner in runners.values():
        res = runner.run(["nproc"], timeout=20)
        if res.ok and res.stdout.strip().isdigit():
            counts.append(int(res.stdout.strip()))
    return min(counts) if counts else None


# ------------------------------------------------------------------------------ the rollout


def check_model_path(manifest: Manifest, runners: Mapping[str, Runner], source: str) -> None:
    """The model folder must exist (with its config.json) on every node that may host a worker."""
    if not source.startswith(("/", "~")):
        return  # a hub name: vLLM resolves it on the node
    missing = []
    for name, runner in runners.items():
        res = runner.run(["test", "-f", f"{source.rstrip('/')}/config.json"], timeout=20)
        if not res.ok:
            missing.append(name)
    if missing:
        raise _Failure(
            f"model path {source} does not exist on node(s) {', '.join(sorted(missing))} (no {source.rstrip('/')}/config.json)",
            "copy the model to the same path on every node (the manifest's model_store), or pass --model PATH",
        )


# (Ray nodes with usage, [] when unknown; cores of the smallest node, None when unknown) -> Desired
DesiredFactory = Callable[[list, "int | None"], Desired]


def execute(manifest: Manifest, build: DesiredFactory, api_key: str | None, deps: ServingDeps, options: RolloutOptions) -> RolloutResult:
    """Decide and carry out a rollout of what ``build`` renders (shared by rollout and rollback)."""
    cluster = deps.state.get_cluster(manifest.name)
    if cluster is None or cluster.state != "up":
        if options.dry_run:
            desired = build([], None)
            deps.validate(desired.rendered.app)
            decision = decisions.Decision(decisions.FRESH, f"cluster {manifest.name!r} is not up: this is the config a first rollout would apply")
            return RolloutResult(action="dry_run:" + decision.kind, decision=decision.to_dict(), cluster=manifest.name,
                                 model=desired.served_name, config=desired.rendered.app, plan=desired.plan)  # fmt: skip
        raise StateError(f"cluster {manifest.name!r} is not up", hint=f"run `orch up {manifest.source_path or 'CLUSTER_YAML'}` first")
    if not options.dry_run and not api_key:
        raise UsageError(
            f"no API key: the environment variable {manifest.serve.api_key_env} is not set",
            hint=f"export {manifest.serve.api_key_env}=<a long random string> (the endpoint requires it)",
        )
    token = deps.state.read_token(manifest.name) if manifest.ray.token_auth else None
    with deps.open_runners(manifest) as runners, deps.open_apis(manifest, runners, token) as apis:
        nodes = apis.nodes()
        desired = build(nodes, node_cores(manifest, runners))
        deps.validate(desired.rendered.app)
        status = apis.serve.status()
        current, serving = serving_now(deps.state, manifest.name, status)
        fingerprint = desired.rendered.fingerprint(api_key)
        groups, strategy = decisions.copy_demand(desired.rendered.llm_config)
        room = decisions.fits(groups, strategy, decisions.free_resources(nodes))
        downtime = decisions.estimate_cold_load_s(manifest.accelerator, desired.weights_gib_per_node, serving.cold_load_s)
        decision = decisions.decide(fingerprint, serving, room, options.allow_downtime, downtime)
        result = RolloutResult(
            action=decision.kind, decision=decision.to_dict(), cluster=manifest.name, model=desired.served_name,
            previous_revision=serving.revision, config=desired.rendered.app, plan=desired.plan,
        )  # fmt: skip
        if decision.kind == decisions.NOOP:
            result.revision, result.app_name = serving.revision, serving.app_name
            return result
        if decision.kind == decisions.REFUSE:
            raise UsageError(decision.reason, hint="rerun with --allow-downtime to replace it in place, or free capacity")
        if options.dry_run:
            result.action = "dry_run:" + decision.kind
            return result
        return _carry_out(manifest, desired, api_key, fingerprint, decision, current, serving, status, runners, apis, nodes, deps, options, result)


def _carry_out(manifest, desired, api_key, fingerprint, decision, current, serving, status, runners, apis, nodes, deps, options, result):
    state, name = deps.state, manifest.name
    number = state.next_revision(name)
    app = desired.rendered.renamed(decisions.app_name(number), PUBLIC_ROUTE)
    side = decision.kind == decisions.SIDE_BY_SIDE
    old_live = serving.app_name if serving.live else None
    # What the revision serves as: side by side, the live application takes its config at the
    # switch (the candidate on its own route is only the proof), so that is what is recorded.
    served_as = app.renamed(old_live, PUBLIC_ROUTE) if side and old_live else app
    if side:
        app = app.renamed(app.name, decisions.candidate_route(number))
    rev = state.add_revision(name, desired.model, plan=desired.plan, config_fingerprint=fingerprint, config=served_as.app)
    number = rev.number
    result.revision, result.app_name = number, app.name
    meta: dict[str, Any] = {"app_name": app.name, "decision": decision.to_dict(), "served_name": desired.served_name,
                            "model_source": desired.model_source, "rollback_of": desired.rollback_of, "steps": result.steps}  # fmt: skip
    old_config = status.app(old_live).deployed_config if old_live else None

    def step(text: str) -> None:
        result.steps.append(text)
        deps.progress(text)

    applied = False
    try:
        if options.check_model_path:
            check_model_path(manifest, runners, desired.model_source)
        keep = [old_config] if side and old_config else []
        t_apply = deps.clock()
        applied = True
        apis.serve.apply(deploy_body([*keep, app.with_api_key(api_key)], manifest))
        step(f"applied {app.name} on {app.app['route_prefix']} ({decision.kind})")
        wait_for_app(apis.serve, app.name, options.timeout_s, deps, options.poll_s)
        probe = check_ready(apis, app.app["route_prefix"], desired.served_name, api_key, deps, options)
        result.cold_load_s = round(deps.clock() - t_apply, 2)
        result.first_token_s = probe.first_token_s
        step(f"{app.name} answered a completion ({probe.output_tokens} tokens) {result.cold_load_s:.1f} s after the apply")
        if side:
            # The switch: the live application takes the new config and Serve rolls it with a
            # surge (max_surge_percent): the new replica starts beside the old one, which serves
            # until its replacement is healthy. The route and the application's router never
            # change hands, so no request finds nobody to answer it (deleting the old app and
            # moving the route made HAProxy refuse a few: "router_unreachable"). The candidate,
            # which proved the config with a real completion, is removed by the same apply.
            since = status.app(old_live).last_deployed_time_s
            apis.serve.apply(deploy_body([served_as.with_api_key(api_key)], manifest))
            result.app_name = meta["app_name"] = old_live
            step(f"{old_live} on {PUBLIC_ROUTE} takes revision {number}'s config: its new replica starts beside the old one, "
                 f"which serves until the new one is healthy; candidate {app.name} removed")  # fmt: skip
            wait_for_app(apis.serve, old_live, options.timeout_s, deps, options.poll_s, since=since)
            check_ready(apis, PUBLIC_ROUTE, desired.served_name, api_key, deps, options)
            step(f"{old_live} serves revision {number}; the old replica is gone")
    except _Failure as failure:
        detail = failure.detail
        if not detail or "Traceback" in (detail or ""):
            logged = replica_log_error(manifest, runners, nodes, apis.serve.status().app(app.name))
            detail = logged or detail
        if applied:
            restored = _restore(manifest, side, old_config, current, api_key, apis, deps, options, step)
        else:
            restored = serving.live  # nothing was applied: what served still serves
        error = failure.what + (f": {detail}" if detail else "")
        state.update_revision(name, number, "failed", error=error)
        meta.update({"error": error, "restored": restored})
        save_meta(state, name, number, meta)
        back = f"revision {serving.revision} is serving" if restored else "nothing is serving"
        raise RolloutFailed(f"revision {number} failed: {error}; {back}", hint=f"see {RUNBOOK}", rolled_back=restored) from None
    state.update_revision(name, number, "ready")
    if current is not None and current.number != number:
        state.update_revision(name, current.number, "rolled_back" if desired.rollback_of is not None else "superseded")
    meta.update({"cold_load_s": result.cold_load_s, "first_token_s": result.first_token_s})
    save_meta(state, name, number, meta)
    result.config = served_as.app
    return result


def _restore(manifest, side, old_config, current, api_key, apis, deps, options, step) -> bool:
    """Put the previous revision back. Side by side: re-apply the old app alone (it kept serving).
    Otherwise: deploy the previous revision's stored config again and wait for it."""
    if side and old_config:
        apis.serve.apply(deploy_body([old_config], manifest))
        step(f"removed the failed revision; {old_config.get('name')} kept serving")
        return True
    if current is None:
        apis.serve.apply(deploy_body([], manifest))
        step("removed the failed revision; no earlier revision to restore")
        return False
    meta = load_meta(deps.state, manifest.name, current.number)
    old = RenderedApp(app=dict(current.config)).renamed(meta.get("app_name") or decisions.app_name(current.number), PUBLIC_ROUTE)
    apis.serve.apply(deploy_body([old.with_api_key(api_key)], manifest))
    step(f"redeploying revision {current.number} ({old.name})")
    try:
        wait_for_app(apis.serve, old.name, options.timeout_s, deps, options.poll_s)
        check_ready(apis, PUBLIC_ROUTE, meta.get("served_name") or current.model, api_key, deps, options)
    except _Failure as again:
        step(f"revision {current.number} did not come back: {again.what}")
        return False
    return True
