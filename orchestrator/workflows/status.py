"""The serving part of `orch status`: gather its inputs over the existing seams. Does I/O.

- Serve's application status: ``serve.ray_io.client.open_serve_client`` over the head's runner (an SSH
  tunnel to the dashboard on the head's 127.0.0.1) with the cluster's token.
- The engine's KV-cache capacity line: read on the replica's node through its runner, from the
  replica's worker log (``workflows.engine_logs``). A replica's capacity never changes, so it is
  read once per replica (``StatusDeps.capacity_cache``). The same lines give predicted vs
  measured memory (``workflows.calibration``; the rollout records it first, status again).
- The engine's metrics: vLLM under Ray Serve LLM publishes them through Ray's metrics agent of
  the replica's node (``ray_vllm_*`` names, label ``ReplicaId``). Ray lists every metrics export
  address in ``<temp_dir>/prom_metrics_service_discovery.json`` on the head (read through the
  head's runner); the pages of the engine nodes are fetched through each node's runner
  (``forward``: an SSH tunnel, or the port itself on a local node) with httpx.
- The time window of TTFT/TPOT: each scrape's vLLM lines are kept under
  ``<state_dir>/clusters/<name>/serving-metrics/<unix ms>.prom``; the next status diffs against
  the oldest kept scrape inside ``window_s`` (default 5 minutes), and without one reports the
  figures since the engines started (see docs/status.md). Older scrapes are deleted.
- Readiness: one real completion (``max_tokens`` 1) to the public endpoint with the API key from
  the environment variable named by ``serve.api_key_env``; its latency is the wall time. It is
  sent first, in a daemon thread (``start_probe``; `orch status` starts it before reading the
  nodes), so its wait overlaps the reads instead of adding to them. A healthy engine gets the
  probe's whole timeout; when the reads show every engine replica failing, status waits only
  ``status.probe_budget``'s grace for it (measured: the probe hung its whole 20 s timeout after a
  tensor-parallel worker's host died, most of what one `orch status` took during that outage).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from orchestrator import cluster_lock
from orchestrator import engine_metrics as prom
from orchestrator.bench.target import parse_discovery
from orchestrator.cluster.node_state import DashboardFormatError
from orchestrator.errors import OrchError, RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.serve.ray_io import readiness
from orchestrator.serve.ray_io.client import open_serve_client
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.status.engine_stats import keep_metric_lines, pick_baseline, start_up_lines
from orchestrator.status.probe_budget import BROKEN_GRACE_S, probe_wait_s
from orchestrator.status.serving import build_serving_status, model_of_deployment, pick_app, revision_app
from orchestrator.status.views import NodeRef, ServingStatus
from orchestrator.status.workers import (
    ACTORS_PARAMS,
    ACTORS_PATH,
    ActorRecord,
    EngineWorker,
    engine_workers,
    parse_actors,
)
from orchestrator.workflows.calibration import record_calibration, stored_for
from orchestrator.workflows.engine_logs import (
    NO_WORKER_ID,
    LogTarget,
    engine_replicas,
    read_logs,
    replica_target,
    worker_targets,
)
from orchestrator.workflows.served_models import served_app_name, serving_by_name

DISCOVERY_FILE = "prom_metrics_service_discovery.json"
DEFAULT_WINDOW_S = 300.0

RunnerOpener = Callable[[Manifest], AbstractContextManager[Mapping[str, Runner]]]


def fetch_text(url: str, timeout: float) -> str:
    """GET a page (the metrics pages); raises OrchError when it cannot."""
    import httpx

    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise OrchError(f"{url}: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        raise OrchError(f"{url}: HTTP {resp.status_code}")
    return resp.text


def probe_public(base_url: str, model: str, api_key: str | None, timeout: float) -> ProbeResult:
    """The readiness probe (``serve.ray_io.readiness``) on the public route of the endpoint."""
    return readiness.probe_completion(base_url, "/", model, api_key, timeout)


def _open_serve(runner: Runner, port: int, token: str | None) -> AbstractContextManager[Any]:
    return open_serve_client(runner, port, token)


@dataclass
class StatusDeps:
    """What the serving status needs from the outside world (real ones by default)."""

    state: Any  # orchestrator.state.StateStore
    open_runners: RunnerOpener
    open_serve: Callable[[Runner, int, str | None], AbstractContextManager[Any]] = _open_serve
    fetch: Callable[[str, float], str] = fetch_text
    probe: Callable[[str, str, str | None, float], ProbeResult] = probe_public
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    wall_clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    # (node, worker id, pid) -> the replica's start-up lines (capacity, DP rank: engine_stats.start_up_lines)
    capacity_cache: dict[tuple[str, str, int | None], tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_cluster(cls, deps: Any, capacity_cache: dict | None = None) -> StatusDeps:
        """Reuse a ``workflows.cluster.ClusterDeps`` (its state store and runner opener); pass the
        same ``capacity_cache`` dict on every refresh of ``--watch`` to read each log only once."""
        out = cls(state=deps.state, open_runners=deps.open_runners)
        if capacity_cache is not None:
            out.capacity_cache = capacity_cache
        return out


@dataclass(frozen=True)
class ServingOptions:
    window_s: float = DEFAULT_WINDOW_S
    probe: bool = True
    probe_timeout_s: float = 20.0  # a 1-token completion; an idle CPU engine answers in < 1 s
    http_timeout_s: float = 15.0
    keep_scrapes: bool = True
    # how long to wait for the probe when every engine replica is already failing (probe_budget)
    probe_grace_s: float = BROKEN_GRACE_S
    # what the probe may take beyond its own timeout (httpx's timeout is per phase, not in total)
    probe_slack_s: float = 5.0


class PendingProbe:
    """The readiness completion running in a daemon thread: a probe hung on a broken engine never
    keeps the process alive after the report is printed."""

    def __init__(self, send: Callable[[], ProbeResult], model: str, url: str, clock: Callable[[], float]) -> None:
        self.model, self.url, self._clock = model, url, clock
        self.started = clock()
        self._future: Future[ProbeResult] = Future()
        threading.Thread(target=self._run, args=(send,), name="orch-status-probe", daemon=True).start()

    def _run(self, send: Callable[[], ProbeResult]) -> None:
        self._future.set_running_or_notify_cancel()
        try:
            self._future.set_result(send())
        except BaseException as exc:  # handed to the waiting thread by result(), which re-raises it
            self._future.set_exception(exc)

    def result(self, wait_s: float, why: str) -> ProbeResult:
        """The probe's result, or a timed-out one when it has not answered within ``wait_s``."""
        try:
            return self._future.result(timeout=max(0.0, wait_s))
        except FutureTimeout:
            took = self._clock() - self.started
            return ProbeResult(False, took, None, f"no answer after {took:.1f} s{why}", self.url, self.model, timed_out=True)


