"""The steps a rollout takes on the cluster, and how the serving revision is put back. Does I/O,
only through ``ServingDeps`` (state store, runners, Serve REST API, public endpoint, clocks).

- ``put``: one PUT of the full application list, refused while any value is still a secret
  placeholder; a restore's PUT is retried until its deadline (the PUT is declarative, so a
  repeat is harmless).
- ``wait_for_app``: Serve's application, deployment and replica states until RUNNING; a status
  call that gets no answer or a 5xx (dashboard busy, SSH tunnel re-dialling) is retried until
  the deadline, not taken for a failed rollout; a replica that failed to start in a way no retry
  fixes (``start_failures``) fails it at once, without waiting for Serve's retries.
- ``check_ready``: a real completion through a route with the API key, and 401 without it.
- ``serving_now``: what the state says serves, and how Serve sees its application (the
  application's name comes from the database; when it is not known the rollout refuses).
- ``RestorePlan`` / ``restore``: the previous revision's application exactly as it ran (Serve's
  deployed config, secrets and key included) or, when Serve lost it, its stored config with the
  secrets put back; restoring = one PUT of it alone, then waiting until it serves again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.errors import ServeError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.engine_features import LORA_RANKS
from orchestrator.polling import poll_until
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.serve import decisions, node_hooks
from orchestrator.serve.config import PUBLIC_ROUTE, RenderedApp, deploy_body, with_max_surge
from orchestrator.serve.lora import ADAPTER_CONFIG, adapter_rank, adapters_of
from orchestrator.serve.ray_io.client import APP_RUNNING, AppStatus, ServeApiError, ServeStatus, failure_messages
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.serve.shapes import llm_config_of, llm_configs
from orchestrator.state import Revision, StateStore
from orchestrator.workflows.node_files import install_serve_hooks, node_home
from orchestrator.workflows.secrets import fill_secrets, placeholder_paths, unfilled
from orchestrator.workflows.served_models import OtherModels, current_of, served_app_name, served_name_of
from orchestrator.workflows.start_failures import Stop, stop_text

Progress = Callable[[str], None]


class ServeApi(Protocol):
    def apply(self, body: Mapping[str, Any]) -> None: ...
    def status(self) -> ServeStatus: ...


class Endpoint(Protocol):
    """The public OpenAI endpoint (``readiness`` bound to one base URL)."""

    def probe(self, route_prefix: str, model: str, api_key: str | None) -> ProbeResult: ...
    def unauthenticated_status(self, route_prefix: str, model: str) -> int | None: ...
    def load(self, route_prefix: str, model: str, api_key: str, gate: Any) -> dict:
        """The SLO gate's load (``serve.slo_gate.GatePlan``) through a route: a bench results dict."""
        ...


@dataclass
class ClusterApis:
    serve: ServeApi
    nodes: Callable[[], list]  # -> list[cluster.ray_nodes.NodeState] with usage
    endpoint: Endpoint
    actors: Callable[[], list] | None = None  # -> list[status.workers.ActorRecord] (the engine workers' pids)


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
    environ: Mapping[str, str] = field(default_factory=dict)  # where secrets of stored configs come from


@dataclass(frozen=True)
class RolloutOptions:
    dry_run: bool = False
    allow_downtime: bool = False
    timeout_s: float = 900.0  # for the application to be RUNNING
    probe_timeout_s: float = 120.0  # for the first completion once RUNNING
    poll_s: float = 2.0
    check_model_path: bool = True
    command: str = "rollout"  # what the cluster lock says holds it
    slo_gate: bool = False  # the candidate must meet the manifest's slo at the live revision's recorded level


