"""The serving part of `orch status`, built. Pure, no I/O (the values are in ``status.views``,
the parsers in ``engine_stats``).

Inputs (gathered by ``orchestrator.workflows.status``):
- Serve's application status (``serve.ray_io.client.parse_serve_status`` of the dashboard's
  ``GET /api/serve/applications/``): application, deployments, replicas with node and worker ids;
- the engine's start-up lines from each replica's worker log, where vLLM prints its KV-cache
  capacity (``parse_kv_capacity``; every known wording, see its docstring);
- the engine's Prometheus metrics (``engine_metrics.parse_text``), now and, when one was kept, from a
  scrape up to ``window_s`` ago: live KV-cache usage, running and waiting requests, and TTFT/TPOT
  percentiles of the requests finished between the two scrapes (``live_metrics``);
- the current revision record (``state.Revision``) and a readiness probe (``ProbeResult``: a real
  completion with its latency);
- the nodes section of `orch status` (which Ray node id is which manifest node, dead or alive).

``build_serving_status`` joins them into ``ServingStatus``; every dead node, unhealthy replica,
application not running, or failed probe becomes a ``Problem`` whose hint ends with its runbook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from orchestrator import engine_metrics as prom
from orchestrator.runbooks import runbook
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.serve.shapes import is_engine_deployment, llm_configs, model_of_deployment, shape_of_deployment
from orchestrator.status.engine_stats import (
    LiveMetrics,
    kv_capacity_from_metrics,
    live_metrics,
    parse_dp_rank,
    parse_kv_capacity,
    prefix_cache_by_replica,
    replica_gauges,
)
from orchestrator.status.views import (
    DeploymentView,
    ModelView,
    NodeRef,
    Problem,
    ReplicaView,
    RevisionView,
    ServedModelView,
    ServingStatus,
    SloView,
    WorkerView,
)

# Problem codes (each has runbooks/<CODE>.md).
REPLICA_UNHEALTHY = "REPLICA_UNHEALTHY"
SERVE_APP_NOT_RUNNING = "SERVE_APP_NOT_RUNNING"
ENDPOINT_PROBE_FAILED = "ENDPOINT_PROBE_FAILED"
NODE_HEARTBEAT_LOST = "NODE_HEARTBEAT_LOST"  # the doctor's code for a node Ray marked dead
NODE_UNREACHABLE = "NODE_UNREACHABLE"
SERVE_API_ERROR = "SERVE_API_ERROR"  # the rollout code's runbook for a failing Serve REST API
ENGINE_DEAD = "ENGINE_DEAD"
ROLLOUT_INTERRUPTED = "ROLLOUT_INTERRUPTED"

# The codes this module introduces (code -> title), for the runbooks index and its test.
CODES: dict[str, str] = {
    REPLICA_UNHEALTHY: "A Serve replica or deployment is not healthy",
    SERVE_APP_NOT_RUNNING: "The serving revision's Serve application is not RUNNING",
    ENDPOINT_PROBE_FAILED: "A real completion through the public endpoint failed",
    ROLLOUT_INTERRUPTED: "A rollout stopped before it finished (killed, interrupted, disconnected)",
}

# Replica states that are on their way (warn) rather than broken (fail).
REPLICA_TRANSIENT = ("STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION")
APP_TRANSIENT = ("DEPLOYING", "NOT_STARTED")


def node_refs(section: Any) -> list[NodeRef]:
    """``NodeRef``s from ``orchestrator.status.nodes.NodesSection`` (duck-typed: rows with name,
    node_id, ray_state, reachable, detail)."""
    return [NodeRef(r.name, r.node_id, r.ray_state, r.reachable, r.detail) for r in getattr(section, "rows", [])]


def revision_app(revision: Any) -> tuple[str | None, list[str], dict[str, int]]:
    """From a revision record: its application name, model ids and max_model_len per model
    (read from the stored config, which is the rendered Serve application)."""
    config = getattr(revision, "config", None) or {}
    name = getattr(revision, "app_name", None) or (config.get("name") if isinstance(config, Mapping) else None)
    models: list[str] = []
    lens: dict[str, int] = {}
    for llm in llm_configs(config) if isinstance(config, Mapping) else []:
        if not isinstance(llm, Mapping):
            continue
        mid = (llm.get("model_loading_config") or {}).get("model_id")
        if mid:
            models.append(str(mid))
            mml = (llm.get("engine_kwargs") or {}).get("max_model_len")
            if isinstance(mml, int):
                lens[str(mid)] = mml
    if not models and getattr(revision, "model", None):
        models.append(str(revision.model))
    # No name recorded: None, and the application on the public route is the one reported
    # (pick_app). A name is never derived from the revision's number: the public application's
    # name does not say which revision it serves.
    return name, models, lens


def revision_batches(revision: Any) -> dict[str, int]:
    """max_num_seqs per model id, from the revision's stored config (absent: vLLM's default)."""
    config = getattr(revision, "config", None) or {}
    out: dict[str, int] = {}
    for llm in llm_configs(config) if isinstance(config, Mapping) else []:
        if isinstance(llm, Mapping):
            mid = (llm.get("model_loading_config") or {}).get("model_id")
            seqs = (llm.get("engine_kwargs") or {}).get("max_num_seqs")
            if mid and isinstance(seqs, int):
                out[str(mid)] = seqs
    return out


def pick_app(serve: Any, wanted: str | None) -> Any:
    """The application to report: the revision's, else the one on the public route "/", else the
    only one."""
    apps = dict(getattr(serve, "applications", {}) or {})
    if wanted is not None:
        return apps.get(wanted)
    public = [a for a in apps.values() if a.route_prefix == "/"]
    if len(public) == 1:
        return public[0]
    return next(iter(apps.values())) if len(apps) == 1 else None


def _problem(severity: str, code: str, subject: str, message: str, advice: str) -> Problem:
    """A problem whose hint is ``advice`` followed by its runbook."""
    return Problem(severity, code, subject, message, f"{advice}; see {runbook(code)}" if advice else f"see {runbook(code)}")


def _with(detail: str | None, fmt: str = ": {}") -> str:
    detail = (detail or "").strip()
    return fmt.format(detail[:300]) if detail else ""


def _node_problems(nodes: Sequence[NodeRef]) -> list[Problem]:
    out = []
    for n in nodes:
        if n.ray_state == "DEAD":
            out.append(_problem("fail", NODE_HEARTBEAT_LOST, n.name, f"node {n.name} is DEAD in Ray{_with(n.detail)}",
                                "its replicas are gone until it rejoins: `orch up` restarts Ray there"))  # fmt: skip
        elif not n.reachable:
            sev = "warn" if n.ray_state == "ALIVE" else "fail"
            out.append(_problem(sev, NODE_UNREACHABLE, n.name, f"node {n.name} does not answer over SSH{_with(n.detail, ' ({})')}",
                                "its engine logs cannot be read"))  # fmt: skip
    return out


def _app_problems(app: Any) -> list[Problem]:
    if app.status == "RUNNING":
        return []
    transient = app.status in APP_TRANSIENT
    advice = "it is still coming up" if transient else "the previous revision may be gone: `orch rollback` or `orch rollout`"
    return [_problem("warn" if transient else "fail", SERVE_APP_NOT_RUNNING, app.name,
                     f"application {app.name} is {app.status}{_with(app.message)}", advice)]  # fmt: skip


def _worker_views(workers: Sequence[Any], by_id: Mapping[str, NodeRef]) -> tuple[WorkerView, ...]:
    out = []
    for w in workers:
        ref = by_id.get(w.node_id) if w.node_id else None
        out.append(WorkerView(w.rank, ref.name if ref else w.node_id, w.node_id, w.pid, w.state))
    return tuple(out)


def _deployment_view(
    d: Any,
    by_id: Mapping[str, NodeRef],
    engine_logs: Mapping[str, Sequence[str]],
    log_errors: Mapping[str, str],
    workers: Mapping[str, Sequence[Any]] | None = None,
    metrics_now: Sequence[prom.Sample] | None = None,
) -> tuple[DeploymentView, list[Problem]]:
    """A deployment with its replicas (node names, capacity and DP rank from their logs, engine
    workers and their nodes, KV usage now) and its problems."""
    replicas, problems = [], []
    for r in d.replicas:
        ref = by_id.get(r.node_id)
        lines = engine_logs.get(r.replica_id)
        engine = is_engine_deployment(d.name)
        view = ReplicaView(
            replica_id=r.replica_id, deployment=d.name, state=r.state, node=ref.name if ref else r.node_ip,
            node_id=r.node_id, node_state=ref.ray_state if ref else None, pid=r.pid, worker_id=r.worker_id, start_time_s=r.start_time_s,
            capacity=parse_kv_capacity(lines) if lines is not None else None, log_error=log_errors.get(r.replica_id),
            workers=_worker_views((workers or {}).get(r.replica_id, ()), by_id),
            dp=parse_dp_rank(lines) if lines is not None else None,
            gauges=replica_gauges(metrics_now, r.replica_id) if engine and metrics_now is not None else None,
        )  # fmt: skip
        replicas.append(view)
        lost = [w for w in view.workers if w.state != "ALIVE" or (w.node_id and by_id.get(w.node_id) and by_id[w.node_id].ray_state == "DEAD")]
        if lost and not (ref is not None and ref.ray_state == "DEAD"):
            where = ", ".join(
                f"{w.rank or '?'} on {w.node or '?'} ({'node DEAD' if w.state == 'ALIVE' else w.state})" for w in lost
            )
            problems.append(_problem("fail", REPLICA_UNHEALTHY, r.replica_id,
                                     f"replica {r.replica_id} of {d.name} lost engine workers: {where}",
                                     "Serve restarts the replica on the nodes left; `orch up` heals a dead node"))  # fmt: skip
        if ref is not None and ref.ray_state == "DEAD":
            problems.append(_problem("fail", NODE_HEARTBEAT_LOST, r.replica_id,
                                     f"replica {r.replica_id} of {d.name} sits on node {ref.name}, which is DEAD",
                                     "Serve replaces it once the node is gone for good"))  # fmt: skip
        elif r.state != "RUNNING":
            sev = "warn" if r.state in REPLICA_TRANSIENT else "fail"
            where = f" on {view.node}" if view.node else ""
            problems.append(_problem(sev, REPLICA_UNHEALTHY, r.replica_id, f"replica {r.replica_id} of {d.name} is {r.state}{where}",
                                     "`orch doctor` reads its logs"))  # fmt: skip
    if d.status in ("UNHEALTHY", "DEPLOY_FAILED"):
        problems.append(_problem("fail", REPLICA_UNHEALTHY, d.name, f"deployment {d.name} is {d.status}{_with(d.message)}",
                                 "`orch doctor` names the cause from the replica's logs"))  # fmt: skip
    deployment = DeploymentView(d.name, d.status, d.message, d.target_replicas, tuple(replicas), getattr(d, "max_ongoing_requests", None))
    return deployment, problems


def _gang_problems(view: DeploymentView) -> list[Problem]:
    """A data-parallel group serves only while every one of its ranks runs: Serve's DPServer
    deployment restarts the whole group when one rank fails (``RESTART_GANG``). One problem per
    group that is not whole and RUNNING, naming each rank that is not, and where it is. (Any
    shape whose replicas form gangs: ``shapes.AppShape.gang``.)"""
    shape = shape_of_deployment(view.name)
    if shape is None or not shape.gang:
        return []
    groups: dict[str, list[ReplicaView]] = {}
    for r in view.replicas:
        groups.setdefault(r.dp.group if r.dp else "?", []).append(r)
    out = []
    for group, members in groups.items():
        size = max((r.dp.size for r in members if r.dp), default=None)
        down = [r for r in members if r.state != "RUNNING"]
        missing = (size - len(members)) if size is not None and len(members) < size else 0
        if not down and not missing:
            continue
        where = ", ".join(f"rank {r.dp.rank if r.dp else '?'} {r.state}{f' on {r.node}' if r.node else ''}" for r in down)
        if missing:
            where = ", ".join(x for x in (where, f"{missing} rank(s) not in Serve") if x)
        name = f"data-parallel group {group}" if group != "?" else "a data-parallel group (ranks not logged yet)"
        running = len(members) - len(down)
        transient = all(r.state in REPLICA_TRANSIENT for r in down) and not missing
        out.append(_problem("warn" if transient else "fail", REPLICA_UNHEALTHY, f"{view.name} group {group}",
                            f"{name} of {view.name} does not serve: {running} of {size or len(members)} ranks RUNNING ({where})",
                            "Serve restarts the whole group when one rank fails (RESTART_GANG) and it serves again once "
                            "every rank runs; `orch doctor` reads the ranks' logs"))  # fmt: skip
    return out


def _probe_problem(probe: ProbeResult) -> Problem:
    code = probe.status_code
    if code in (401, 403):
        why = "the endpoint refused the API key: export the key in the variable named by serve.api_key_env"
    elif code is None and probe.timed_out:
        why = "the request got no answer in time: the engine is stuck, restarting or overloaded (see the replicas above)"
    elif code is None:
        why = "nothing answered on the Serve port: is the application RUNNING and the port open?"
    elif code in (502, 503):
        why = "Serve has no replica to route to (starting, or all unhealthy)"
    elif code >= 500:
        why = f"the engine failed the request: `orch doctor` looks for a dead engine ({runbook(ENGINE_DEAD)})"
    else:
        why = "the endpoint answered, but not with a completion"
    detail = f"HTTP {code}" if code is not None else (probe.error or "no answer")
    if code is not None and probe.error:
        detail += f": {probe.error}"
    return Problem("fail", ENDPOINT_PROBE_FAILED, "endpoint",
                   f"readiness completion to {probe.url or 'the endpoint'} failed ({detail})",
                   f"{why}; see {runbook(ENDPOINT_PROBE_FAILED)}")  # fmt: skip


def build_serving_status(
    serve: Any | None,
    revision: Any | None = None,
    probe: ProbeResult | None = None,
    engine_logs: Mapping[str, Sequence[str]] | None = None,
    log_errors: Mapping[str, str] | None = None,
    metrics_now: Sequence[prom.Sample] | None = None,
    metrics_before: Sequence[prom.Sample] | None = None,
    window_s: float | None = None,
    nodes: Sequence[NodeRef] = (),
    endpoint: str | None = None,
    serve_error: tuple[str, str | None] | None = None,
    metrics_error: str | None = None,
    pending: Sequence[tuple[int, str | None]] = (),
    rollout_holder: str | None = None,
    engine_workers: Mapping[str, Sequence[Any]] | None = None,
    objective: Any | None = None,
    served: Mapping[str, tuple[int, str | None]] | None = None,
) -> ServingStatus:
    """Join the inputs (see the module doc). ``serve``: a ``serve.ray_io.client.ServeStatus`` (None when
    the dashboard could not be read; ``serve_error`` = (message, hint) then). ``engine_logs``:
    replica id -> the engine lines read from its worker log; ``log_errors``: replica id -> why not.
    ``pending``: (number, step reached) of revisions recorded as pending; ``rollout_holder``: who
    holds the cluster's lock (a rollout in flight), None when nobody does.
    ``engine_workers``: replica id -> its engine's Ray worker actors (``status.workers``).
    ``objective``: the manifest's latency objective (``Manifest.objective``), for ``SloView``.
    ``served``: served name -> (its revision, its application) for every model the cluster serves."""
    engine_logs = engine_logs or {}
    log_errors = log_errors or {}
    problems: list[Problem] = _node_problems(nodes)
    notes: list[str] = []
    problems.extend(_interrupted_problems(pending, rollout_holder, revision, notes))
    app_name, model_ids, max_lens = revision_app(revision) if revision is not None else (None, [], {})
    batches = revision_batches(revision) if revision is not None else {}
    rev_view = (
        RevisionView(revision.number, revision.model, revision.status, revision.config_fingerprint,
                     getattr(revision, "created_at", None), getattr(revision, "finished_at", None))  # fmt: skip
        if revision is not None
        else None
    )
    if revision is None:
        notes.append("no revision is recorded as serving: `orch rollout` deploys one")
    if serve_error is not None:
        message, hint = serve_error
        problems.append(_problem("fail", SERVE_API_ERROR, "serve", message, hint or ""))
    app = pick_app(serve, app_name) if serve is not None else None
    by_id = {n.node_id: n for n in nodes if n.node_id}
    deployments: list[DeploymentView] = []
    if serve is not None and app is None and (revision is not None or serve.applications):
        wanted = app_name or "an application on route /"
        problems.append(_problem("fail", SERVE_APP_NOT_RUNNING, wanted, f"Serve runs no application {wanted}",
                                 "redeploy it with `orch rollout` (or `orch rollback`)"))  # fmt: skip
    if app is not None:
        problems.extend(_app_problems(app))
        for d in app.deployments:
            view, found = _deployment_view(d, by_id, engine_logs, log_errors, engine_workers, metrics_now)
            found.extend(_gang_problems(view))
            deployments.append(view)
            problems.extend(found)
    if not model_ids:
        model_ids = [m for m in (model_of_deployment(d.name) for d in deployments) if m]
    models = []
    caches: dict[str, Any] = {}
    for mid in model_ids:
        engine_replicas = _engine_replicas(deployments, mid, single=len(model_ids) == 1)
        capacity = next((r.capacity for r in engine_replicas if r.capacity is not None and r.state == "RUNNING"), None)
        capacity = capacity or next((r.capacity for r in engine_replicas if r.capacity is not None), None)
        ids = [r.replica_id for r in engine_replicas if r.state == "RUNNING"] or None
        live = None
        if metrics_now is not None:
            live = live_metrics(metrics_now, metrics_before, mid, ids, window_s)
            if capacity is None:
                capacity = kv_capacity_from_metrics(_filter_ids(metrics_now, ids), mid)
        if capacity is None and engine_replicas:
            why = "; ".join(sorted({r.log_error for r in engine_replicas if r.log_error}))
            if not why:
                starting = all(r.state != "RUNNING" for r in engine_replicas)
                why = "not logged yet: the engine is starting" if starting else "no 'KV cache size' line in its worker log"
            notes.append(f"{mid}: KV-cache capacity unknown ({why})")
        distinct = {r.capacity.tokens for r in engine_replicas if r.capacity is not None}
        if len(distinct) > 1:
            notes.append(f"{mid}: replicas logged different KV-cache sizes: {sorted(t for t in distinct if t is not None)}")
        if metrics_now is not None:
            caches.update(prefix_cache_by_replica(metrics_now, mid, [r.replica_id for r in engine_replicas]))
        cap = next((d.max_ongoing_requests for d in deployments if model_of_deployment(d.name) == mid), None)
        models.append(ModelView(mid, max_lens.get(mid), capacity, live, slo=slo_view(live, objective),
                                max_num_seqs=batches.get(mid), max_ongoing_requests=cap))
    if caches:
        deployments = [replace(d, replicas=tuple(replace(r, prefix_cache=caches.get(r.replica_id)) for r in d.replicas)) for d in deployments]
    if metrics_error:
        notes.append(f"engine metrics unavailable: {metrics_error}")
    elif metrics_now is not None and models and all(m.live is None for m in models):
        notes.append("the metrics page has no vLLM series (yet): Ray exports them a few seconds after the engine starts")
    if probe is not None and not probe.ok:
        problems.append(_probe_problem(probe))
    others = tuple(sorted((n, a.status) for n, a in (serve.applications.items() if serve is not None else ()) if app is None or n != app.name))
    return ServingStatus(
        served_models=served_models(serve, served or {}, nodes),
        app_name=app.name if app is not None else app_name,
        app_status=app.status if app is not None else None,
        app_message=app.message if app is not None else "",
        route_prefix=app.route_prefix if app is not None else None,
        endpoint=endpoint,
        revision=rev_view,
        deployments=tuple(deployments),
        models=tuple(models),
        probe=probe,
        problems=tuple(problems),
        other_apps=others,
        notes=tuple(notes),
    )


def served_models(serve: Any | None, served: Mapping[str, tuple[int, str | None]], nodes: Sequence[NodeRef]) -> tuple[ServedModelView, ...]:
    """Every served model with its application's state and engine replicas (``served``: served
    name -> (revision, application name))."""
    apps = dict(getattr(serve, "applications", {}) or {}) if serve is not None else {}
    node_of = {n.node_id: n.name for n in nodes if n.node_id}
    out = []
    for name, (number, app_name) in sorted(served.items()):
        app = apps.get(app_name) if app_name else None
        replicas = tuple(
            (r.replica_id, r.state, node_of.get(r.node_id) or r.node_ip, r.start_time_s)
            for d in (app.deployments if app is not None else ()) if is_engine_deployment(d.name) for r in d.replicas
        )  # fmt: skip
        out.append(ServedModelView(name, number, app_name, app.status if app is not None else None,
                                   app.route_prefix if app is not None else None, replicas))  # fmt: skip
    return tuple(out)


def slo_view(live: LiveMetrics | None, objective: Any | None) -> SloView | None:
    """The live p95s (ms) against the objective; None without an objective."""
    if objective is None:
        return None
    ttft = live.ttft.p95 * 1000.0 if live is not None and live.ttft is not None and live.ttft.count and live.ttft.p95 is not None else None
    tpot = live.tpot.p95 * 1000.0 if live is not None and live.tpot is not None and live.tpot.count and live.tpot.p95 is not None else None
    misses = []
    if objective.ttft_p95_ms is not None and ttft is not None and ttft > objective.ttft_p95_ms:
        misses.append(f"TTFT p95 {ttft:.0f} ms > {objective.ttft_p95_ms:g} ms")
    if objective.tpot_p95_ms is not None and tpot is not None and tpot > objective.tpot_p95_ms:
        misses.append(f"TPOT p95 {tpot:.1f} ms > {objective.tpot_p95_ms:g} ms")
    judged = (objective.ttft_p95_ms is not None and ttft is not None) or (objective.tpot_p95_ms is not None and tpot is not None)
    return SloView(objective.ttft_p95_ms, objective.tpot_p95_ms, ttft, tpot, (not misses) if judged else None, tuple(misses))


def _interrupted_problems(pending: Sequence[tuple[int, str | None]], holder: str | None, revision: Any | None,
                          notes: list[str]) -> list[Problem]:  # fmt: skip
    """A pending revision while a rollout holds the lock is in flight (a note); without one, an
    orch stopped in the middle of it (a problem saying what the next rollout does about it)."""
    if not pending:
        return []
    if holder is not None:
        notes.append(f"a rollout is in progress: {holder} (revision {', '.join(str(n) for n, _ in pending)})")
        return []
    back = f"puts revision {revision.number} back" if revision is not None else "removes what it left"
    return [
        _problem("warn", ROLLOUT_INTERRUPTED, f"revision {number}",
                 f"revision {number} was interrupted at step '{step or 'before its first step'}': orch stopped before it finished "
                 "(killed, interrupted or disconnected), and Serve may still run what it left",
                 f"the next `orch rollout` or `orch rollback` repairs it: it {back} and records revision {number} as failed")  # fmt: skip
        for number, step in pending
    ]


def _filter_ids(samples: Sequence[prom.Sample], ids: Sequence[str] | None) -> list[prom.Sample]:
    if ids is None:
        return list(samples)
    return [s for s in samples if s.label(prom.REPLICA_LABEL) in (None, *ids)]


def _engine_replicas(deployments: Sequence[DeploymentView], model: str, single: bool) -> list[ReplicaView]:
    """The replicas that run ``model``'s engine: those of deployment ``LLMServer:<model>`` (a
    data-parallel application's ``DPServer:<model>``: one replica per rank); with a single model
    and no such name, those of any engine deployment, else every replica."""
    exact = [r for d in deployments if model_of_deployment(d.name) == model for r in d.replicas]
    if exact or not single:
        return exact
    servers = [r for d in deployments if is_engine_deployment(d.name) for r in d.replicas]
    return servers or [r for d in deployments for r in d.replicas]
