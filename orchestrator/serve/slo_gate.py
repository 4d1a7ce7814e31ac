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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.bench.goodput import LoadLevel, Objective, gate_concurrency, goodput, misses
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


def judge_gate(plan: GatePlan, measured: LoadLevel) -> list[str]:
    """Why the candidate's measured level misses the gate's objective ([] = it passes)."""
    bounds = _Bounds(plan.objective.get("ttft_p95_ms"), plan.objective.get("tpot_p95_ms"), float(plan.objective.get("max_error_rate", 0.01)))
    return misses(measured, bounds)
