"""`orch model sync`: the I/O edge of copying a model folder to the same path on every node.

Does I/O only through the runners it is given (SSH or local) and the injected clock and token:
1. fingerprint the source (the control machine or one node) and inspect every node (final and
   staging folders, free space; the agent hashes on all nodes at once), probe the interface
   addresses (``ip -j addr``);
2. plan (``orchestrator.sync.plan``, pure); a dry run stops here; any problem (low disk, a path
   orch does not own) refuses the sync before a byte is sent;
3. start one receive agent per node that changes, wire the chain (each agent listens on its
   interface address, port 0, for the one upstream that presents the one-time token), stream the
   files from the source into the chain's first node, collect per-node progress and results;
4. fingerprint every node again and compare with the source: the sync is done when they match.
Every agent is ended (its SSH channel closed) when the sync ends, whatever happened.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import queue
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from orchestrator.cluster.ray_nodes import node_address
from orchestrator.errors import CommandFailedError, ModelSyncError, RemoteError, SyncRefused, UsageError
from orchestrator.manifest.model import Manifest, NodeSpec
from orchestrator.nodes import probes
from orchestrator.nodes.facts import NodeFacts
from orchestrator.plan.model_ref import HUB_REF, resolve_ref
from orchestrator.remote.node_programs import sync_agent as agent
from orchestrator.remote.runner import Process, Runner, fan_out
from orchestrator.sync.plan import (
    ModelPaths,
    NodeHolding,
    SyncPlan,
    after,
    check_model_name,
    folder_print,
    next_hops,
    node_holding,
    plan_sync,
)

INSPECT_TIMEOUT_S = 3600.0  # hashing a large model that no cache vouches for takes a while
LISTEN_TIMEOUT_S = 60.0
END_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SyncOptions:
    model: str
    source: str = "local"  # "local" (this machine) or a node name
    dry_run: bool = False
    max_rate: float | None = None  # bytes/s the source sends at most
    timeout: float = 24 * 3600.0


@dataclass(frozen=True)
class SyncEvent:
    """A step message (``node`` None) or a node's byte counters."""

    message: str | None = None
    node: str | None = None
    received: int = 0
    total: int = 0
    seconds: float = 0.0


@dataclass
class SyncDeps:
    open_runners: Callable[[Manifest], AbstractContextManager[dict[str, Runner]]]
    local: Runner  # the control machine, for ``--from local``
    local_python: str
    progress: Callable[[SyncEvent], None] = lambda e: None
    clock: Callable[[], float] = time.monotonic
    new_token: Callable[[], str] = lambda: secrets.token_hex(32)


@dataclass(frozen=True)
class NodeSyncResult:
    node: str
    action: str  # "up to date" | "synced" | "failed" | "not run"
    received_bytes: int = 0
    written_bytes: int = 0
    seconds: float = 0.0
    verified: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SyncResult:
    model: str
    source: str
    source_path: str
    final_path: str
    plan: SyncPlan
    dry_run: bool
    nodes: tuple[NodeSyncResult, ...] = ()
    sent_bytes: int = 0
    seconds: float = 0.0
    source_sha256: str | None = None
    addresses: dict[str, str] = field(default_factory=dict)
    listeners: dict[str, str] = field(default_factory=dict)  # node -> address:port its agent bound

    @property
    def ok(self) -> bool:
        return self.dry_run or all(n.verified for n in self.nodes)

    @property
    def action(self) -> str:
        if self.dry_run:
            return "dry-run"
        return "noop" if not self.plan.to_change else ("synced" if self.ok else "failed")

    def to_dict(self) -> dict[str, Any]:
        secs = self.seconds
        return {
            "model": self.model,
            "action": self.action,
            "source": self.source,
            "source_path": self.source_path,
            "final_path": self.final_path,
            "source_sha256": self.source_sha256,
            "plan": self.plan.to_dict(),
            "sent_bytes": self.sent_bytes,
            "seconds": round(secs, 3),
            "throughput_bytes_s": round(self.sent_bytes / secs) if secs > 0 else None,
            "addresses": self.addresses,
            "listeners": self.listeners,
            "nodes": [n.to_dict() for n in self.nodes],
            "ok": self.ok,
        }


# --------------------------------------------------------------------------------------------


