"""Draining a worker before `orch up` stops it (issue 46): the `ray drain-node` argv, what a node
still serves (from Ray's actor list), and whether the rest of the cluster has room for it. Pure.

Ray 2.60: `ray drain-node --address HEAD:PORT --node-id ID --reason DRAIN_NODE_REASON_PREEMPTION
--reason-message TEXT --deadline-remaining-seconds N` asks the GCS to drain the node
(``ray/scripts/scripts.py``; a preemption drain is accepted even when the node is busy, an
idle-termination one is refused). Ray schedules nothing new there, and Serve's controller
migrates the replicas of a draining node: a RUNNING replica is marked PENDING_MIGRATION, a
replacement starts on another node first, and the old one is stopped gracefully once the
replacement runs (``ray/serve/_private/deployment_state.py``,
``migrate_replicas_on_draining_nodes``), which lets its in-flight requests finish. orch waits
until no engine actor of Serve is ALIVE on the node, up to the deadline it gave Ray, then stops
Ray there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.cluster.node_state import NodeState
from orchestrator.cluster.ray_nodes import ray_argv
from orchestrator.manifest.model import Manifest
from orchestrator.manifest.sections import NodeSpec
from orchestrator.status.workers import WORKER_CLASSES, ActorRecord

DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"
SERVE_REPLICA_PREFIX = "ServeReplica:"
# Deployments that hold no engine: Serve keeps a router next to the proxy of its node and moves
# it with the proxy, after the engines (deployment_state.py), so orch does not wait for them.
ROUTER_DEPLOYMENTS = ("LLMRouter", "OpenAiIngress")


def drain_argv(manifest: Manifest, head: NodeSpec, head_address: str, node_id: str, deadline_s: float, why: str) -> list[str]:
    """`ray drain-node` of ``node_id``, run on the head with the cluster's Python."""
    return ray_argv(
        manifest, head, "drain-node",
        "--address", f"{head_address}:{manifest.ray.port}",
        "--node-id", node_id,
        "--reason", DRAIN_REASON,
        "--reason-message", why,
        "--deadline-remaining-seconds", str(int(deadline_s)),
    )  # fmt: skip


def _deployment(class_name: str) -> tuple[str, str] | None:
    """``ServeReplica:orch-r1:LLMServer:tiny`` -> (``LLMServer:tiny``, model ``tiny``)."""
    if not class_name.startswith(SERVE_REPLICA_PREFIX):
        return None
    parts = class_name.split(":")
    if len(parts) < 3:
        return None
    deployment = ":".join(parts[2:])
    return deployment, parts[-1] if len(parts) > 3 else deployment


def serving_on(actors: Iterable[ActorRecord], node_id: str) -> dict[str, int]:
    """Model -> how many of its engine actors (Serve replicas and vLLM's Ray workers) are ALIVE
    on ``node_id``. A worker counts for the model of the replica that shares its placement group;
    routers (``ROUTER_DEPLOYMENTS``) and Serve's own actors do not count."""
    alive = [a for a in actors if a.state == "ALIVE"]
    model_of_group: dict[str, str] = {}
    for a in alive:
        dep = _deployment(a.class_name)
        if dep is not None and a.placement_group_id:
            model_of_group[a.placement_group_id] = dep[1]
    out: dict[str, int] = {}
    for a in alive:
        if a.node_id != node_id:
            continue
        dep = _deployment(a.class_name)
        if dep is not None:
            if dep[0] in ROUTER_DEPLOYMENTS:
                continue
            model = dep[1]
        elif a.class_name in WORKER_CLASSES:
            model = model_of_group.get(a.placement_group_id or "", "?")
        else:
            continue
        out[model] = out.get(model, 0) + 1
    return out


@dataclass(frozen=True)
class NoRoom:
    """A drained node's engines need what no staying node has free."""

    node: str
    models: tuple[str, ...]
    resource: str
    needed: float
    most_free: float
    most_free_on: str | None

    def message(self) -> str:
        where = f" ({self.most_free:g} free on {self.most_free_on})" if self.most_free_on else " (no other node is ALIVE)"
        return (f"{', '.join(self.models)} on {self.node} uses {self.needed:g} {self.resource}; no node that keeps "
                f"running has that much free{where}")  # fmt: skip


def room_elsewhere(
    leaving: Mapping[str, NodeState], staying: Iterable[NodeState], models: Mapping[str, Mapping[str, int]], resource: str
) -> list[NoRoom]:
    """For each leaving node (orch name -> its Ray state) whose ``models`` (node -> model ->
    actors, from ``serving_on``) are not empty: is there one staying ALIVE node with at least the
    ``resource`` (GPU, or CPU on a CPU cluster) the node uses now free? A replica is placed whole
    in one placement group, so the largest free amount on one node is what counts; empty = room."""
    free = [(s.resources_available.get(resource, 0.0), s.name or s.node_id[:12]) for s in staying if s.alive]
    best = max(free, default=(0.0, None))
    out: list[NoRoom] = []
    for name, state in leaving.items():
        held = models.get(name) or {}
        if not held:
            continue
        needed = state.resources_used.get(resource, 0.0)
        if needed > best[0]:
            out.append(NoRoom(name, tuple(sorted(held)), resource, needed, best[0], best[1]))
    return out
