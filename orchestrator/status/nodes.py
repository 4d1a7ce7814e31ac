"""`orch status` as a value: what each node is doing and the cluster totals. Pure, no I/O.

``build_nodes_section`` joins three views of every manifest node: what Ray's dashboard lists
(ALIVE/DEAD, GPUs total/used, address), whether the node answered over SSH (and its software
versions, probed live), and the manifest (role, expected GPUs and type). ``StatusReport`` holds
that section and the ``serving`` section (``workflows.status.gather_serving``, added with
``with_serving``); ``extra`` holds the named sections (warnings, collective figures). Rendering lives in ``orchestrator.cli``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.cluster.node_state import NodeState, current_by_name
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import Versions

# Ray state of a manifest node as status reports it.
ALIVE, DEAD, MISSING, UNKNOWN = "ALIVE", "DEAD", "MISSING", "UNKNOWN"


@dataclass(frozen=True)
class NodeRow:
    name: str
    role: str
    host: str
    address: str | None  # the Ray node's address (None when Ray does not list it)
    ray_state: str  # ALIVE | DEAD | MISSING (not in Ray) | UNKNOWN (dashboard unreadable)
    reachable: bool  # answered over SSH just now
    gpus_expected: int
    gpus_total: float | None
    gpus_used: float | None
    gpu_type: str | None
    versions: Versions | None = None
    node_id: str | None = None
    detail: str | None = None  # why it is dead / unreachable
    # when Ray registered this node (the dashboard's start_time_ms): a node id or start time that
    # changed between two reports is a restart of that node, intended or not
    start_time_ms: int | None = None

    @property
    def healthy(self) -> bool:
        return self.reachable and self.ray_state == ALIVE and round(self.gpus_total or 0) == self.gpus_expected

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "host": self.host,
            "address": self.address,
            "ray_state": self.ray_state,
            "reachable": self.reachable,
            "healthy": self.healthy,
            "gpus_expected": self.gpus_expected,
            "gpus_total": self.gpus_total,
            "gpus_used": self.gpus_used,
            "gpu_type": self.gpu_type,
            "versions": self.versions.to_dict() if self.versions else None,
            "node_id": self.node_id,
            "start_time_ms": self.start_time_ms,
            "started_at": started_at(self.start_time_ms),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class NodesSection:
    rows: list[NodeRow]
    dashboard_error: str | None = None
    ray_version: str | None = None
    foreign_nodes: int = 0  # ALIVE Ray nodes that orch did not start

    @property
    def alive(self) -> int:
        return sum(1 for r in self.rows if r.ray_state == ALIVE)

    @property
    def gpus_total(self) -> float:
        return sum(r.gpus_total or 0 for r in self.rows if r.ray_state == ALIVE)

    @property
    def gpus_used(self) -> float:
        return sum(r.gpus_used or 0 for r in self.rows if r.ray_state == ALIVE)

    @property
    def healthy(self) -> bool:
        return self.dashboard_error is None and all(r.healthy for r in self.rows)

    @property
    def unreachable(self) -> list[str]:
        """The nodes that did not answer over SSH."""
        return [r.name for r in self.rows if not r.reachable]

    def to_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "totals": {
                "nodes": len(self.rows),
                "alive": self.alive,
                "gpus_total": self.gpus_total,
                "gpus_used": self.gpus_used,
                "gpus_expected": sum(r.gpus_expected for r in self.rows),
            },
            "dashboard_error": self.dashboard_error,
            "ray_version": self.ray_version,
            "foreign_nodes": self.foreign_nodes,
            "nodes": [r.to_dict() for r in self.rows],
        }


def started_at(start_time_ms: int | None) -> str | None:
    """Ray's start time in milliseconds since the epoch as ISO 8601 UTC (None when unknown)."""
    if not start_time_ms:
        return None
    return _dt.datetime.fromtimestamp(start_time_ms / 1000, _dt.timezone.utc).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class StatusReport:
    """``expected_model``: the model of the revision recorded as ready while the cluster is up,
    which the cluster should be serving. The top-level ``healthy`` is the nodes' health and, when
    a model is expected, the serving section's: a cluster whose model is not served is not healthy,
    whatever its nodes say."""

    cluster: str
    nodes: NodesSection
    recorded: Mapping[str, Any] | None = None  # ClusterRecord.to_dict() of the last `orch up`
    serving: Any | None = None  # the serving section (status.views.ServingStatus), added by with_serving
    extra: Mapping[str, Any] = field(default_factory=dict)  # further sections: name -> value
    expected_model: str | None = None

    @property
    def serving_healthy(self) -> bool | None:
        """None when no model is expected; else whether it is served (False when not read)."""
        if self.expected_model is None:
            return None
        return self.serving is not None and bool(getattr(self.serving, "healthy", False))

    @property
    def healthy(self) -> bool:
        return self.nodes.healthy and self.serving_healthy is not False

    def with_serving(self, serving: Any) -> StatusReport:
        return replace(self, serving=serving)

    def with_section(self, name: str, value: Any) -> StatusReport:
        return replace(self, extra={**self.extra, name: value})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cluster": self.cluster,
            "recorded": dict(self.recorded) if self.recorded else None,
            **self.nodes.to_dict(),
            "healthy": self.healthy,
            "nodes_healthy": self.nodes.healthy,
            "expected_model": self.expected_model,
            "serving_healthy": self.serving_healthy,
            "serving": _plain(self.serving),
        }
        for name, value in self.extra.items():
            out[name] = _plain(value)
        return out