class Failure(Exception):
    """A step of the rollout failed: ``what`` happened, ``detail`` is the replica's own error,
    ``hint`` what to do about it when the cause is known (it ends with the cause's runbook)."""

    def __init__(self, what: str, detail: str | None = None, hint: str | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.detail = detail
        self.hint = hint


def transient(exc: BaseException) -> bool:
    """A Serve API error worth another try: nothing answered (tunnel, dashboard restarting) or a 5xx."""
    return isinstance(exc, ServeApiError) and (exc.status_code is None or exc.status_code >= 500)


# ------------------------------------------------------------------------------ applying


def put(serve: ServeApi, apps: list[dict], manifest: Manifest, deps: ServingDeps | None = None, deadline: float | None = None) -> None:
    """PUT ``apps`` (the full list). Refuses a body with a secret placeholder left in it. With a
    ``deadline`` (restores), transient errors are retried until it."""
    left = placeholder_paths({"applications": apps})
    if left:
        raise UsageError(
            f"refusing to deploy a config that still holds a redacted secret: {', '.join(left)}",
            hint="export the variable (or set it in the manifest's env) so orch can put the real value back",
        )
    while True:
        try:
            serve.apply(deploy_body(apps, manifest))
            return
        except ServeError as exc:
            if deps is None or deadline is None or not transient(exc) or deps.clock() >= deadline:
                raise
            deps.progress(f"Serve did not take the PUT ({exc.message}); retrying")
            deps.sleep(1.0)


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


def wait_for_app(serve: ServeApi, name: str, timeout_s: float, deps: ServingDeps, poll_s: float, since: float | None = None,
                 watch: Callable[[AppStatus], Stop | None] | None = None) -> AppStatus:  # fmt: skip
    """Poll Serve until ``name`` is RUNNING (and, with ``since``, has taken a newer config); the
    live view goes to ``deps.progress``. Transient status errors are retried until the deadline.
    ``watch`` (``start_failures.StartWatch``) sees the application on each poll until it has
    settled: a replica that failed to start in a way no retry fixes ends the wait at once."""
    shown: list[str] = []

    def attempt() -> tuple[AppStatus | None, str | None]:
        try:
            return serve.status().app(name), None
        except ServeError as exc:
            if not transient(exc):
                raise
            if not shown or not shown[-1].startswith("Serve's status"):
                shown.append(f"Serve's status did not answer ({exc.message}); retrying until the deadline")
                deps.progress(shown[-1])
            return None, exc.message

    def done(value: tuple[AppStatus | None, str | None]) -> bool:
        app, unanswered = value
        if app is None or unanswered is not None:
            return False
        line = app.summary()
        if not shown or shown[-1] != line:
            shown.append(line)
            deps.progress(line)
        if _settled(app, since):
            return True
        stop = watch(app) if watch is not None else None
        if app.failed:
            if stop is not None:  # Serve gave up before a poll saw it retrying: still name the cause
                what, detail, hint = stop_text(name, stop)
                raise Failure(f"application {name} is {app.status}: {what}", detail, hint)
            raise Failure(f"application {name} is {app.status}", _app_error(app))
        if stop is not None:
            raise Failure(*stop_text(name, stop))
        return False

    polled = poll_until(attempt, done, deadline=deps.clock() + timeout_s, clock=deps.clock, sleep=deps.sleep, interval=poll_s)
    app, unanswered = polled.value
    if polled.done and app is not None:
        return app
    if unanswered is not None:
        raise Failure(f"no healthy replica of {name} within {timeout_s:g} s", f"Serve's status did not answer: {unanswered}")
    detail = _app_error(app) if app is not None else "Serve never listed the application"
    raise Failure(f"no healthy replica of {name} within {timeout_s:g} s", detail)


def last_error_line(text: str) -> str:
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
    return " | ".join(last_error_line(m) for m in messages)


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
                line = last_error_line(res.stdout)
                if line:
                    return f"{node}:{path}: {line}"
    return None


# ------------------------------------------------------------------------------ readiness


def check_ready(apis: ClusterApis, route: str, model: str, api_key: str, deps: ServingDeps, options: RolloutOptions) -> ProbeResult:
    """A real completion through ``route`` (retried until the probe timeout: the proxies learn a
    new route a moment after Serve says RUNNING), then the same without a key must get 401."""
    polled = poll_until(lambda: apis.endpoint.probe(route, model, api_key), lambda r: r.ok,
                        deadline=deps.clock() + options.probe_timeout_s, clock=deps.clock, sleep=deps.sleep,
                        interval=options.poll_s)  # fmt: skip
    result = polled.value
    if not polled.done:
        raise Failure(f"readiness probe failed on {result.url}", result.error)
    status = apis.endpoint.unauthenticated_status(route, model)
    if status != 401:
        raise Failure(
            f"the endpoint answered {status} to a completion without the API key (expected 401)",
            "vLLM's api_key is not active: Serve LLM direct streaming must be on (RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1)",
        )
    return result


def probe_adapters(apis: ClusterApis, route: str, app: Mapping[str, Any], api_key: str) -> list[str]:
    """A real completion naming each LoRA adapter ``app`` serves, through ``route`` once the base
    answered. A runtime adapter that fails to load (a rank above the slots', a missing S3 object)
    leaves the replica serving its base and logs why (orch_serve_hooks: ADAPTER_FAILED_LINE),
    so only this probe finds it. Returns the adapters' names."""
    names = [a.name for a in adapters_of(app)]
    for name in names:
        result = apis.endpoint.probe(route, name, api_key)
        if not result.ok:
            raise Failure(f"LoRA adapter {name} did not answer on {result.url}: {result.error}",
                          f"the replica's log says why (`orch logs`, the line '{node_hooks.ADAPTER_FAILED_LINE}'): a rank above "
                          "the engine's max_lora_rank (--max-lora-rank), a missing adapter_config.json, an unreachable S3 store")  # fmt: skip
    return names


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


def nodes_without(runners: Mapping[str, Runner], path: str) -> list[str]:
    """The nodes (sorted) where ``path`` is not a file: one ``test -f`` per node, all nodes at once.
    A node that cannot be reached raises its RemoteError."""
    outcomes = fan_out(list(runners.values()), lambda r: r.run(["test", "-f", path], timeout=20).ok)
    for o in outcomes:
        if o.error is not None:
            raise o.error
    return sorted(o.node for o in outcomes if not o.value)


def check_model_path(manifest: Manifest, runners: Mapping[str, Runner], source: str) -> None:
    """The model folder must exist (with its config.json) on every node that may host a worker."""
    if not source.startswith(("/", "~")):
        return  # a hub name: vLLM resolves it on the node
    missing = nodes_without(runners, f"{source.rstrip('/')}/config.json")
    if missing:
        raise Failure(
            f"model path {source} does not exist on node(s) {', '.join(missing)} (no {source.rstrip('/')}/config.json)",
            "put it on every node with `orch model sync CLUSTER.yaml --model NAME` (or `orch rollout --sync-model`); "
            "orch never copies it unasked",
        )


def check_adapter_paths(manifest: Manifest, runners: Mapping[str, Runner], app: Mapping[str, Any]) -> None:
    """Every LoRA adapter the application serves from the nodes' disks (``serve.lora``) must be
    there, with its adapter_config.json, on every node; and its rank must fit the engine's
    max_lora_rank (vLLM refuses a larger one when it loads the adapter). An S3 adapter is fetched
    on the replica's node (orch's module), so it is not checked here: ``probe_adapters`` is."""
    configs = llm_configs(app)
    limit = (configs[0].get("engine_kwargs") or {}).get("max_lora_rank") if configs else None
    for adapter in adapters_of(app):
        if adapter.remote:
            continue
        config_path = f"{adapter.source.rstrip('/')}/{ADAPTER_CONFIG}"
        missing = nodes_without(runners, config_path)
        if missing:
            raise Failure(
                f"LoRA adapter {adapter.name}: {adapter.source} does not exist on node(s) {', '.join(missing)} (no {config_path})",
                hint="put it on every node with `orch model sync CLUSTER.yaml --model FOLDER` (or give an s3:// source); orch never copies it unasked",
            )
        first = runners[sorted(runners)[0]] if runners else None
        res = first.run(["cat", config_path], timeout=20) if first is not None else None
        rank = adapter_rank(res.stdout) if res is not None and res.ok else None
        if rank is not None and isinstance(limit, int) and rank > limit:
            fit = next((r for r in LORA_RANKS if r >= rank), rank)
            raise Failure(f"LoRA adapter {adapter.name} has rank {rank} ({config_path}), above the engine's max_lora_rank {limit}: "
                          "vLLM would refuse it", hint=f"add --max-lora-rank {fit} (the LoRA slots grow with it: a new engine)")  # fmt: skip


def put_serve_hooks(manifest: Manifest, runners: Mapping[str, Runner], app: Mapping[str, Any]) -> None:
    """orch's Serve LLM module on every node, before an apply whose application imports it (its
    builder or its callback, ``serve.node_hooks``): `orch up` writes it too, but a cluster an
    older orch started has none (or an older one), and an application whose builder or callback
    does not import never starts."""
    if not node_hooks.app_needs_module(app):
        return
    failed = [o for o in fan_out(list(runners.values()), lambda r: install_serve_hooks(r, manifest, node_home(r))) if not o.ok]
    if failed:
        raise Failure(
            "could not write orch's Serve hook module on node(s) "
            + "; ".join(f"{o.node}: {o.error.message if o.error else ''}" for o in failed),
            hint=f"the module goes to ~/.orch/nodes/{manifest.name}/python/{node_hooks.MODULE}.py of the SSH user; "
            "check that the home folder is writable and the disk not full",
        )


# ------------------------------------------------------------------------------ what serves


def serving_now(state: StateStore, cluster: str, status: ServeStatus, served_name: str | None = None,
                others: OtherModels | None = None) -> tuple[Revision | None, decisions.Serving]:  # fmt: skip
    """The revision serving ``served_name`` (None: the newest ready one) and how Serve sees its
    application. ``running_apps``: the RUNNING applications a fresh deploy of it would replace
    (every one but the other models' ``others``)."""
    current = current_of(state, cluster, served_name)
    theirs = set(others.apps) if others is not None else set()
    live = tuple(sorted(n for n, a in status.applications.items() if a.status == APP_RUNNING and n not in theirs))
    if current is None:
        return None, decisions.Serving(running_apps=live)
    meta = state.revision_meta(cluster, current.number) or {}
    name = served_app_name(state, current)
    app = status.app(name) if name else None
    return current, decisions.Serving(
        revision=current.number,
        fingerprint=current.config_fingerprint,
        app_name=name,
        app_status=app.status if app else None,
        cold_load_s=meta.get("cold_load_s"),
        running_apps=live,
    )


# ------------------------------------------------------------------------------ putting it back


@dataclass(frozen=True)
class RestorePlan:
    """How to put back what served when the rollout began. ``config`` is the application with
    its real secrets and key (never stored, never printed); None when nothing served or it cannot
    be rebuilt, ``why_not`` then says why."""

    revision: int | None = None
    app_name: str | None = None
    config: dict | None = field(default=None, repr=False)
    served_name: str | None = None
    was_live: bool = False
    why_not: str | None = None
    # The surge Serve rolls back with (serve.config.with_max_surge): 0 where the cluster has no
    # room for two copies; None: the config as it is.
    surge_percent: int | None = None
    route: str = PUBLIC_ROUTE  # where the model's application answers
    # The other models' applications as Serve runs them: every PUT of the restore carries them.
    others: tuple[dict, ...] = field(default=(), repr=False)

    def body(self) -> dict | None:
        """The application to PUT to put it back: ``config`` with the restore's surge."""
        if self.config is None or self.surge_percent is None:
            return self.config
        return with_max_surge(self.config, self.surge_percent)


def restore_plan(manifest: Manifest, current: Revision | None, serving: decisions.Serving, status: ServeStatus,
                 api_key: str, deps: ServingDeps, others: tuple[dict, ...] = ()) -> RestorePlan:  # fmt: skip
    """The previous revision's application as Serve runs it now, or rebuilt from its record;
    ``others``: the other models' applications, carried by every PUT of the restore."""
    if current is None:
        return RestorePlan(why_not="no earlier revision", others=others)
    if serving.app_name is None:
        return RestorePlan(current.number, why_not=f"the Serve application of revision {current.number} is not recorded", others=others)
    served = served_name_of(deps.state, manifest.name, current)
    running = status.app(serving.app_name)
    if running is not None and running.deployed_config:
        # As Serve runs it (re-applying it changes nothing); a placeholder an older orch deployed
        # there gets its real value.
        deployed = fill_secrets(running.deployed_config, manifest.env, deps.environ)
        if not unfilled(deployed):
            return RestorePlan(current.number, serving.app_name, deployed, served, serving.live,
                               route=running.route_prefix or PUBLIC_ROUTE, others=others)  # fmt: skip
    filled = fill_secrets(current.config, manifest.env, deps.environ)
    left = unfilled(filled)
    route = str(current.config.get("route_prefix") or PUBLIC_ROUTE)
    taken = {str(c.get("route_prefix")) for c in others}
    if route in taken:  # another model took this route after this revision was recorded there
        route = decisions.model_route(served, taken)
    app = RenderedApp(app=filled).renamed(serving.app_name, route)
    if left:
        return RestorePlan(current.number, serving.app_name, None, served, serving.live, route=route, others=others,
                           why_not=f"revision {current.number}'s stored config needs secrets orch does not keep: {', '.join(left)}")  # fmt: skip
    return RestorePlan(current.number, serving.app_name, app.with_api_key(api_key), served, serving.live, route=route, others=others)


def _status(serve: ServeApi, deps: ServingDeps, deadline: float) -> ServeStatus:
    """Serve's status, transient errors retried until ``deadline``."""
    while True:
        try:
            return serve.status()
        except ServeError as exc:
            if not transient(exc) or deps.clock() >= deadline:
                raise
            deps.sleep(1.0)


def restore(plan: RestorePlan, manifest: Manifest, apis: ClusterApis, deps: ServingDeps, options: RolloutOptions, step: Progress) -> bool:
    """Make Serve run the previous revision's application beside the other models' (every other
    application orch put there for this model goes) and wait until it answers; True when it
    serves again. Serve unreachable until the deadline raises (the caller leaves the revision
    pending for the repair)."""
    deadline = deps.clock() + options.timeout_s
    if plan.config is None:
        put(apis.serve, list(plan.others), manifest, deps, deadline)
        step(f"removed the new revision; {plan.why_not or 'nothing to restore'}")
        return False
    body = plan.body()
    before = _status(apis.serve, deps, deadline).app(str(plan.app_name))
    # Its config changed (an interrupted switch, an in-place update of the same application):
    # Serve rolls it back; wait for that deploy, not for the RUNNING it reports before it has begun.
    since = before.last_deployed_time_s if before is not None and before.deployed_config != body else None
    put(apis.serve, [*plan.others, body], manifest, deps, deadline)
    step(f"putting revision {plan.revision} back ({plan.app_name})")
    api_key = llm_config_of(plan.config)["engine_kwargs"]["api_key"][0]
    try:
        wait_for_app(apis.serve, str(plan.app_name), options.timeout_s, deps, options.poll_s, since=since)
        check_ready(apis, plan.route, str(plan.served_name), api_key, deps, options)
    except Failure as again:
        step(f"revision {plan.revision} did not come back: {again.what}")
        return False
    step(f"revision {plan.revision} serves ({plan.app_name})")
    return True


def what_failed(exc: BaseException) -> tuple[str, str | None]:
    """What went wrong and its hint, from whatever ended a rollout."""
    if isinstance(exc, Failure):
        return exc.what, exc.detail
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C or SIGTERM)", None
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {message}", getattr(exc, "hint", None)
