"""The SLO gate of `orch rollout --slo-gate`: which load a candidate must carry, and whether it met
the objective there. Pure.

Before a side-by-side switch, the candidate (its own application on its own route) gets the load
level recorded for the live revision (`orch bench`/`orch accept`, ``workflows.load_record``): the
level of the live revision's goodput by the manifest's ``slo:`` now, i.e. the heaviest load the
live revision was measured to carry with the objective met. Its concurrency is scaled to the
candidate's replicas (the same load per replica), with the recorded number of requests and the
recorded request shape. The candidate passes when that level meets the objective
(``bench.goodput.misses``); otherwise the rollout fails before the switch and the live revision,
which never stopped serving, keeps serving.

``plan_gate`` refuses (a usage error, before anything is applied) when there is nothing to hold
the candidate to: no objective, no record for the live revision, or no recorded level that met
the objective.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.bench.goodput import LoadLevel, Objective, gate_concurrency, goodput, misses
from orchestrator.bench.latency import RequestRecord
from orchestrator.errors import UsageError


@dataclass(frozen=True)
class GatePlan:
    """The load the candidate gets, and the objective it is judged by."""

    recorded_revision: int
    level: LoadLevel  # the live revision's recorded level
    recorded_replicas: int
    candidate_replicas: int
    concurrency: int
    requests: int
    shape: Mapping[str, Any] = field(default_factory=dict)  # prompt/output tokens, workload
    objective: Mapping[str, Any] = field(default_factory=dict)  # ttft_p95_ms, tpot_p95_ms, max_error_rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded_revision": self.recorded_revision,
            "recorded_level": self.level.to_dict(),
            "recorded_replicas": self.recorded_replicas,
            "candidate_replicas": self.candidate_replicas,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "shape": dict(self.shape),
            "objective": dict(self.objective),
        }

    def describe(self) -> str:
        return (f"concurrency {self.concurrency}, {self.requests} requests of {self.shape.get('prompt_tokens', '?')} prompt / "
                f"{self.shape.get('output_tokens', '?')} output tokens (revision {self.recorded_revision}'s {self.level.label} "
                f"on {self.recorded_replicas} replica(s))")  # fmt: skip


@dataclass(frozen=True)
class _Bounds:
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    max_error_rate: float


def plan_gate(entry: Mapping[str, Any] | None, objective: Objective | None, live_revision: int | None,
              candidate_replicas: int) -> GatePlan:  # fmt: skip
    """The gate's load for a candidate of ``candidate_replicas`` replicas, from the live revision's
    record ``entry`` (``workflows.load_record``); a UsageError when there is none to hold it to."""
    hint = "run `orch bench CLUSTER_YAML` (or `orch accept`) against the live revision first: it records the load levels the gate replays"
    if objective is None:
        raise UsageError("--slo-gate: the manifest sets no slo: (ttft_p95_ms, tpot_p95_ms) to judge the candidate by",
                         hint="add an slo: section to the manifest (docs/manifest.md)")  # fmt: skip
    if live_revision is None:
        raise UsageError("--slo-gate: no revision is serving, so there is no recorded load to hold the candidate to",
                         hint="roll out without --slo-gate first, then measure it with `orch bench`")  # fmt: skip
    if not entry or not entry.get("levels"):
        raise UsageError(f"--slo-gate: revision {live_revision} has no recorded load levels", hint=hint)
    levels = [LoadLevel.from_dict(lv) for lv in entry["levels"]]
    recorded_replicas = int(entry.get("replicas") or 1)
    found = goodput(levels, objective, recorded_replicas)
    if found is None:
        first = min(levels, key=lambda lv: lv.load)
        raise UsageError(
            f"--slo-gate: revision {live_revision} met the objective at none of its recorded levels "
            f"({first.label}: {', '.join(misses(first, objective))})",
            hint="the live revision itself misses the slo: relax it, or record a lighter load with `orch bench --concurrency 1`",
        )
    concurrency = gate_concurrency(found.level, recorded_replicas, candidate_replicas)
    return GatePlan(
        recorded_revision=live_revision, level=found.level, recorded_replicas=recorded_replicas,
        candidate_replicas=candidate_replicas, concurrency=concurrency, requests=max(found.level.requests, concurrency),
        shape=dict(entry.get("shape") or {}),
        objective={"ttft_p95_ms": objective.ttft_p95_ms, "tpot_p95_ms": objective.tpot_p95_ms, "max_error_rate": objective.max_error_rate},
    )  # fmt: skip


def gate_figures(plan: GatePlan, measured: LoadLevel) -> str:
    """What the candidate measured, and how many of the planned requests it took (the gate ends
    a decided miss early: ``decided_miss``)."""
    text = (f"TTFT p95 {measured.ttft_p95_ms or 0:.0f} ms, TPOT p95 {measured.tpot_p95_ms or 0:.1f} ms, "
            f"{measured.succeeded}/{measured.requests} ok, {measured.req_per_s:.2f} req/s")  # fmt: skip
    if measured.requests < plan.requests:
        text += f" (stopped after {measured.requests} of {plan.requests} requests: the rest could not meet the objective)"
    return text


def _bounds(plan: GatePlan) -> _Bounds:
    """The plan's objective (a stored dict) as the bounds a level is judged by; the error budget
    defaults as the manifest's ``slo.max_error_rate`` does (1%)."""
    return _Bounds(plan.objective.get("ttft_p95_ms"), plan.objective.get("tpot_p95_ms"), float(plan.objective.get("max_error_rate", 0.01)))