def resolve(manifest: Manifest, options: SyncOptions) -> tuple[ModelPaths, str]:
    """(paths on the nodes, the source folder) for ``--model NAME|PATH`` (``plan.model_ref``'s rule)."""
    # --from NODE: the path is on that node, so nothing here says whether it exists
    ref = resolve_ref(options.model) if options.source == "local" else resolve_ref(options.model, exists=lambda _: False)
    if manifest.model_store is None:
        raise UsageError(
            "the manifest sets no model_store: orch model sync copies models to <model_store>/<name> on every node",
            hint=f"add `model_store: /models` to {manifest.source_path or 'the manifest'}",
        )
    store = str(manifest.model_store)
    if options.source != "local" and options.source not in {n.name for n in manifest.nodes}:
        raise UsageError(
            f"--from {options.source!r}: no such node in cluster {manifest.name!r}",
            hint="--from local (this machine) or one of: " + ", ".join(n.name for n in manifest.nodes),
        )
    if ref.kind == HUB_REF:
        raise UsageError(
            f"--model {ref.text} names a Hugging Face repo, not a folder: orch model sync copies a model folder",
            hint=f"download it first (`huggingface-cli download {ref.text} --local-dir DIR`) and pass --model DIR; a folder here named so is ./{ref.text}",
        )
    if ref.path is not None:
        src = str(ref.path) if options.source == "local" else posixpath.normpath(ref.text)
        name = posixpath.basename(src.rstrip("/"))
    else:
        name = ref.store_name or ref.text
        src = posixpath.join(store, name)
    problem = check_model_name(name)
    if problem:
        raise UsageError(problem, hint="pass --model NAME (a folder of the model store) or --model /path/to/NAME")
    return ModelPaths(store, name), src


def check_rollout_target(manifest: Manifest, node_path: str) -> None:
    """`orch rollout --sync-model`: the model's folder on the nodes must be <model_store>/<name>,
    where a sync puts it."""
    store = str(manifest.model_store) if manifest.model_store is not None else None
    if store is None or posixpath.dirname(node_path.rstrip("/")) != store.rstrip("/"):
        raise UsageError(
            f"--sync-model copies models to <model_store>/<name>; {node_path} is not in the manifest's model_store ({store or 'not set'})",
            hint="set model_store to the folder that holds the model, or pass --model NAME",
        )


def agent_argv(python: str, *args: str) -> list[str]:
    return probes.agent_argv(python, *args)


