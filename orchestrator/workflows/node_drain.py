"""The gates and the drain of `orch up`'s per-node changes (issue 46). Does I/O through the head's
runner (`ray drain-node`) and the dashboard client (the actor list); clock and sleep injected.

- ``refuse_downtime``: a full restart stops every model Serve runs; with a model recorded as
  serving it needs ``--allow-downtime`` (exit 2 otherwise, naming the model and why).
- ``check_room``: the workers to drain hold engines that must fit on the nodes that keep
  running; otherwise exit 2 naming the model and what it needs, unless ``--allow-downtime``.
- ``drain_workers``: `ray drain-node` with a deadline, then wait until Serve moved the engines
  off the node (none of its engine actors ALIVE there), up to that deadline; every node's
  outcome and time is said through ``progress``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.drain import NoRoom, drain_argv, room_elsewhere, serving_on
from orchestrator.cluster.node_state import NodeState, current_by_name
from orchestrator.cluster.ray_nodes import node_token_path
from orchestrator.cluster.up_plan import UpPlan
from orchestrator.errors import ClusterError, OrchError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.runbooks import runbook
from orchestrator.state import Revision
from orchestrator.status.workers import ACTORS_PARAMS, ACTORS_PATH, ActorRecord, parse_actors

DRAIN_POLL_S = 2.0
RUNBOOK = runbook("node-changes")


class DowntimeRefused(UsageError):
    """The change would stop a model that serves; `--allow-downtime` accepts that (exit 2)."""


@dataclass(frozen=True)
class Drained:
    node: str
    seconds: float
    left: Mapping[str, int]  # model -> engine actors still on the node at the deadline (empty: all moved)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "seconds": round(self.seconds, 2), "left": dict(self.left)}


def refuse_downtime(plan: UpPlan, revision: Revision | None, allow: bool) -> None:
    if not plan.downtime or revision is None or allow:
        return
    raise DowntimeRefused(
        f"this change restarts the head, which stops {revision.model} (revision {revision.number}, serving now): "
        + "; ".join(plan.downtime),
        hint="`orch up --dry-run` shows every node's action; accept the outage with `orch up --allow-downtime`, "
        f"or undo that part of the change; see {RUNBOOK}",
    )


def read_actors(dash: Any) -> list[ActorRecord]:
    try:
        return parse_actors(dash.get_json(ACTORS_PATH, ACTORS_PARAMS))
    except ValueError as exc:
        raise ClusterError(f"unexpected answer from the Ray dashboard: {exc}") from exc


def check_room(plan: UpPlan, states: list[NodeState], actors: list[ActorRecord], accelerator: str, allow: bool) -> list[NoRoom]:
    """Refuse (exit 2) when a drained worker's engines cannot move; returns what was accepted
    with ``allow`` (for the report)."""
    current = current_by_name(states)
    leaving = {n: current[n] for n in plan.drain if n in current}
    models = {n: serving_on(actors, s.node_id) for n, s in leaving.items()}
    staying = [s for n, s in current.items() if n not in leaving]
    short = room_elsewhere(leaving, staying, models, "GPU" if accelerator == "gpu" else "CPU")
    if short and not allow:
        raise DowntimeRefused(
            "draining would stop a model that has no room elsewhere: " + "; ".join(s.message() for s in short),
            hint="add a worker first (then drain), or accept the outage with `orch up --allow-downtime`; "
            f"see {RUNBOOK}",
        )
    return short


def drain_workers(
    manifest: Manifest,
    head_runner: Runner,
    head_address: str,
    targets: Mapping[str, str],
    dash: Any,
    deadline_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    progress: Callable[[str], None],
) -> list[Drained]:
    """Drain every target (orch name -> Ray node id) at once, then wait until each has no engine
    actor left or the deadline passed (then its engines are stopped with Ray: said, not fatal)."""
    env: dict[str, str] = {}
    if manifest.ray.token_auth:
        home = head_runner.run(["printenv", "HOME"], timeout=30).check(head_runner.node).stdout.strip()
        env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": node_token_path(manifest.name, home)}
    t0 = clock()
    for name, node_id in targets.items():
        why = f"orch up: {name} leaves or restarts; Serve moves its replicas"
        argv = drain_argv(manifest, manifest.head, head_address, node_id, deadline_s, why)
        res = head_runner.run(argv, timeout=120, env=env)
        if not res.ok:
            tail = " | ".join((res.stderr.strip() or res.stdout.strip()).splitlines()[-2:])
            raise ClusterError(f"`ray drain-node` of {name} failed (exit {res.exit_code}): {tail}",
                               hint=f"nothing was stopped; see {RUNBOOK}")  # fmt: skip
        progress(f"draining {name} (deadline {deadline_s:g} s): Serve starts its replicas elsewhere, then stops them there")
    done: dict[str, Drained] = {}
    left: dict[str, dict[str, int]] = {}
    while True:
        try:
            actors = read_actors(dash)
        except OrchError as exc:  # a passing dashboard hiccup is not a failed drain
            progress(f"reading Ray's actors: {exc.message}")
            actors = None
        for name, node_id in targets.items():
            if name in done or actors is None:
                continue
            left[name] = serving_on(actors, node_id)
            if not left[name]:
                done[name] = Drained(name, clock() - t0, {})
                progress(f"{name} drained after {clock() - t0:.0f} s: no engine of Serve left there")
        if len(done) == len(targets):
            break
        if clock() - t0 >= deadline_s:
            for name in targets:
                if name not in done:
                    done[name] = Drained(name, clock() - t0, dict(left.get(name, {})))
                    progress(f"{name} still runs {left.get(name)} after the {deadline_s:g} s drain deadline: "
                             "stopping Ray there ends their in-flight requests")  # fmt: skip
            break
        sleep(DRAIN_POLL_S)
    return [done[n] for n in targets]