def judge_gate(plan: GatePlan, measured: LoadLevel) -> list[str]:
    """Why the candidate's measured level misses the gate's objective ([] = it passes)."""
    return misses(measured, _bounds(plan))


# The percentile the objective bounds (bench.latency.percentile: linear between closest ranks).
GATE_PERCENTILE = 95


def _past_saving(values_ms: Iterable[float], bound_ms: float | None, most: int) -> bool:
    """Whether the p95 of at most ``most`` values exceeds ``bound_ms`` whatever the values not in
    yet: the lowest p95 comes when every value still to come is 0 and as many come as can. Of n
    sorted values the p95 lies between ranks floor(0.95 (n-1)) and the next (linear
    interpolation), so it exceeds the bound once the value at the lower rank does, i.e. once at
    least n - floor(0.95 (n-1)) values exceed it. That count never grows when n shrinks: fewer
    values to come only make the miss surer."""
    if bound_ms is None or most <= 0:
        return False
    over = sum(v > bound_ms for v in values_ms)
    return over >= most - math.floor((most - 1) * GATE_PERCENTILE / 100)


def decided_miss(plan: GatePlan, records: Iterable[RequestRecord]) -> str | None:
    """Why the gate's level already misses the objective whatever its remaining requests do (None:
    it can still pass). ``records`` are the requests answered so far out of ``plan.requests``.

    The gate stops there instead of sending the rest: a candidate that cannot pass would otherwise
    take the whole load (with max_num_seqs=1 at concurrency 8, 16 whole answers one at a time)
    before the rollback, holding its GPUs and the rollout that long. The level judged is then the
    requests answered, and ``judge_gate`` finds the same miss on it: a share of errors over the
    planned count is over it on fewer requests, and a p95 over the bound is over it on any subset
    of the values that holds the misses."""
    done = list(records)
    failed = sum(not r.ok for r in done)
    bounds = _bounds(plan)
    if failed / max(plan.requests, 1) > bounds.max_error_rate:
        return f"{failed} of {plan.requests} requests failed: over {bounds.max_error_rate:.1%} whatever the rest do"
    most = plan.requests - failed  # successes there can still be
    ok = [r for r in done if r.ok]
    for name, bound, values in (("TTFT", bounds.ttft_p95_ms, [r.ttft for r in ok]), ("TPOT", bounds.tpot_p95_ms, [r.tpot for r in ok])):
        if _past_saving([v * 1000.0 for v in values if v is not None], bound, most):
            return f"{name} p95 over {bound:g} ms whatever the rest of the {plan.requests} requests do"
    return None