def start_probe(manifest: Manifest, deps: StatusDeps, options: ServingOptions) -> PendingProbe | None:
    """Send the readiness completion now, for the serving revision's model (None when no revision
    names one, or probing is off): ``gather_serving`` collects it at the end."""
    if not options.probe:
        return None
    revision = deps.state.current_revision(manifest.name)
    model_ids = revision_app(revision)[1] if revision is not None else []
    if not model_ids:
        return None
    endpoint, model = manifest.serve_url(), model_ids[0]
    key = deps.environ.get(manifest.serve.api_key_env) or None
    return PendingProbe(lambda: deps.probe(endpoint, model, key, options.probe_timeout_s), model, endpoint, deps.monotonic)



def gather_serving(
    manifest: Manifest,
    deps: StatusDeps,
    nodes: list[NodeRef],
    options: ServingOptions = ServingOptions(),
    probe_sent: PendingProbe | None = None,
) -> ServingStatus:
    """Everything the serving section shows (see the module doc); failures of one input become
    problems or notes of the report, never an exception, except a broken state database.
    ``probe_sent``: the probe `start_probe` sent already (else it is sent here, before the reads)."""
    name = manifest.name
    if probe_sent is None:
        probe_sent = start_probe(manifest, deps, options)
    revision = deps.state.current_revision(name)
    # A pending revision is either in flight (a rollout holds the cluster's lock) or was left by
    # an orch that stopped in the middle: say which.
    pending_revs = [(r.number, (deps.state.revision_meta(name, r.number) or {}).get("step"))
                    for r in deps.state.list_revisions(name) if r.status == "pending"]  # fmt: skip
    holder = cluster_lock.holder(deps.state.cluster_dir(name)) if pending_revs else None
    token = deps.state.read_token(name)
    app_name, model_ids, _ = revision_app(revision) if revision is not None else (None, [], {})
    endpoint = manifest.serve_url()
    serve = None
    serve_error = None
    engine_logs: dict[str, list[str]] = {}
    log_errors: dict[str, str] = {}
    metrics_now = metrics_before = None
    window = None
    metrics_error = None
    actors: list[ActorRecord] = []
    workers: dict[str, list[EngineWorker]] = {}
    with deps.open_runners(manifest) as runners:
        head = runners.get(manifest.head.name)
        try:
            if head is None:
                raise OrchError(f"no runner for the head {manifest.head.name}")
            with deps.open_serve(head, manifest.ray.dashboard_port, token) as client:
                serve = client.status()
                actors = _actors(client, manifest)
        except (OrchError, RemoteError) as exc:
            serve_error = (f"cannot read Serve's status from the head's dashboard: {exc.message}", exc.hint)
        app = pick_app(serve, app_name) if serve is not None else None
        engines = engine_replicas(app, model_ids) if app is not None else []
        workers = {r.replica_id: engine_workers(r.actor_name, actors) for r in engines}
        by_id = {n.node_id: n for n in nodes if n.node_id}
        # What the rollout recorded for this revision is shown as it is; without a record (the
        # rollout could not read the logs) status records it, with the engine workers' lines too
        # (vLLM's Ray executor: weights and KV memory are logged by the worker actors).
        stored = stored_for(deps.state, name, revision.number) if revision is not None else None
        engine_logs, log_errors, worker_lines = _engine_logs(manifest, runners, by_id, engines,
                                                             {} if stored is not None else workers, deps)  # fmt: skip
        calibration_logs = {} if stored is not None else {rid: lines + worker_lines.get(rid, []) for rid, lines in engine_logs.items()}
        if engines and head is not None:
            try:
                text = _scrape(manifest, runners, head, {r.node_ip for r in engines if r.node_ip}, by_id, engines, deps, options)
                metrics_now = prom.parse_text(text)
                metrics_before, window = _baseline_and_keep(deps, name, text, options)
            except (OrchError, RemoteError, prom.MetricsFormatError) as exc:
                metrics_error = getattr(exc, "message", str(exc))
    build = partial(
        build_serving_status, serve, revision=revision, engine_logs=engine_logs, log_errors=log_errors,
        metrics_now=metrics_now, metrics_before=metrics_before, window_s=window, nodes=nodes,
        endpoint=endpoint, serve_error=serve_error, metrics_error=metrics_error,
        pending=pending_revs, rollout_holder=holder.describe() if holder else None, engine_workers=workers,
        objective=manifest.objective,
        served={n: (r.number, served_app_name(deps.state, r)) for n, r in serving_by_name(deps.state, name).items()},
    )  # fmt: skip
    report = build(probe=None)
    if options.probe and serve is not None and app is not None:
        model = (model_ids or [m for m in (model_of_deployment(d.name) for d in app.deployments) if m] or [None])[0]
        if model is not None:
            report = build(probe=_collect_probe(manifest, deps, options, report, probe_sent, model))
    if stored is None and revision is not None:
        stored = record_calibration(deps.state, name, revision.number, revision.plan, calibration_logs)
    return replace(report, calibration=stored)


