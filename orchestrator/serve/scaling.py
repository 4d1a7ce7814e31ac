"""Replicas sized from measured capacity: how many a target rate needs, how many the cluster holds,
and Serve's autoscaling bounds. Pure.

The per-replica capacity is a recorded goodput (``bench.goodput``: requests/s and requests in
flight one replica sustained with the latency objective met). A target rate needs
``ceil(target / per-replica rate)`` replicas; each takes the plan's TP x PP GPUs.

How many replicas the cluster holds is the planner's count (``plan.layout.replicas_for``): a
replica inside a node takes ``tp*pp`` of its GPUs, so a node holds ``gpus_per_node // (tp*pp)``;
a larger one counts ``total GPUs // (tp*pp)``. On a CPU cluster the CPU plan's convention holds:
one engine per node.

Autoscaling (manifest ``serve.autoscaling: true``): Serve adds a replica when the average requests
in flight per replica pass ``target_ongoing_requests``, which is set to the per-replica
concurrency the objective held at (at least 1); ``min_replicas`` is what the target rate needs
(else the plan's replicas), ``max_replicas`` what the cluster's GPUs hold. A target the cluster
cannot hold is a PlanError naming both numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.bench.goodput import Goodput, replicas_for
from orchestrator.errors import PlanError
from orchestrator.plan.layout import replicas_for as groups_held
from orchestrator.plan.shape import ClusterShape


def replicas_that_fit(gpus_per_replica: int, shape: ClusterShape) -> int:
    """Replicas of ``gpus_per_replica`` GPUs the cluster's GPUs hold at once (the planner's count,
    ``plan.layout.replicas_for``)."""
    if gpus_per_replica < 1:
        raise ValueError("a replica takes at least one GPU")
    return groups_held(shape, gpus_per_replica, 1)


@dataclass(frozen=True)
class TargetSizing:
    """What a target rate needs against what the cluster holds."""

    target_rps: float
    per_replica_rps: float
    replicas: int
    gpus_per_replica: int
    gpus_needed: int
    gpus_total: int
    max_replicas: int

    @property
    def fits(self) -> bool:
        return self.replicas <= self.max_replicas

    def to_dict(self) -> dict:
        return {**self.__dict__, "fits": self.fits}

    def describe(self) -> str:
        unit = "node(s)" if self.gpus_total == 0 else "GPU(s)"
        need = f"{self.target_rps:g} req/s needs {self.replicas} replica(s) at {self.per_replica_rps:.2f} req/s each"
        have = f"{self.gpus_needed} {unit} of {self.gpus_total if self.gpus_total else self.max_replicas}; the cluster holds {self.max_replicas} replica(s)"
        return f"{need} = {have}: " + ("fits" if self.fits else "does NOT fit")


def size_for_target(target_rps: float, capacity: Goodput, gpus_per_replica: int, shape: ClusterShape) -> TargetSizing:
    """Replicas and GPUs ``target_rps`` needs at the recorded per-replica goodput."""
    replicas = replicas_for(target_rps, capacity.per_replica_req_per_s)
    per = 1 if shape.is_cpu else gpus_per_replica
    return TargetSizing(target_rps, capacity.per_replica_req_per_s, replicas, per, replicas * per,
                        0 if shape.is_cpu else shape.total_gpus, replicas_that_fit(gpus_per_replica, shape))  # fmt: skip


@dataclass(frozen=True)
class AutoscalingPlan:
    """Serve's autoscaling bounds and target, with why."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: int
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**self.__dict__, "reasons": list(self.reasons)}


def autoscaling_for(capacity: Goodput, gpus_per_replica: int, shape: ClusterShape, target_rps: float | None = None,
                    floor_replicas: int = 1) -> AutoscalingPlan:  # fmt: skip
    """The autoscaling policy from a recorded goodput (see the module doc)."""
    most = replicas_that_fit(gpus_per_replica, shape)
    reasons = [f"at most {most} replica(s): what the cluster's {'nodes' if shape.is_cpu else 'GPUs'} hold at {gpus_per_replica} GPU(s) each"]
    low = max(1, floor_replicas)
    if target_rps is not None:
        sizing = size_for_target(target_rps, capacity, gpus_per_replica, shape)
        low = max(low, sizing.replicas)
        reasons.append(f"at least {low}: the target {target_rps:g} req/s at {capacity.per_replica_req_per_s:.2f} req/s per replica")
    else:
        reasons.append(f"at least {low}: the plan's replicas (the manifest's slo sets no target_rps)")
    if low > most:
        raise PlanError(f"the target needs {low} replica(s) and the cluster holds {most}",
                        hint="add GPUs (nodes), lower slo.target_rps, or measure a higher goodput")  # fmt: skip
    conc = capacity.per_replica_concurrency
    target = max(1, math.floor(conc)) if conc is not None else 1
    reasons.append(f"target {target} request(s) in flight per replica: the objective held at {conc if conc is not None else '?'} ({capacity.level.label})")
    return AutoscalingPlan(low, most, target, tuple(reasons))