def _json_line(text: str, what: str, node: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise CommandFailedError(f"{node}: the sync agent printed no {what}", node=node)


def fingerprint_source(runner: Runner, python: str, path: str, node: str) -> dict[str, Any]:
    res = runner.run(agent_argv(python, "fingerprint", path), timeout=INSPECT_TIMEOUT_S).check(node)
    d = _json_line(res.stdout, "fingerprint", node)
    if not d.get("exists"):
        raise UsageError(f"source {path} does not exist on {node}", hint="check --model and --from")
    if d.get("index_kind") == "file":
        raise UsageError(f"source {path} on {node} is a file; orch model sync copies a model folder")
    if not d.get("files"):
        raise UsageError(f"source {path} on {node} holds no files")
    return d


def inspect_node(runner: Runner, manifest: Manifest, node: NodeSpec, paths: ModelPaths) -> tuple[NodeHolding, str]:
    python = node.python_bin(manifest)
    res = runner.run(agent_argv(python, "inspect", paths.final, paths.staging, paths.store), timeout=INSPECT_TIMEOUT_S)
    holding = node_holding(node.name, _json_line(res.check(node.name).stdout, "inspection", node.name))
    facts = None
    if node.interface:
        ip = runner.run(probes.ip_addr_argv(), timeout=30).check(node.name)
        facts = NodeFacts(node=node.name, host=node.host, nics=tuple(probes.parse_ip_addr(ip.stdout)))
    return holding, node_address(node, facts)


def sync_model(manifest: Manifest, deps: SyncDeps, options: SyncOptions) -> SyncResult:
    paths, src = resolve(manifest, options)
    say = lambda msg: deps.progress(SyncEvent(message=msg))  # noqa: E731
    with deps.open_runners(manifest) as runners:
        src_runner = deps.local if options.source == "local" else runners[options.source]
        src_python = deps.local_python if options.source == "local" else manifest.node(options.source).python_bin(manifest)
        say(f"fingerprinting the source {src} on {options.source} and {len(manifest.nodes)} node(s)")
        box: dict[str, Any] = {}

        def source_print() -> None:
            try:
                box["source"] = fingerprint_source(src_runner, src_python, src, options.source)
            except Exception as exc:  # re-raised below, in the caller's thread
                box["error"] = exc

        t = threading.Thread(target=source_print, name="orch-sync-source")
        t.start()
        outcomes = fan_out([runners[n.name] for n in manifest.nodes], lambda r: inspect_node(r, manifest, manifest.node(r.node), paths))
        t.join()
        if "error" in box:
            raise box["error"]
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise failed[0].error
        if "source" not in box:
            raise ModelSyncError(f"could not fingerprint the source {src} on {options.source}")
        source = folder_print(box["source"])
        holdings = [o.value[0] for o in outcomes]
        addresses = {o.node: o.value[1] for o in outcomes}
        plan = plan_sync(source.files, holdings, paths.store)
        base = SyncResult(model=paths.name, source=options.source, source_path=src, final_path=paths.final, plan=plan,
                          dry_run=True, source_sha256=source.content_sha256, addresses=addresses)  # fmt: skip
        if options.dry_run:
            return base
        if plan.problems:
            raise SyncRefused(
                "model sync refused before sending anything: " + "; ".join(plan.problems),
                hint="nothing was sent: free space in the model store (or point model_store at a larger disk), or move "
                "aside the path orch does not own; see docs/model-sync.md",
            )
        if not plan.to_change:
            return dataclasses.replace(base, dry_run=False, nodes=tuple(NodeSyncResult(n.node, "up to date", verified=True) for n in plan.nodes))
        start = deps.clock()
        transfer = _Transfer(manifest, runners, paths, plan, addresses, deps, options, src_runner, src_python, src)
        node_results, sent = transfer.run()
        listeners = {k: f"{e['address']}:{e['port']}" for k, e in transfer.listening.items() if e.get("port")}
        say("verifying every node's fingerprint against the source")
        final = _verify(manifest, runners, paths, source.content_sha256, node_results, plan)
        return dataclasses.replace(base, dry_run=False, nodes=final, sent_bytes=sent, seconds=deps.clock() - start, listeners=listeners)


def _verify(manifest, runners, paths, want, node_results, plan) -> tuple[NodeSyncResult, ...]:
    def fp(r: Runner) -> str | None:
        python = manifest.node(r.node).python_bin(manifest)
        d = _json_line(r.run(agent_argv(python, "fingerprint", paths.final), timeout=INSPECT_TIMEOUT_S).check(r.node).stdout, "fingerprint", r.node)
        return d.get("content_sha256")

    got = {o.node: (o.value, o.error) for o in fan_out([runners[n.node] for n in plan.nodes], fp)}
    out = []
    for n in plan.nodes:
        res = node_results.get(n.node) or NodeSyncResult(n.node, "up to date")
        sha, err = got[n.node]
        ok = sha == want and res.error is None
        error = res.error or (None if ok else (f"fingerprint after sync differs from the source ({str(sha)[:12]} vs {want[:12]})" if err is None else str(err)))
        out.append(NodeSyncResult(n.node, res.action if ok else "failed", res.received_bytes, res.written_bytes, res.seconds, ok, error))
    return tuple(out)


class _Transfer:
    """One run of the chain: agents started, wired, fed, watched, and always ended."""

    def __init__(self, manifest, runners, paths, plan, addresses, deps, options, src_runner, src_python, src) -> None:
        self.manifest, self.runners, self.paths, self.plan = manifest, runners, paths, plan
        self.addresses, self.deps, self.options = addresses, deps, options
        self.src_runner, self.src_python, self.src = src_runner, src_python, src
        self.token = deps.new_token()
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.procs: dict[str, Process] = {}
        self.counters: dict[str, tuple[int, int]] = {}
        self.started: dict[str, float] = {}
        self.listening: dict[str, dict[str, Any]] = {}
        self.finals: dict[str, dict[str, Any]] = {}

    def _reader(self, key: str, proc: Process) -> None:
        while True:
            line = proc.readline()
            if not line:
                self.events.put((key, {"event": "eof"}))
                return
            try:
                self.events.put((key, json.loads(line)))
            except ValueError:
                continue

    def _start(self, key: str, runner: Runner, python: str, mode: str, plan: dict[str, Any]) -> Process:
        proc = runner.start(agent_argv(python, mode), timeout=self.options.timeout)  # type: ignore[attr-defined]
        self.procs[key] = proc
        threading.Thread(target=self._reader, args=(key, proc), daemon=True, name=f"orch-sync-{key}").start()
        proc.write((json.dumps(plan) + "\n").encode())
        return proc

    def _note(self, key: str, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "listening":
            self.listening[key] = ev
        elif kind in ("result", "eof"):
            self.finals.setdefault(key, ev)  # a result always comes before the stream's end
        elif kind == "progress" and key in self.started:
            rec, wr = int(ev.get("received", 0)), int(ev.get("written", 0))
            self.counters[key] = (rec, wr)
            self.deps.progress(SyncEvent(node=key, received=rec, total=int(ev.get("total", 0)), seconds=self.deps.clock() - self.started[key]))

    def _wait(self, table: dict[str, dict[str, Any]], pending: set[str], deadline: float, what: str) -> None:
        """Until every pending agent has an entry in ``table`` or has ended."""
        while True:
            missing = {k for k in pending if k not in table and k not in self.finals}
            if not missing:
                return
            left = deadline - self.deps.clock()
            if left <= 0:
                raise ModelSyncError(f"no {what} from {', '.join(sorted(missing))} in time")
            try:
                key, ev = self.events.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            self._note(key, ev)

    def run(self) -> tuple[dict[str, NodeSyncResult], int]:
        try:
            return self._run()
        finally:
            for proc in self.procs.values():
                proc.kill()  # closing the channel ends the agent (it watches its stdin)

    def _run(self) -> tuple[dict[str, NodeSyncResult], int]:
        plan, chain = self.plan, self.plan.chain
        hops = next_hops(chain)
        changing = [n for n in plan.to_change]
        local_source = self.options.source == "local"
        for n in changing:
            upstream = "none"
            if n.node in chain:
                upstream = "stdin" if (local_source and n.node == chain[0]) else "listen"
            node = self.manifest.node(n.node)
            self.started[n.node] = self.deps.clock()
            self._start(n.node, self.runners[n.node], node.python_bin(self.manifest), "receive", {
                "node": n.node, "name": self.paths.name, "store": self.paths.store, "final": self.paths.final,
                "staging": self.paths.staging, "old": self.paths.old, "target": [f.to_list() for f in plan.target],
                "link": [f.rel for f in n.link], "after": list(after(chain, n.node)), "bytes": n.receive_bytes,
                "upstream": upstream, "bind": self.addresses[n.node], "token": self.token,
            })
        self.deps.progress(SyncEvent(message=f"{len(changing)} agent(s) started; chain: {' -> '.join([self.options.source, *chain]) if chain else 'none'}"))
        self._wait(self.listening, {n.node for n in changing}, self.deps.clock() + LISTEN_TIMEOUT_S, "listening report")
        ready = self.listening
        errors = {k: e.get("error", "the agent ended early") for k, e in self.finals.items() if k not in ready}
        if errors:
            raise ModelSyncError("sync agents could not start: " + "; ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
        for n in changing:
            nxt = hops.get(n.node)
            hop = {"host": self.addresses[nxt], "port": ready[nxt]["port"]} if nxt else None
            self.procs[n.node].write((json.dumps({"next": hop}) + "\n").encode())
        sent = 0
        if chain:
            self.deps.progress(SyncEvent(message=f"sending {len(plan.frames)} file(s), {plan.stream_bytes:,} bytes, from {self.options.source}"))
            sent = self._feed(chain, ready)
        self._wait(self.finals, {n.node for n in changing}, self.deps.clock() + self.options.timeout, "result")
        out = {}
        for n in changing:
            ev = self.finals[n.node]
            rec, wr = self.counters.get(n.node, (0, 0))
            ok = ev.get("event") == "result" and ev.get("ok")
            err = None if ok else (ev.get("error") or "the agent ended without a result (its SSH channel closed)")
            out[n.node] = NodeSyncResult(n.node, "synced" if ok else "failed", rec, wr, self.deps.clock() - self.started[n.node], False, err)
        return out, sent

    def _feed(self, chain: tuple[str, ...], ready: dict[str, dict[str, Any]]) -> int:
        frames = [f.to_list() for f in self.plan.frames]
        first = chain[0]
        if self.options.source == "local":
            proc = self.procs[first]
            try:
                return agent.send_files(self.src, frames, proc.write, self.options.max_rate)
            except (RemoteError, OSError) as exc:
                self.deps.progress(SyncEvent(message=f"sending to {first} stopped: {exc}"))
                return 0
            finally:
                proc.close_stdin()
        node = self.manifest.node(self.options.source)
        self._start("source", self.src_runner, node.python_bin(self.manifest), "send", {
            "host": self.addresses[first], "port": ready[first]["port"], "token": self.token,
            "root": self.src, "frames": frames, "rate": self.options.max_rate,
        })
        self._wait(self.finals, {"source"}, self.deps.clock() + self.options.timeout, "sender result")
        ev = self.finals["source"]
        if not ev.get("ok"):
            self.deps.progress(SyncEvent(message=f"the sender on {self.options.source} failed: {ev.get('error')}"))
            return 0
        return int(ev.get("sent", 0))
