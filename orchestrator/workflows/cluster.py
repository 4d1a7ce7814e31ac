"""`orch up` and the nodes part of `orch status`, over injected dependencies (`orch down`:
``workflows.down``).

I/O only through what ``ClusterDeps`` provides: runners (SSH/local/fake) opened per command, the
state store, a dashboard opener (an SSH tunnel to the head's 127.0.0.1 in real use), a clock, a
sleep and a progress callback. Decisions are made by the pure ``cluster.up_plan.plan_up`` and
``preflight``; argv and environments come from ``cluster.ray_nodes``.

up: probe every node (in parallel) -> preflight (failures stop; warnings stop without force)
-> compare with the recorded state (nothing / heal the sick workers / restart all / start)
-> token once (0600, local and on every node started) -> on every node to (re)start, in
parallel and without barriers: stop this cluster's processes there, token file, `ray start` (the head,
and workers that wait for its GCS) -> wait until every node is ALIVE with its GPUs (through the
head's dashboard) -> record.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator import cluster_lock
from orchestrator.cluster.dashboard import open_dashboard, wait_for_nodes
from orchestrator.cluster.exposure import exposure_warnings
from orchestrator.cluster.node_changes import env_digests
from orchestrator.cluster.node_state import NodeState, current_by_name
from orchestrator.cluster.ray_nodes import (
    CLUSTER_ID_ENV,
    GCS_WAIT_ENV,
    RAY_LOCALHOST_NAMES,
    WORKER_GCS_WAIT_S,
    collective_interface,
    haproxy_dir,
    haproxy_enabled,
    head_start_argv,
    node_gpus,
    parse_stop,
    private_dir_argv,
    ray_process_env,
    stop_argv,
    worker_start_argv,
)
from orchestrator.cluster.up_plan import DRAIN_DEADLINE_S, UpPlan, plan_up
from orchestrator.collective.verdict import CollectiveReport
from orchestrator.errors import (
    AuthenticationError,
    ClusterError,
    CommandFailedError,
    HostKeyChangedError,
    HostKeyUnknownError,
    PreflightFailed,
    RemoteError,
    UnreachableError,
)
from orchestrator.manifest.model import Manifest
from orchestrator.manifest.sections import NodeSpec
from orchestrator.nodes import inventory
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight import findings as preflight
from orchestrator.preflight.findings import Finding
from orchestrator.preflight.run import run_checks
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.runbooks import runbook
from orchestrator.state import StateStore
from orchestrator.workflows.collective import CollectiveCheck, collective_stage, run_collective_check
from orchestrator.workflows.node_drain import Drained, check_room, drain_workers, read_actors, refuse_downtime
from orchestrator.workflows.node_files import install_serve_hooks, install_token, node_home

Progress = Callable[[str], None]
RunnerOpener = Callable[[Manifest], AbstractContextManager[Mapping[str, Runner]]]
DashboardOpener = Callable[[Runner, int, "str | None"], AbstractContextManager[Any]]

RAY_START_TIMEOUT_S = 180.0
# What Ray says when a new raylet did not register with the GCS in its 30 s (ray/_private/node.py).
REGISTRATION_TIMEOUT = "timed out during startup"
START_ATTEMPTS = 3  # for that failure; any other failure of `ray start` is tried twice
RAY_STOP_TIMEOUT_S = 120.0
RUNBOOK_START = runbook("RAY_START_FAILED")
# Errors that mean "orch could not get onto the node" (as opposed to a command failing there).
NOT_REACHED = (UnreachableError, AuthenticationError, HostKeyUnknownError, HostKeyChangedError)


def _quiet(_message: str) -> None:
    pass


@dataclass
class ClusterDeps:
    """What the cluster workflows need from the outside world."""

    state: StateStore
    open_runners: RunnerOpener
    gather: Callable[[Mapping[str, Runner], Manifest], dict[str, Any]] = inventory.gather_all
    check: Callable[[Manifest, dict[str, Any]], list[Finding]] = run_checks
    open_dashboard: DashboardOpener = open_dashboard
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    token_factory: Callable[[], str] = lambda: secrets.token_hex(32)
    cluster_id_factory: Callable[[], str] = lambda: secrets.token_hex(8)
    progress: Progress = _quiet
    collective: CollectiveCheck = run_collective_check


@dataclass(frozen=True)
class UpOptions:
    check_only: bool = False
    force: bool = False
    dry_run: bool = False
    timeout: float = 300.0  # for every node to be ALIVE after the starts
    serve_env: Mapping[str, str] | None = None  # replaces cluster.ray_nodes.SERVE_ENV_DEFAULTS
    collective_check: bool = True  # the all-reduce between the nodes before Ray starts
    allow_downtime: bool = False  # accept a change that stops a serving model (full restart, no room to drain)
    drain_timeout: float = DRAIN_DEADLINE_S  # the deadline Ray and Serve get to move a drained node's replicas


class PreflightStopped(PreflightFailed):
    """Preflight blocked `orch up`; nothing was started. Carries every finding and the facts."""

    def __init__(self, message: str, hint: str | None, findings: list[Finding], facts: dict[str, Any],
                 collective: CollectiveReport | None = None) -> None:  # fmt: skip
        super().__init__(message, hint)
        self.findings = findings
        self.facts = facts
        self.collective = collective


class PreflightUnreachable(PreflightStopped):
    """Preflight could not probe a node over SSH: exit 4, the code of an unreachable node for every
    command (nothing was started either)."""

    exit_code = 4


@dataclass(frozen=True)
class UpResult:
    cluster: str
    action: str  # "checked" | "nothing" | "start" | "restart" | "heal"
    message: str
    dry_run: bool = False
    plan: UpPlan | None = None
    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeState] = field(default_factory=list)
    head_address: str | None = None
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)  # what the nodes expose that orch cannot close
    collective: CollectiveReport | None = None
    drained: list[Drained] = field(default_factory=list)

    @property
    def started(self) -> list[str]:
        return [] if self.dry_run or self.plan is None else list(self.plan.start)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "action": self.action,
            "message": self.message,
            "dry_run": self.dry_run,
            "plan": self.plan.to_dict() if self.plan else None,
            "started": self.started,
            "head_address": self.head_address,
            "findings": [f.to_dict() for f in self.findings],
            "nodes": [s.to_dict() for s in sorted(current_by_name(self.nodes).values(), key=lambda s: s.name or "")],
            "seconds": round(self.seconds, 2),
            "warnings": list(self.warnings),
            "collective": self.collective.to_dict() if self.collective else None,
            "drained": [d.to_dict() for d in self.drained],
        }


# ------------------------------------------------------------------------------ node actions


def stop_node(runner: Runner, manifest: Manifest, node: NodeSpec, cluster_id: str | None) -> str:
    """Kill every process of this cluster on the node (Ray and the vLLM engines it spawned, also
    orphaned ones; nothing of another cluster or user). Returns a short account; raises
    CommandFailedError when a process survived or could not be inspected or killed."""
    res = runner.run(stop_argv(manifest, node, cluster_id), timeout=RAY_STOP_TIMEOUT_S).check(node.name)
    try:
        report = parse_stop(res.stdout)
    except ValueError as exc:
        raise CommandFailedError(f"{node.name}: stopping Ray: {exc}", node=node.name) from exc
    if report["denied"]:
        detail = ", ".join(f"{pid} ({why})" for pid, why in sorted(report["denied"].items()))
        raise CommandFailedError(
            f"{node.name}: access denied to processes {detail}; they may belong to this cluster and were not stopped",
            hint="run `orch down` as the user that ran `orch up` (ssh.user), or stop them by hand",
            node=node.name,
        )
    if report["alive"]:
        raise CommandFailedError(
            f"{node.name}: processes {report['alive']} survived SIGKILL for 15 s", node=node.name,
            hint="they may be stuck in the kernel (D state, e.g. a hung GPU driver): check `ps -o stat` on the node",
        )  # fmt: skip
    if not report["killed"]:
        return "nothing was running"
    vllm = sorted(n for n in report["names"] if n.startswith("VLLM"))
    return f"stopped {report['killed']} processes" + (f" (vLLM: {', '.join(vllm)})" if vllm else "")


def _start(
    runner: Runner,
    manifest: Manifest,
    node: NodeSpec,
    argv: list[str],
    env: dict[str, str],
    progress: Progress,
    retry: Callable[[], bool] = lambda: True,
) -> None:
    """`ray start` on one node; a failed start is stopped and tried again. Ray gives a new raylet
    30 s to register with the GCS (``raylet_start_wait_time_s`` in ray/_private/node.py, not
    configurable) and fails the start otherwise, which a loaded head can exceed (a worker healed
    while Serve restarts the lost replica's engine on the other nodes): that failure is tried
    up to ``START_ATTEMPTS`` times, any other failure twice; the last one is reported with Ray's words."""
    attempt = 0
    while True:
        attempt += 1
        res = runner.run(argv, timeout=RAY_START_TIMEOUT_S, env=env)
        if res.ok:
            return
        said = res.stderr.strip() or res.stdout.strip()
        tail = " | ".join(said.splitlines()[-3:])
        limit = START_ATTEMPTS if REGISTRATION_TIMEOUT in said else 2
        if attempt < limit and retry():
            progress(f"`ray start` failed on {node.name} (exit {res.exit_code}); stopping it and trying again ({attempt + 1} of {limit})")
            stop_node(runner, manifest, node, env.get(CLUSTER_ID_ENV))
            continue
        times = {1: "", 2: "twice "}.get(attempt, f"{attempt} times ")
        raise ClusterError(
            f"`ray start` failed {times}on {node.name} (exit {res.exit_code}): {tail}",
            hint=f"see {node.name}'s Ray logs (TEMP_DIR/session_latest/logs); see {RUNBOOK_START}",
        )


def _raise_outcome_errors(outcomes: list, what: str) -> None:
    failed = [o for o in outcomes if not o.ok]
    if failed:
        detail = "; ".join(f"{o.node}: {o.error.message}" for o in failed)
        raise ClusterError(f"{what} failed on {', '.join(o.node for o in failed)}: {detail}", hint=failed[0].error.hint)


# ------------------------------------------------------------------------------ up


def _preflight(manifest: Manifest, runners: Mapping[str, Runner], deps: ClusterDeps, options: UpOptions):
    deps.progress(f"probing {len(manifest.nodes)} nodes")
    facts = deps.gather(runners, manifest)
    findings = deps.check(manifest, facts)
    _stop_if_blocked(findings, facts, options.force)
    return facts, findings


def _stop_if_blocked(findings: list[Finding], facts: dict[str, Any], force: bool,
                     collective: CollectiveReport | None = None) -> None:  # fmt: skip
    blocking = preflight.blocking(findings, force)
    if blocking:
        fails = preflight.failures(findings)
        nodes = sorted({f.node or "cluster" for f in (fails or blocking)})
        if fails:
            msg = f"preflight found {len(fails)} failure(s) on {', '.join(nodes)}: " + ", ".join(
                sorted({f"{f.code}@{f.node or 'cluster'}" for f in fails})
            )
            hint = "nothing was started; fix them (each hint names its runbook) and re-run `orch up`"
        else:
            msg = f"preflight found {len(blocking)} warning(s) on {', '.join(nodes)}: " + ", ".join(
                sorted({f"{f.code}@{f.node or 'cluster'}" for f in blocking})
            )
            hint = "nothing was started; fix them, or accept them with `orch up --force`"
        unreached = sorted({f.node for f in fails if f.code == preflight.NODE_UNREACHABLE and f.node})
        if unreached:  # exit 4, like every command that cannot reach a node
            raise PreflightUnreachable(msg, f"{', '.join(unreached)} did not answer over SSH; {hint}", findings, facts, collective)
        raise PreflightStopped(msg, hint, findings, facts, collective)


def _collective(manifest: Manifest, runners: Mapping[str, Runner], facts: dict[str, Any], findings: list[Finding],
                deps: ClusterDeps, options: UpOptions) -> tuple[CollectiveReport | None, list[Finding]]:  # fmt: skip
    report, findings = collective_stage(manifest, runners, facts, findings, deps.collective, deps.state,
                                        options.collective_check, deps.progress)  # fmt: skip
    _stop_if_blocked(findings, facts, options.force, report)
    return report, findings


def _read_states(runner: Runner, manifest: Manifest, token: str | None, deps: ClusterDeps) -> list[NodeState]:
    with deps.open_dashboard(runner, manifest.ray.dashboard_port, token) as dash:
        return dash.nodes_with_usage()


def up(manifest: Manifest, deps: ClusterDeps, options: UpOptions = UpOptions()) -> UpResult:
    """Bring the cluster to the manifest (see the module doc). Raises PreflightStopped,
    ClusterError or RemoteError; returns what it did (or would do, with ``dry_run``), with the
    warnings of ``exposure_warnings`` (ports Ray opens that orch cannot bind to loopback). Holds the
    cluster's lock unless it only looks (``check_only``, ``dry_run``): ClusterBusy when taken."""
    if options.check_only or options.dry_run:
        return replace(_up(manifest, deps, options), warnings=exposure_warnings(manifest))
    with cluster_lock.hold(deps.state.cluster_dir(manifest.name), manifest.name, "up"):
        return replace(_up(manifest, deps, options), warnings=exposure_warnings(manifest))


def _up(manifest: Manifest, deps: ClusterDeps, options: UpOptions) -> UpResult:
    t0 = deps.clock()
    name, head = manifest.name, manifest.head
    with deps.open_runners(manifest) as runners:
        facts, findings = _preflight(manifest, runners, deps, options)
        good = {n: f for n, f in facts.items() if isinstance(f, NodeFacts)}
        head_address = inventory.head_address(manifest, good.get(head.name))
        if options.check_only:
            report, findings = _collective(manifest, runners, facts, findings, deps, options)
            return UpResult(name, "checked", "preflight passed; nothing was started (--check-only)", findings=findings,
                            facts=facts, head_address=head_address, seconds=deps.clock() - t0, collective=report)  # fmt: skip
        expected = {n.name: node_gpus(manifest, n, good.get(n.name)) for n in manifest.nodes}

        record = deps.state.get_cluster(name)
        states: list[NodeState] | None = None
        dashboard_error = None
        up_before = record is not None and record.state == "up"
        recorded = Manifest.model_validate_json(record.manifest_json) if up_before and record and record.manifest_json else None
        if up_before and (recorded is None or recorded.head.name == head.name):  # the running head is this one: ask it
            deps.progress("reading the Ray cluster's state on the head")
            try:
                states = _read_states(runners[head.name], manifest, deps.state.read_token(name), deps)
            except (ClusterError, RemoteError) as exc:
                dashboard_error = exc.message
        cluster_id = deps.state.read_cluster_id(name)
        digests = env_digests(manifest.model_dump(mode="json"), cluster_id) if cluster_id else None
        plan = plan_up(manifest, record, expected, states, dashboard_error, options.drain_timeout,
                       (deps.state.load_env_digests(name), digests))  # fmt: skip
        common = dict(plan=plan, findings=findings, facts=facts, head_address=head_address)
        if not options.dry_run:  # what the nodes have, for `orch plan --cluster` and rollout
            deps.state.save_facts(name, {n: f.to_dict() for n, f in good.items()})
        if not plan.changes_anything:
            return UpResult(name, "nothing", f"nothing to do: {plan.reason}", nodes=states or [],
                            seconds=deps.clock() - t0, **common)  # fmt: skip
        serving = deps.state.current_revision(name) if up_before else None
        gate = ""
        if plan.downtime and serving is not None:
            gate = f"; stops {serving.model} (revision {serving.number}), so it needs --allow-downtime"
        if options.dry_run:
            return UpResult(name, plan.action, f"would {plan.action}: {plan.reason}{gate}", dry_run=True,
                            nodes=states or [], seconds=deps.clock() - t0, **common)  # fmt: skip
        refuse_downtime(plan, serving, options.allow_downtime)
        report, findings = _collective(manifest, runners, facts, findings, deps, options)
        common.update(findings=findings, collective=report)
        token = deps.state.read_token(name)
        if plan.drain and states is not None:  # refused (nothing changed yet) or drained, on one dashboard
            ids = {n: s.node_id for n, s in current_by_name(states).items() if n in plan.drain}
            with deps.open_dashboard(runners[head.name], manifest.ray.dashboard_port, token) as dash:
                if serving is not None:
                    check_room(plan, states, read_actors(dash), manifest.accelerator, options.allow_downtime)
                deps.progress(plan.reason)
                common["drained"] = drain_workers(manifest, runners[head.name], head_address, ids, dash,
                                                  options.drain_timeout, deps.clock, deps.sleep, deps.progress)  # fmt: skip
        else:
            deps.progress(plan.reason)
        if recorded is not None:  # where the cluster ran and runs no more: removed nodes, and old addresses
            moved = tuple(n.name for n in recorded.nodes if n.name in expected and n.name in plan.start
                          and (n.host, n.transport) != (manifest.node(n.name).host, manifest.node(n.name).transport))  # fmt: skip
            if plan.removed or moved:
                _stop_removed(recorded, plan.removed + moved, deps)
        if plan.start:
            final = _carry_out(manifest, plan, runners, good, expected, head_address, deps, options)
        else:
            final = _read_states(runners[head.name], manifest, token, deps)
        by_name = current_by_name(final)
        ray_head = by_name[head.name].address if head.name in by_name and by_name[head.name].address else head_address
        if ray_head != head_address:  # one address everywhere: the one Ray uses and the table shows
            deps.progress(f"head {head.name} at {ray_head}:{manifest.ray.port} (Ray's own address for {head_address})")
            head_address = common["head_address"] = ray_head
        deps.state.record_cluster(
            name,
            manifest.fingerprint(),
            head_address,
            manifest.ray.dashboard_port,
            {n: s.node_id for n, s in by_name.items() if n in expected},
            manifest_json=manifest.model_dump_json(exclude={"source_path"}),
            manifest_path=str(manifest.source_path) if manifest.source_path else None,
            ray_version=(good[head.name].versions.ray if head.name in good and good[head.name].versions else None),
        )
        deps.state.save_env_digests(name, env_digests(manifest.model_dump(mode="json"), deps.state.read_cluster_id(name) or ""))
        verb = {"start": "started", "restart": "restarted", "heal": "restarted", "change": "started"}[plan.action]
        done = [f"{verb} {', '.join(plan.start)}"] if plan.start else []
        done += [f"removed {', '.join(plan.removed)}"] if plan.removed and plan.action == "change" else []
        message = f"{'; '.join(done) or 'recorded the manifest'}: {len(expected)} nodes ALIVE, {sum(expected.values())} GPUs"
        if plan.downtime and serving is not None:  # Serve's applications died with the head's GCS
            message += (f"; {serving.model} (revision {serving.number}) is NOT served after the full restart: "
                        "`orch rollout` serves it again")  # fmt: skip
        return UpResult(name, plan.action, message, nodes=final, seconds=deps.clock() - t0, **common)


def _carry_out(
    manifest: Manifest,
    plan: UpPlan,
    runners: Mapping[str, Runner],
    facts: Mapping[str, NodeFacts],
    expected: Mapping[str, int],
    head_address: str,
    deps: ClusterDeps,
    options: UpOptions,
) -> list[NodeState]:
    head = manifest.head
    token = deps.state.ensure_token(manifest.name, deps.token_factory) if manifest.ray.token_auth else None
    cluster_id = deps.state.ensure_cluster_id(manifest.name, deps.cluster_id_factory)

    head_failed = threading.Event()

    def bring_up(r: Runner) -> ClusterError | None:
        """One node's whole pipeline (stop if needed, token, start), independent of the others:
        no node waits at a barrier for the slowest one."""
        node = manifest.node(r.node)
        try:
            if node.name in plan.stop:
                stop_node(r, manifest, node, cluster_id)
            home = node_home(r)  # read once for both of orch's files on the node
            path = install_token(r, manifest, token, home) if token is not None else None
            install_serve_hooks(r, manifest, home)  # before Ray starts: a replica Serve restarts may land here
            env = ray_process_env(manifest, node, facts.get(node.name), path, options.serve_env, cluster_id=cluster_id)
            if haproxy_enabled(env):  # HAProxy's admin socket goes in here: no other user may reach it
                folder = haproxy_dir(manifest.ray.temp_dir)
                r.run(private_dir_argv(manifest, node, folder), timeout=60).check(node.name)
            if node.name == head.name:
                argv = head_start_argv(manifest, head, facts.get(head.name))
                _start(r, manifest, node, argv, env, deps.progress)
            else:
                # Started together with the head: the worker waits for the GCS to listen
                # (Ray's own retry loop, lengthened), so the bring-up takes as long as the
                # slowest node, not the head plus a worker.
                env[GCS_WAIT_ENV] = str(WORKER_GCS_WAIT_S)
                argv = worker_start_argv(manifest, node, facts.get(node.name), head_address)
                _start(r, manifest, node, argv, env, deps.progress, retry=lambda: not head_failed.is_set())
        except ClusterError as exc:  # collected below, so every failed node is named
            if node.name == head.name:
                head_failed.set()
            return exc
        return None

    with deps.open_dashboard(runners[head.name], manifest.ray.dashboard_port, token) as dash:
        where = f" (head {head.name} at {head_address}:{manifest.ray.port})" if head.name in plan.start else ""
        if head.name in plan.start and head_address in RAY_LOCALHOST_NAMES:
            where = f" (head {head.name})"  # Ray binds its own address, not loopback: told once it runs
        deps.progress(f"starting Ray on {', '.join(plan.start)}{where}")
        for name in plan.start:
            nic = collective_interface(manifest, manifest.node(name), facts.get(name))
            if nic.source == "derived" or (nic.source == "none" and manifest.accelerator != "cpu" and len(manifest.nodes) > 1):
                deps.progress(nic.describe(name))
        outcomes = fan_out([runners[n] for n in plan.start], bring_up)
        _raise_outcome_errors(outcomes, "bringing Ray up")
        failed = {o.node: o.value for o in outcomes if o.value is not None}
        if head.name in failed:
            raise failed[head.name]
        if failed:
            first = next(iter(failed.values()))
            raise ClusterError("; ".join(e.message for e in failed.values()), hint=first.hint)
        return wait_for_nodes(dash.nodes_with_usage, expected, options.timeout, clock=deps.clock, sleep=deps.sleep,
                              progress=deps.progress)  # fmt: skip


def _stop_removed(old: Manifest, removed: tuple[str, ...], deps: ClusterDeps) -> None:
    """Best effort: stop Ray on nodes that left the manifest or moved to another address, at their
    recorded address (reported, never fatal)."""
    deps.progress(f"stopping Ray at the recorded address of {', '.join(removed)}")
    cluster_id = deps.state.read_cluster_id(old.name)
    with deps.open_runners(old) as runners:
        for o in fan_out([runners[n] for n in removed if n in runners], lambda r: stop_node(r, old, old.node(r.node), cluster_id)):
            if not o.ok:
                deps.progress(f"could not stop Ray on removed node {o.node}: {o.error.message}")


# ------------------------------------------------------------------------------ status

