"""The serving part of `orch status` as values: the application's deployments, replicas and
engine workers with their nodes, each model's KV capacity and live figures, the revision, and the
problems found. Pure data with their JSON form; ``status.serving`` builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.status.engine_stats import DpRank, KvCapacity, LiveMetrics, PrefixCache, ReplicaGauges


@dataclass(frozen=True)
class Problem:
    severity: str  # "fail" | "warn"
    code: str
    subject: str  # what it is about: a node, a deployment, a replica, "endpoint"
    message: str
    hint: str  # ends with runbooks/<CODE>.md

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

@dataclass(frozen=True)
class WorkerView:
    """One engine worker of a replica (``status.workers.EngineWorker``) with its manifest node."""

    rank: str | None
    node: str | None  # manifest node name (else the Ray node id)
    node_id: str | None
    pid: int | None
    state: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

@dataclass(frozen=True)
class ReplicaView:
    replica_id: str
    deployment: str
    state: str
    node: str | None  # manifest node name (else the node's address)
    node_id: str | None
    node_state: str | None  # the node's Ray state as the nodes section saw it
    pid: int | None
    worker_id: str | None = None
    capacity: KvCapacity | None = None
    log_error: str | None = None  # why its engine log could not be read
    workers: tuple[WorkerView, ...] = ()  # the engine's Ray worker actors (GPU layout), rank order
    dp: DpRank | None = None  # a DPServer replica: its data-parallel rank (from its log)
    gauges: ReplicaGauges | None = None  # its engine's KV-cache usage and queues now (metrics)
    prefix_cache: PrefixCache | None = None  # its engine's prefix-cache counters since it started
    start_time_s: float | None = None  # when Serve started its actor (Unix s)

    def to_dict(self) -> dict[str, Any]:
        g = self.gauges
        return {
            "dp": self.dp.to_dict() if self.dp else None,
            "kv_cache_usage": g.kv_cache_usage if g else None,
            "running": g.running if g else None,
            "waiting": g.waiting if g else None,
            "workers": [w.to_dict() for w in self.workers],
            "prefix_cache": self.prefix_cache.to_dict() if self.prefix_cache else None,
            "replica_id": self.replica_id,
            "deployment": self.deployment,
            "state": self.state,
            "node": self.node,
            "node_id": self.node_id,
            "node_state": self.node_state,
            "pid": self.pid,
            "start_time_s": self.start_time_s,
            "kv_cache_tokens": self.capacity.tokens if self.capacity else None,
            "log_error": self.log_error,
        }

@dataclass(frozen=True)
class DeploymentView:
    name: str
    status: str
    message: str
    target_replicas: int | None
    replicas: tuple[ReplicaView, ...]
    max_ongoing_requests: int | None = None  # Serve's cap per replica, as deployed

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "target_replicas": self.target_replicas,
            "max_ongoing_requests": self.max_ongoing_requests,
            "replicas": [r.to_dict() for r in self.replicas],
        }

@dataclass(frozen=True)
class ModelView:
    model_id: str
    max_model_len: int | None  # as configured in the revision
    capacity: KvCapacity | None
    live: LiveMetrics | None
    slo: SloView | None = None  # the live p95s against the manifest's objective
    max_num_seqs: int | None = None  # the engine's batch, as configured in the revision
    max_ongoing_requests: int | None = None  # Serve's cap per engine replica, as deployed

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_ongoing_requests": self.max_ongoing_requests,
            "kv_cache": self.capacity.to_dict() if self.capacity else None,
            "live": self.live.to_dict() if self.live else None,
            "slo": self.slo.to_dict() if self.slo else None,
        }

@dataclass(frozen=True)
class SloView:
    """The engines' live TTFT/TPOT p95 (vLLM's histograms over the status window) against the
    objective's bounds; ``met`` None when there is no figure to judge (no request finished)."""

    ttft_p95_ms: float | None  # the bound
    tpot_p95_ms: float | None
    live_ttft_p95_ms: float | None
    live_tpot_p95_ms: float | None
    met: bool | None
    misses: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "misses": list(self.misses)}

@dataclass(frozen=True)
class RevisionView:
    number: int
    model: str
    status: str
    config_fingerprint: str
    created_at: float | None
    finished_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

@dataclass(frozen=True)
class ServedModelView:
    """One served model (several per cluster): its revision, its application and its engine
    replicas as Serve lists them (id, state, node, start time: a restart shows as a new id)."""

    served_name: str
    revision: int
    app_name: str | None
    app_status: str | None  # None: not in Serve
    route_prefix: str | None
    replicas: tuple[tuple[str, str, str | None, float | None], ...] = ()  # (id, state, node, start_time_s)

    def to_dict(self) -> dict[str, Any]:
        return {"served_name": self.served_name, "revision": self.revision, "application": self.app_name, "status": self.app_status,
                "route_prefix": self.route_prefix,
                "replicas": [{"replica_id": i, "state": s, "node": n, "start_time_s": t} for i, s, n, t in self.replicas]}  # fmt: skip


@dataclass(frozen=True)
class ServingStatus:
    app_name: str | None
    app_status: str | None  # RUNNING, DEPLOYING, ... None: not in Serve (or Serve unreadable)
    app_message: str = ""
    route_prefix: str | None = None
    endpoint: str | None = None
    revision: RevisionView | None = None
    deployments: tuple[DeploymentView, ...] = ()
    models: tuple[ModelView, ...] = ()
    probe: ProbeResult | None = None
    problems: tuple[Problem, ...] = ()
    other_apps: tuple[tuple[str, str], ...] = ()  # (name, status) of further Serve applications
    notes: tuple[str, ...] = ()
    calibration: Mapping[str, Any] | None = None  # predicted vs measured memory (orchestrator.plan.calibration)
    served_models: tuple[ServedModelView, ...] = ()  # every model the cluster serves (each its own application)

    @property
    def healthy(self) -> bool:
        return self.app_status == "RUNNING" and (self.probe is None or self.probe.ok) and not any(
            p.severity == "fail" for p in self.problems
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "application": {"name": self.app_name, "status": self.app_status, "message": self.app_message,
                            "route_prefix": self.route_prefix},  # fmt: skip
            "endpoint": self.endpoint,
            "revision": self.revision.to_dict() if self.revision else None,
            "deployments": [d.to_dict() for d in self.deployments],
            "models": [m.to_dict() for m in self.models],
            "probe": self.probe.to_dict() if self.probe else None,
            "problems": [p.to_dict() for p in self.problems],
            "other_applications": [{"name": n, "status": s} for n, s in self.other_apps],
            "notes": list(self.notes),
            "calibration": dict(self.calibration) if self.calibration else None,
            "served_models": [m.to_dict() for m in self.served_models],
        }

@dataclass(frozen=True)
class NodeRef:
    """What serving needs to know of a Ray node (from the nodes section of `orch status`)."""

    name: str
    node_id: str | None
    ray_state: str  # ALIVE | DEAD | MISSING | UNKNOWN
    reachable: bool = True
    detail: str | None = None