def _plain(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def build_nodes_section(
    manifest: Manifest,
    states: list[NodeState] | None,
    reach: Mapping[str, Versions | str],
    dashboard_error: str | None = None,
    ray_version: str | None = None,
) -> NodesSection:
    """``states``: the dashboard's node list (None when it could not be read, see
    ``dashboard_error``). ``reach``: node name -> its Versions when it answered over SSH, or the
    error text when it did not."""
    current = current_by_name(states or [])
    rows = []
    for node in manifest.nodes:
        probe = reach.get(node.name)
        reachable = isinstance(probe, Versions)
        s = current.get(node.name)
        if states is None:  # the dashboard's error is said once, not on every node
            ray_state, detail = UNKNOWN, None
        elif s is None:
            ray_state, detail = MISSING, "not in the Ray cluster"
        else:
            ray_state, detail = (ALIVE, None) if s.alive else (DEAD, s.state_message or s.state)
        if not reachable:
            why = probe if isinstance(probe, str) else "not probed"
            detail = f"unreachable over SSH: {_without_node(why, node.name)}" + (f"; {detail}" if detail else "")
        accel = _accelerator_type(s) or node.gpu_type
        rows.append(
            NodeRow(
                name=node.name,
                role=node.role,
                host=node.host,
                address=s.address if s else None,
                ray_state=ray_state,
                reachable=reachable,
                gpus_expected=node.gpus,
                gpus_total=s.gpus_total if s else None,
                gpus_used=s.gpus_used if s else None,
                gpu_type=accel,
                versions=probe if reachable else None,  # type: ignore[arg-type]
                node_id=s.node_id if s else None,
                detail=detail,
                start_time_ms=(s.start_time_ms or None) if s else None,
            )
        )
    names = {n.name for n in manifest.nodes}
    foreign = sum(1 for s in (states or []) if s.alive and s.name not in names)
    return NodesSection(rows, dashboard_error=dashboard_error, ray_version=ray_version, foreign_nodes=foreign)


def _without_node(message: str, node: str) -> str:
    # remote errors start with the node's name ("head: identity file ... does not exist"); the
    # row names the node already, and without it equal causes read alike and are said once
    return message.removeprefix(f"{node}: ")


def _accelerator_type(state: NodeState | None) -> str | None:
    """Ray's ``accelerator_type:<X>`` resource (present when Ray detected the GPUs itself)."""
    if state is None:
        return None
    for key in state.resources_total:
        if key.startswith("accelerator_type:"):
            return key.split(":", 1)[1]
    return None
