"""The Ray dashboard's JSON about nodes, parsed into ``NodeState`` values (pure): ``/api/v0/nodes``
(``parse_nodes``), ``/api/cluster_status`` usage (``parse_usage``, ``with_usage``), the current
node of each orch name (``current_by_name``) and what is wrong with the expected nodes
(``node_problems``). ``orchestrator.cluster.dashboard`` does the HTTP; the orch name of a Ray node
comes from its ``orch_node_<name>`` resource (``ray_nodes.node_name_from_resources``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.cluster.ray_nodes import node_name_from_resources


@dataclass(frozen=True)
class NodeState:
    """One Ray node as the dashboard reports it. ``name`` is the orch node name (from the
    ``orch_node_<name>`` resource), None for a node orch did not start. ``resources_used`` is
    filled from ``/api/cluster_status`` when it was read (empty otherwise)."""

    node_id: str
    name: str | None
    address: str
    state: str  # "ALIVE" | "DEAD"
    is_head: bool
    resources_total: dict[str, float] = field(default_factory=dict)
    resources_used: dict[str, float] = field(default_factory=dict)
    state_message: str | None = None
    start_time_ms: int = 0
    end_time_ms: int = 0

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"

    @property
    def gpus_total(self) -> float:
        return float(self.resources_total.get("GPU", 0.0))

    @property
    def gpus_used(self) -> float:
        return float(self.resources_used.get("GPU", 0.0))

    @property
    def cpus_total(self) -> float:
        return float(self.resources_total.get("CPU", 0.0))

    @property
    def resources_available(self) -> dict[str, float]:
        return {k: v - self.resources_used.get(k, 0.0) for k, v in self.resources_total.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "name": self.name,
            "address": self.address,
            "state": self.state,
            "is_head": self.is_head,
            "gpus_total": self.gpus_total,
            "gpus_used": self.gpus_used,
            "cpus_total": self.cpus_total,
            "state_message": self.state_message,
        }


class DashboardFormatError(ValueError):
    """The dashboard answered JSON of an unexpected shape."""


def _data(payload: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping) or not payload.get("result", False) or not isinstance(payload.get("data"), Mapping):
        msg = payload.get("msg") if isinstance(payload, Mapping) else None
        raise DashboardFormatError(f"{what}: the dashboard answered without data" + (f" ({msg})" if msg else ""))
    return payload["data"]


def parse_nodes(payload: Mapping[str, Any]) -> list[NodeState]:
    """``GET /api/v0/nodes?detail=true`` -> one NodeState per Ray node record (dead ones too)."""
    data = _data(payload, "/api/v0/nodes")
    result = data.get("result")
    rows = result.get("result") if isinstance(result, Mapping) else None
    if not isinstance(rows, list):
        raise DashboardFormatError("/api/v0/nodes: no node list in the answer")
    out = []
    for row in rows:
        resources = {str(k): float(v) for k, v in (row.get("resources_total") or {}).items()}
        out.append(
            NodeState(
                node_id=str(row["node_id"]),
                name=node_name_from_resources(resources),
                address=str(row.get("node_ip") or ""),
                state=str(row.get("state") or "UNKNOWN"),
                is_head=bool(row.get("is_head_node")),
                resources_total=resources,
                state_message=row.get("state_message"),
                start_time_ms=int(row.get("start_time_ms") or 0),
                end_time_ms=int(row.get("end_time_ms") or 0),
            )
        )
    return out


def parse_usage(payload: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``GET /api/cluster_status`` -> node id -> resource -> amount in use (GPU, CPU, memory...).

    Ray reports ``usageByNode[node_id][resource] = [used, total]``; resource names there are
    camel-cased (``objectStoreMemory``), which does not matter for GPU and CPU. A fresh cluster
    whose autoscaler monitor has not reported yet has an empty map."""
    data = _data(payload, "/api/cluster_status")
    report = ((data.get("clusterStatus") or {}).get("loadMetricsReport") or {}).get("usageByNode") or {}
    out: dict[str, dict[str, float]] = {}
    for node_id, usage in report.items():
        out[str(node_id)] = {str(res): float(pair[0]) for res, pair in usage.items() if isinstance(pair, list) and pair}
    return out


def with_usage(states: list[NodeState], usage: Mapping[str, Mapping[str, float]]) -> list[NodeState]:
    return [replace(s, resources_used=dict(usage.get(s.node_id, {}))) for s in states]


def current_by_name(states: list[NodeState]) -> dict[str, NodeState]:
    """Orch name -> the record that describes the node now: an ALIVE record if there is one,
    else the most recently started (a restarted node leaves its DEAD record behind)."""
    out: dict[str, NodeState] = {}
    for s in states:
        if s.name is None:
            continue
        cur = out.get(s.name)
        if cur is None or (s.alive, s.start_time_ms) > (cur.alive, cur.start_time_ms):
            out[s.name] = s
    return out


def node_problems(expected_gpus: Mapping[str, int], states: list[NodeState]) -> dict[str, str]:
    """Expected orch node -> why it is not ready (missing, dead, wrong GPU count); empty = ready."""
    current = current_by_name(states)
    problems: dict[str, str] = {}
    for name, gpus in expected_gpus.items():
        s = current.get(name)
        if s is None:
            problems[name] = "not in the Ray cluster"
        elif not s.alive:
            problems[name] = f"{s.state}" + (f": {s.state_message}" if s.state_message else "")
        elif round(s.gpus_total) != gpus:
            problems[name] = f"ALIVE with {s.gpus_total:g} GPUs, expected {gpus}"
    return problems
