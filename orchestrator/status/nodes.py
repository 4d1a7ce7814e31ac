"""`orch status` as a value: what each node is doing and the cluster totals. Pure, no I/O.

``build_nodes_section`` joins three views of every manifest node: what Ray's dashboard lists
(ALIVE/DEAD, GPUs total/used, address), whether the node answered over SSH (and its software
versions, probed live), and the manifest (role, expected GPUs and type). ``StatusReport`` holds
that section and the ``serving`` section (``workflows.status.gather_serving``, added with
``with_serving``); ``extra`` holds the named sections (warnings, collective figures). Rendering lives in ``orchestrator.cli``.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class StatusReport:
    cluster: str
    nodes: NodesSection
    recorded: Mapping[str, Any] | None = None  # ClusterRecord.to_dict() of the last `orch up`
    serving: Any | None = None  # the serving section (status.views.ServingStatus), added by with_serving
    extra: Mapping[str, Any] = field(default_factory=dict)  # further sections: name -> value

    def with_serving(self, serving: Any) -> StatusReport:
        return replace(self, serving=serving)

    def with_section(self, name: str, value: Any) -> StatusReport:
        return replace(self, extra={**self.extra, name: value})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cluster": self.cluster,
            "recorded": dict(self.recorded) if self.recorded else None,
            **self.nodes.to_dict(),
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
