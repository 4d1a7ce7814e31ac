"""The collective check of `orch up` on the nodes: the I/O edge of ``orchestrator.collective``.

After preflight's static checks pass and before Ray starts: ask the hub for a free TCP port,
start the job (``remote/node_programs/collective_job.py``) on every node at once over the runners, with the
environment Ray and vLLM get, wait for all of them, and judge their reports (pure,
``collective.verdict``). Bounded: each job reports and exits by ``plan.deadline_s``; orch waits
``RUNNER_GRACE_S`` more per node, then gives up on it (the node's `timeout` kills the job).
Nothing is left behind: the jobs exit, and with them the hub's rendezvous port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from orchestrator.collective.plan import (
    RUNNER_GRACE_S,
    CollectivePlan,
    free_port_argv,
    job_argv,
    job_env,
    job_spec,
    parse_free_port,
    plan_check,
)
from orchestrator.collective.verdict import CollectiveReport, NodeRun, judge, summary_line
from orchestrator.errors import RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.findings import Finding
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.state import StateStore

Progress = Callable[[str], None]
CollectiveCheck = Callable[[Manifest, Mapping[str, Runner], Mapping[str, Any], Progress], "CollectiveReport | None"]


def collective_stage(
    manifest: Manifest,
    runners: Mapping[str, Runner],
    facts: Mapping[str, Any],
    findings: list[Finding],
    check: CollectiveCheck,
    state: StateStore,
    enabled: bool,
    progress: Progress,
) -> tuple[CollectiveReport | None, list[Finding]]:
    """`orch up`'s step after the static checks passed, before anything starts: run ``check``
    (unless ``enabled`` is off: --skip-collective-check), record its figures in the state
    whatever the outcome, and return them with the findings so far plus its own."""
    if not enabled:
        progress("collective check skipped (--skip-collective-check)")
        return None, findings
    report = check(manifest, runners, facts, progress)
    if report is None:
        return None, findings
    state.save_collective(manifest.name, report.to_dict())
    progress(summary_line(report))
    return report, findings + list(report.findings)


def run_collective_check(
    manifest: Manifest,
    runners: Mapping[str, Runner],
    facts: Mapping[str, Any],
    progress: Progress,
    clock: Callable[[], float] = time.monotonic,
    alltoall: bool = True,
) -> CollectiveReport | None:
    """Run the check (see the module doc); None when fewer than two nodes take part.
    ``alltoall=False`` leaves out the all-to-all between every pair (benchmarks/collective_check.py
    measures what it adds)."""
    plan = plan_check(manifest, facts, alltoall)
    if isinstance(plan, str):
        progress(plan)
        return None
    t0 = clock()
    where = ", ".join(f"{n}:{plan.interfaces[n] or 'default'}" for n in plan.ranks)
    what = "all-reduce and all-to-all" if plan.alltoall else "all-reduce"
    pairs = "every pair of nodes" if plan.alltoall else f"each worker paired with {plan.hub}"
    progress(f"collective check: {plan.backend} {what} over {len(plan.ranks)} nodes ({where}), {pairs}")
    hub = manifest.node(plan.hub)
    try:
        res = runners[plan.hub].run(free_port_argv(hub.python_bin(manifest)), timeout=30)
        port = parse_free_port(res.check(plan.hub).stdout)
    except (RemoteError, ValueError) as exc:
        run = NodeRun(plan.hub, error=f"could not pick a free port for the rendezvous: {exc}")
        return judge(plan, {plan.hub: run}, facts, 0, clock() - t0)
    runs = _run_jobs(manifest, plan, runners, facts, port)
    return judge(plan, runs, facts, port, clock() - t0)


def _run_jobs(manifest: Manifest, plan: CollectivePlan, runners: Mapping[str, Runner], facts: Mapping[str, Any],
              port: int) -> dict[str, NodeRun]:  # fmt: skip
    rank_of = {n: i for i, n in enumerate(plan.ranks)}

    def one(r: Runner) -> NodeRun:
        node = manifest.node(r.node)
        f = facts.get(r.node)
        argv = job_argv(node.python_bin(manifest), job_spec(plan, rank_of[r.node], port))
        env = job_env(manifest, r.node, f if isinstance(f, NodeFacts) else None, plan.backend)
        res = r.run(argv, timeout=plan.deadline_s + RUNNER_GRACE_S, env=env)
        return NodeRun(r.node, res.exit_code, res.stdout, res.stderr)

    outcomes = fan_out([runners[n] for n in plan.ranks], one)
    return {o.node: o.value if o.ok and o.value is not None else NodeRun(o.node, error=o.error.message if o.error else "?")
            for o in outcomes}  # fmt: skip
