"""Goodput: the load one replica sustains with the latency objective met, from measured load levels.
Pure, no I/O.

A load level (``bench.report.level_dict``: one concurrency or one Poisson rate of `orch bench`, a
level of `orch accept`'s sweep, the SLO gate's run) meets the objective when its TTFT p95 and TPOT
p95 are within ``ttft_p95_ms``/``tpot_p95_ms`` (a bound not set is not checked) and its error rate
is within ``max_error_rate`` (``misses`` says why not).

``goodput`` walks the levels from the lightest load up and stops at the first that misses: the
goodput is the level before it with the most successful requests per second (on a tie the lighter
level: the same rate with fewer requests in flight; a level past a miss does not count, even if it
happened to meet the objective: a sweep that crossed the line once has found it). When no level
missed, the figure is a lower bound (``crossed`` False): the replica may sustain more. No
interpolation between levels: the figure is one that was measured.

Per replica: the deployment's figures divided by the replicas that served the run. A level's
concurrency is the number of requests kept in flight; a rate level has none, so its mean
concurrency comes from Little's law (requests/s x mean end-to-end seconds).

``LoadLevel`` is what a revision records (``revisions/<n>.json``: ``load_levels``, ``goodput``)
and what the SLO gate replays; ``replicas_for`` is the plan's arithmetic for a target rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator import engine_metrics as prom


class Objective(Protocol):
    """``manifest.sections.Targets`` / ``Slo``: the bounds a level is judged by."""

    @property
    def ttft_p95_ms(self) -> float | None: ...
    @property
    def tpot_p95_ms(self) -> float | None: ...
    @property
    def max_error_rate(self) -> float: ...


@dataclass(frozen=True)
class LoadLevel:
    """One measured level, as recorded: its shape (so it can be replayed) and its figures."""

    label: str
    concurrency: int | None  # requests kept in flight; None for a rate level
    rate: float | None  # Poisson arrivals per second; None for a concurrency level
    requests: int
    succeeded: int
    error_rate: float
    req_per_s: float  # successful requests per second over the level
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    e2e_mean_ms: float | None
    prompt_tokens: int | None = None  # the shape the level was sent with
    output_tokens: int | None = None

    @classmethod
    def from_level(cls, level: Mapping[str, Any], prompt_tokens: int | None = None, output_tokens: int | None = None) -> LoadLevel:
        """From a bench level dict (``bench.report.level_dict``)."""
        return cls(
            label=str(level["label"]),
            concurrency=level.get("concurrency"),
            rate=level.get("rate"),
            requests=int(level["requests"]),
            succeeded=int(level["succeeded"]),
            error_rate=float(level["error_rate"]),
            req_per_s=float(level.get("req_per_s") or 0.0),
            ttft_p95_ms=(level.get("ttft_ms") or {}).get("p95"),
            tpot_p95_ms=(level.get("tpot_ms") or {}).get("p95"),
            e2e_mean_ms=(level.get("e2e_ms") or {}).get("mean"),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LoadLevel:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def in_flight(self) -> float | None:
        """Requests in flight: the level's concurrency, else Little's law (rate x mean latency)."""
        if self.concurrency is not None:
            return float(self.concurrency)
        if self.e2e_mean_ms is None:
            return None
        return self.req_per_s * self.e2e_mean_ms / 1000.0

    @property
    def load(self) -> float:
        """What orders levels from light to heavy: the concurrency, else the offered rate."""
        return float(self.concurrency if self.concurrency is not None else self.rate or 0.0)


def misses(level: LoadLevel, objective: Objective) -> list[str]:
    """Why ``level`` misses the objective ([] = it meets it)."""
    if level.succeeded == 0:
        return ["no request succeeded"]
    reasons = []
    if level.error_rate > objective.max_error_rate:
        reasons.append(f"error rate {level.error_rate:.1%} > {objective.max_error_rate:.1%}")
    if objective.ttft_p95_ms is not None and level.ttft_p95_ms is not None and level.ttft_p95_ms > objective.ttft_p95_ms:
        reasons.append(f"TTFT p95 {level.ttft_p95_ms:.0f} ms > {objective.ttft_p95_ms:g} ms")
    if objective.tpot_p95_ms is not None and level.tpot_p95_ms is not None and level.tpot_p95_ms > objective.tpot_p95_ms:
        reasons.append(f"TPOT p95 {level.tpot_p95_ms:.1f} ms > {objective.tpot_p95_ms:g} ms")
    return reasons


@dataclass(frozen=True)
class Goodput:
    """What the deployment sustained with the objective met, and what that is per replica."""

    level: LoadLevel  # the level it was measured at
    replicas: int  # replicas that served the run
    crossed: bool  # a heavier level missed the objective (False: every level met it: a lower bound)
    missed_at: str | None = None  # the first level that missed, and why
    why: tuple[str, ...] = ()

    @property
    def req_per_s(self) -> float:
        return self.level.req_per_s

    @property
    def per_replica_req_per_s(self) -> float:
        return self.level.req_per_s / self.replicas

    @property
    def per_replica_concurrency(self) -> float | None:
        in_flight = self.level.in_flight
        return None if in_flight is None else in_flight / self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {
            "req_per_s": self.req_per_s,
            "per_replica_req_per_s": self.per_replica_req_per_s,
            "per_replica_concurrency": self.per_replica_concurrency,
            "replicas": self.replicas,
            "level": self.level.to_dict(),
            "crossed": self.crossed,
            "missed_at": self.missed_at,
            "missed_because": list(self.why),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Goodput:
        return cls(LoadLevel.from_dict(data["level"]), int(data["replicas"]), bool(data["crossed"]),
                   data.get("missed_at"), tuple(data.get("missed_because") or ()))  # fmt: skip

    def describe(self) -> str:
        conc = self.per_replica_concurrency
        per = f"{self.per_replica_req_per_s:.2f} req/s" + (f" at {conc:g} in flight" if conc is not None else "")
        bound = f" (missed at {self.missed_at}: {', '.join(self.why)})" if self.crossed else " (every level met the objective: a lower bound)"
        return f"{per} per replica ({self.req_per_s:.2f} req/s over {self.replicas} replica(s), {self.level.label}){bound}"


def goodput(levels: Sequence[LoadLevel], objective: Objective, replicas: int) -> Goodput | None:
    """The goodput of a run (see the module doc); None when even the lightest level misses."""
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    best: LoadLevel | None = None
    for level in sorted(levels, key=lambda lv: lv.load):
        why = misses(level, objective)
        if why:
            if best is None:
                return None
            return Goodput(best, replicas, True, level.label, tuple(why))
        if best is None or level.req_per_s > best.req_per_s:
            best = level
    return None if best is None else Goodput(best, replicas, False)


def replicas_for(target_rps: float, per_replica_req_per_s: float) -> int:
    """Replicas that serve ``target_rps`` when each sustains ``per_replica_req_per_s``."""
    if target_rps <= 0 or per_replica_req_per_s <= 0:
        raise ValueError("the target rate and the per-replica goodput must be positive")
    # A ratio that is a whole number up to float noise (12.000000001) needs no extra replica.
    ratio = target_rps / per_replica_req_per_s
    return max(1, math.ceil(ratio - 1e-9))


def gate_concurrency(level: LoadLevel, recorded_replicas: int, candidate_replicas: int) -> int:
    """The concurrency the SLO gate sends to a candidate: the recorded level's load per replica
    times the candidate's replicas (the recorded concurrency itself when both have as many)."""
    in_flight = level.in_flight or 1.0
    return max(1, round(in_flight * candidate_replicas / max(1, recorded_replicas)))


def replicas_that_served(before: Sequence[prom.Sample], after: Sequence[prom.Sample], model: str | None = None) -> int | None:
    """How many engine replicas finished requests between two scrapes (``engine_metrics`` samples
    of the Ray export, which labels each engine's series with its ``ReplicaId``); None when the
    pages label no replicas (a bare vLLM: one engine)."""
    ids = {s.label(prom.REPLICA_LABEL) for s in after if s.label(prom.REPLICA_LABEL)}
    served = 0
    for rid in ids:
        where = {prom.REPLICA_LABEL: rid, **({prom.MODEL_LABEL: model} if model else {})}
        if (prom.counter(after, prom.REQUEST_SUCCESS, where) or 0.0) > (prom.counter(before, prom.REQUEST_SUCCESS, where) or 0.0):
            served += 1
    return served or None
