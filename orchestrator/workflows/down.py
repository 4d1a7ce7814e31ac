"""`orch down` over ``ClusterDeps``: kill this cluster's processes (Ray, and the vLLM engines it
spawned) on every node in parallel and remove the node's token copy; unreachable nodes are
reported, not fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator import cluster_lock
from orchestrator.errors import RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.workflows.cluster import NOT_REACHED, ClusterDeps, stop_node
from orchestrator.workflows.node_files import node_home, remove_serve_hooks, remove_token


@dataclass(frozen=True)
class NodeDown:
    node: str
    ok: bool
    detail: str
    unreachable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ok": self.ok, "unreachable": self.unreachable, "detail": self.detail}


@dataclass(frozen=True)
class DownResult:
    cluster: str
    nodes: list[NodeDown]
    seconds: float = 0.0
    recorded_down: bool = False  # the state now says "down" (only when every node confirmed)
    was_up: bool = False  # the state said "up" before this `down`

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "ok": self.ok, "recorded_down": self.recorded_down, "was_up": self.was_up,
                "nodes": [n.to_dict() for n in self.nodes], "seconds": round(self.seconds, 2)}  # fmt: skip


def down(manifest: Manifest, deps: ClusterDeps) -> DownResult:
    """Stop this cluster's Ray and vLLM processes on every node in parallel and remove the node's
    token copy.
    A node that cannot be reached, or where a process survived or was out of reach, is reported,
    not fatal; the recorded cluster is marked down only when every node confirmed its stop (the
    local token and cluster id are kept: the next `up` reuses them). Only processes tagged with the
    cluster's id (from orch's state) or naming its temp dir are stopped. Holds the cluster's lock."""
    with cluster_lock.hold(deps.state.cluster_dir(manifest.name), manifest.name, "down"):
        return _down(manifest, deps)


def _down(manifest: Manifest, deps: ClusterDeps) -> DownResult:
    t0 = deps.clock()
    deps.progress(f"stopping Ray and vLLM on {len(manifest.nodes)} nodes")
    cluster_id = deps.state.read_cluster_id(manifest.name)
    state_token = str(deps.state.token_path(manifest.name).expanduser().absolute())

    def stop_and_forget(r: Runner) -> str:
        node = manifest.node(r.node)
        done = stop_node(r, manifest, node, cluster_id)
        home = None  # read once per node for both of orch's files there
        try:
            home = node_home(r)
            remove_serve_hooks(r, manifest, home)
        except RemoteError as exc:  # Ray is stopped: a small file of orch's left behind fails nothing
            done += f"; orch's Serve hook module left in place ({exc.message})"
        if manifest.ray.token_auth:  # the token is a secret: a home that cannot be read fails the node
            home = home if home is not None else node_home(r)
            remove_token(r, manifest, home, keep=state_token if node.transport == "local" else None)
            done += "; token removed"
        return done

    with deps.open_runners(manifest) as runners:
        outcomes = fan_out(list(runners.values()), stop_and_forget)
    nodes = []
    for o in outcomes:
        if o.ok:
            nodes.append(NodeDown(o.node, True, o.value))
        else:
            unreachable = isinstance(o.error, NOT_REACHED)
            nodes.append(NodeDown(o.node, False, o.error.message, unreachable=unreachable))
    recorded = False
    record = deps.state.get_cluster(manifest.name)
    if all(n.ok for n in nodes) and record is not None:
        deps.state.set_cluster_state(manifest.name, "down")
        recorded = True
    was_up = record is not None and record.state == "up"
    return DownResult(manifest.name, nodes, seconds=deps.clock() - t0, recorded_down=recorded, was_up=was_up)