def _collect_probe(manifest: Manifest, deps: StatusDeps, options: ServingOptions, report: ServingStatus,
                   sent: PendingProbe | None, model: str) -> ProbeResult:  # fmt: skip
    """The probe's result: the one sent at the start (waited for as ``probe_budget`` says), or one
    sent now when none was (no revision named the model)."""
    key = deps.environ.get(manifest.serve.api_key_env) or None
    if sent is not None and sent.model == model:
        remaining = options.probe_timeout_s + options.probe_slack_s - (deps.monotonic() - sent.started)
        wait = probe_wait_s(report, remaining, options.probe_grace_s)
        why = "; not waited for longer: every engine replica is failing (see the replicas)" if wait < remaining else ""
        probe = sent.result(wait, why)
    else:
        probe = deps.probe(manifest.serve_url(), model, key, options.probe_timeout_s)
    if key is None and probe.status_code == 401:
        probe = ProbeResult(False, probe.latency_s, 401, f"${manifest.serve.api_key_env} is not set", probe.url, model)
    return probe


def _actors(client: Any, manifest: Manifest) -> list[ActorRecord]:
    """Ray's actor list (where each engine worker runs) on GPU clusters; the CPU layout's mp
    executor has no worker actors. A failure leaves the workers out, never the rest."""
    if manifest.accelerator == "cpu":
        return []
    try:
        return parse_actors(client.get_json(ACTORS_PATH, ACTORS_PARAMS))
    except (OrchError, DashboardFormatError):
        return []


