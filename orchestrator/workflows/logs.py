"""`orch logs`: which log files a user asked for, found with the finders status and the doctor
use, and their last lines (and, with --follow, what is written to them next). The I/O edge:
Serve and Ray's actor list through the head's dashboard, the files over each node's runner.

What can be asked for (``LogRequest``):

- a replica's log (the default: every engine replica of the serving application): the replica
  actor's worker log, where vLLM's engine writes (``engine_logs.replica_target``);
- an engine worker's log by rank (vLLM's Ray executor, GPU layout: one actor per GPU,
  ``engine_logs.worker_target``, ranks from ``status.workers.engine_workers``);
- a node's raylet (``raylet.out`` and ``raylet.err`` of the Ray session).

Files are located and read by the doctor's log scan on the node (``doctor/logscan.py``, through
``engine_logs.read_tails``): one scan per node; no other log finder. Following runs ``tail -F``
on each node over the same runners.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.node_state import DashboardFormatError, current_by_name
from orchestrator.errors import OrchError, RemoteError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner, Starter
from orchestrator.state import StateStore
from orchestrator.status.serving import pick_app, revision_app
from orchestrator.status.workers import ACTORS_PARAMS, ACTORS_PATH, engine_workers, parse_actors
from orchestrator.workflows.engine_logs import (
    LogTail,
    LogTarget,
    engine_replicas,
    read_tails,
    replica_target,
    worker_target,
)
from orchestrator.workflows.served_models import serving_by_name

RAYLET = ("raylet.out", "raylet.err")


@dataclass(frozen=True)
class LogRequest:
    kind: str = "replica"  # "replica" | "worker" | "raylet"
    replica: str | None = None  # a replica id (or its start)
    rank: int | None = None  # engine worker rank, 0-based in vLLM's order (pipeline stage, then TP rank)
    node: str | None = None  # only this manifest node
    tail: int = 100
    model: str | None = None  # the served name whose replicas (several models per cluster); None: the only one


@dataclass(frozen=True)
class LogSource:
    """One process whose log is shown: a label for the header and where its files are."""

    label: str
    target: LogTarget


@dataclass(frozen=True)
class LogsDeps:
    state: StateStore
    open_runners: Callable[[Manifest], AbstractContextManager[dict[str, Runner]]]
    open_serve: Callable[[Runner, int, str | None], AbstractContextManager[Any]]


def _raylet_sources(manifest: Manifest, request: LogRequest) -> list[LogSource]:
    nodes = [n.name for n in manifest.nodes if request.node in (None, n.name)]
    return [LogSource(f"raylet on {name}", LogTarget(name, RAYLET)) for name in nodes]


def _serving_sources(manifest: Manifest, request: LogRequest, deps: LogsDeps, runners: Mapping[str, Runner]) -> list[LogSource]:
    """The replicas (or their engine workers) of the serving application, from Serve's status and
    Ray's actor list read through the head's dashboard."""
    served = serving_by_name(deps.state, manifest.name)
    if request.model is not None and request.model not in served:
        raise UsageError(f"--model {request.model}: cluster {manifest.name} serves no model of that name",
                         hint="served: " + (", ".join(sorted(served)) or "none"))  # fmt: skip
    if request.model is None and len(served) > 1:
        raise UsageError(f"cluster {manifest.name} serves {len(served)} models ({', '.join(sorted(served))}): name one with --model",
                         hint=f"orch logs --model {sorted(served)[0]}")  # fmt: skip
    revision = served[request.model] if request.model is not None else deps.state.current_revision(manifest.name)
    app_name, model_ids, _ = revision_app(revision) if revision is not None else (None, [], {})
    token = deps.state.read_token(manifest.name) if manifest.ray.token_auth else None
    head = runners[manifest.head.name]
    with deps.open_serve(head, manifest.ray.dashboard_port, token) as client:
        app = pick_app(client.status(), app_name)
        if app is None:
            raise OrchError(f"cluster {manifest.name} serves no application", hint="`orch rollout --model NAME` deploys one; `orch logs --raylet` shows Ray's own")
        node_name = {s.node_id: name for name, s in current_by_name(client.nodes()).items()}
        actors = []
        if request.kind == "worker" and manifest.accelerator != "cpu":
            try:
                actors = parse_actors(client.get_json(ACTORS_PATH, ACTORS_PARAMS))
            except DashboardFormatError as exc:
                raise OrchError(f"cannot read Ray's actor list: {exc}") from exc
    replicas = engine_replicas(app, model_ids)
    if request.replica:
        replicas = [r for r in replicas if r.replica_id.startswith(request.replica)]
        if not replicas:
            raise UsageError(f"--replica {request.replica}: no replica of {app.name} starts so",
                             hint="replicas: " + ", ".join(r.replica_id for r in engine_replicas(app, model_ids)))  # fmt: skip
    out: list[LogSource] = []
    for rep in replicas:
        node = node_name.get(rep.node_id)
        if node is None or (request.node and node != request.node):
            continue
        if request.kind == "replica":
            target = replica_target(node, rep)
            if target is None:
                raise OrchError(f"Serve did not report the worker id of replica {rep.replica_id}: its log cannot be found")
            out.append(LogSource(f"replica {rep.replica_id} on {node}", target))
            continue
        workers = engine_workers(rep.actor_name, actors)
        if not workers:
            raise UsageError(
                f"replica {rep.replica_id} runs its engine in one process (vLLM's mp executor, the CPU layout): it has no engine workers",
                hint=f"its log is the replica's: orch logs --replica {rep.replica_id}",
            )
        if request.rank is None or not 0 <= request.rank < len(workers):
            raise UsageError(f"--rank {request.rank}: replica {rep.replica_id} has ranks 0-{len(workers) - 1}",
                             hint=", ".join(f"{i}: {w.rank or w.name}" for i, w in enumerate(workers)))  # fmt: skip
        worker = workers[request.rank]
        wnode = node_name.get(worker.node_id)
        if wnode is None or worker.pid is None:
            raise OrchError(f"engine worker {worker.name} has no known node or pid")
        out.append(LogSource(f"engine worker rank {request.rank} ({worker.rank or worker.name}) of {rep.replica_id} on {wnode}",
                             worker_target(wnode, worker.pid)))  # fmt: skip
    if not out:
        where = f" on {request.node}" if request.node else ""
        raise UsageError(f"no replica of {app.name} runs{where}", hint="`orch status` shows where each replica runs")
    return out


def find_logs(manifest: Manifest, request: LogRequest, deps: LogsDeps) -> list[tuple[LogSource, list[LogTail], str | None]]:
    """Each asked-for process with the last ``request.tail`` lines of its files (or why not)."""
    if request.node is not None and request.node not in {n.name for n in manifest.nodes}:
        raise UsageError(f"--node {request.node}: not a node of cluster {manifest.name}", hint="nodes: " + ", ".join(n.name for n in manifest.nodes))
    with deps.open_runners(manifest) as runners:
        sources = _raylet_sources(manifest, request) if request.kind == "raylet" else _serving_sources(manifest, request, deps, runners)
        tails = read_tails(manifest, runners, [s.target for s in sources], request.tail)
    return [(source, files, error) for source, (files, error) in zip(sources, tails)]


WAKE_S = 0.5  # the main thread wakes this often, so that Ctrl-C ends --follow at once


def follow_files(runners: Mapping[str, Runner], files: list[LogTail]) -> Iterator[tuple[str, str]]:
    """(node, line) as lines are written to ``files``, from ``tail -F`` on each node (one process per
    node), until the caller stops iterating; the processes are killed then."""
    by_node: dict[str, list[str]] = {}
    for f in files:
        by_node.setdefault(f.node, []).append(f.path)
    lines: queue.Queue[tuple[str, str] | None] = queue.Queue()
    procs = []
    for node, paths in by_node.items():
        runner = runners[node]
        if not isinstance(runner, Starter):
            raise OrchError(f"{node}: its runner cannot stream a command (--follow needs SSH or local)")
        proc = runner.start(["tail", "-n", "0", "-F", *paths])
        procs.append(proc)

        def pump(node: str = node, proc: Any = proc) -> None:
            while True:
                line = proc.readline()
                if not line:
                    lines.put(None)
                    return
                lines.put((node, line.rstrip("\n")))

        threading.Thread(target=pump, daemon=True, name=f"orch-logs-{node}").start()
    ended = 0
    try:
        while ended < len(procs):
            # Never block without a timeout: Ctrl-C's SIGINT may land on a pump thread (blocked in
            # its read), and Python raises KeyboardInterrupt only when the main thread runs again.
            try:
                item = lines.get(timeout=WAKE_S)
            except queue.Empty:
                continue
            if item is None:
                ended += 1
                continue
            yield item
    finally:
        for proc in procs:
            try:
                proc.kill()
            except (OSError, RemoteError):
                pass