def _engine_logs(manifest: Manifest, runners: Mapping[str, Runner], by_id: Mapping[str, NodeRef], engines: list[Any],
                 workers: Mapping[str, list[EngineWorker]], deps: StatusDeps,
                 ) -> tuple[dict[str, list[str]], dict[str, str], dict[str, list[str]]]:  # fmt: skip
    """({replica id: the capacity lines of its worker log}, {replica id: why not}, {replica id:
    its engine workers' lines}), all read in one scan per node. A replica read before (the same
    process) comes from the cache; a worker log that cannot be read is left out."""
    logs: dict[str, list[str]] = {}
    errors: dict[str, str] = {}
    worker_lines: dict[str, list[str]] = {}
    todo: list[tuple[str, tuple | None, LogTarget]] = []  # (replica id, cache key or None for a worker, log)
    node_of = {nid: ref.name for nid, ref in by_id.items()}
    for rep in engines:
        found, _ = worker_targets(workers.get(rep.replica_id, []), node_of)
        todo += [(rep.replica_id, None, t) for t in found]
        ref = by_id.get(rep.node_id)
        if ref is None:
            errors[rep.replica_id] = f"node {rep.node_ip or rep.node_id or '?'} of replica {rep.replica_id} is not a manifest node"
            continue
        key = (ref.name, rep.worker_id or rep.replica_id, rep.pid)
        cached = deps.capacity_cache.get(key)
        if cached is not None:
            logs[rep.replica_id] = list(cached)
            continue
        target = replica_target(ref.name, rep)
        if target is None:
            errors[rep.replica_id] = NO_WORKER_ID
            continue
        todo.append((rep.replica_id, key, target))
    for (rid, key, _), (lines, err) in zip(todo, read_logs(manifest, runners, [t for _, _, t in todo])):
        if key is None:
            worker_lines.setdefault(rid, []).extend(lines or [])
            continue
        if lines is not None:
            logs[rid] = lines
            if (known := start_up_lines(lines)) is not None:
                deps.capacity_cache[key] = known
        if err:
            errors[rid] = err
    order = [r.replica_id for r in engines]
    return {rid: logs[rid] for rid in order if rid in logs}, errors, worker_lines


def _scrape(manifest, runners, head, ips, by_id, engines, deps: StatusDeps, options: ServingOptions) -> str:
    """The metrics pages of the nodes running engines, concatenated."""
    path = f"{manifest.ray.temp_dir.rstrip('/')}/{DISCOVERY_FILE}"
    res = head.run(["cat", path], timeout=30)
    if not res.ok:
        raise OrchError(f"Ray's metrics discovery file {path} is not on the head (exit {res.exit_code})")

    targets = [u.removeprefix("http://").removesuffix("/metrics") for u in parse_discovery(res.stdout)]
    node_of_ip = {r.node_ip: by_id.get(r.node_id) for r in engines}
    pages, errors = [], []
    for target in targets:
        host, _, port = target.rpartition(":")
        if host not in ips:
            continue
        ref = node_of_ip.get(host)
        runner = runners.get(ref.name) if ref is not None else None
        via = runner or head
        try:
            local = via.forward(host, int(port))
            pages.append(deps.fetch(f"http://127.0.0.1:{local}/metrics", options.http_timeout_s))
        except (OrchError, RemoteError, OSError) as exc:
            errors.append(f"{target}: {getattr(exc, 'message', exc)}")
    if not pages:
        raise OrchError("no metrics page of the engine nodes could be read" + (f" ({'; '.join(errors)})" if errors else f" (discovery lists {targets or 'nothing'})"))
    return "\n".join(pages)


def _scrape_dir(deps: StatusDeps, cluster: str) -> Path:
    return Path(deps.state.cluster_dir(cluster)) / "serving-metrics"


def _baseline_and_keep(deps: StatusDeps, cluster: str, text: str, options: ServingOptions):
    """The kept scrape to diff against (parsed) and the window it spans; keep this one."""
    now = deps.wall_clock()
    folder = _scrape_dir(deps, cluster)
    kept: list[tuple[float, Path]] = []
    if folder.is_dir():
        for p in folder.glob("*.prom"):
            if p.stem.isdigit():
                kept.append((int(p.stem) / 1000.0, p))
    chosen = pick_baseline(kept, now, options.window_s)
    before = window = None
    if chosen is not None:
        try:
            before = prom.parse_text(chosen[1].read_text())
            window = now - chosen[0]
        except (OSError, prom.MetricsFormatError):
            before = None
    if options.keep_scrapes:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{int(now * 1000)}.prom").write_text(keep_metric_lines(text))
            for t, p in kept:
                if t < now - 2 * options.window_s:
                    p.unlink(missing_ok=True)
        except OSError:
            pass  # keeping is an optimisation: the next status reports since start instead
    return before, window
