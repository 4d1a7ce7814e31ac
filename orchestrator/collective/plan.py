"""The collective check of `orch up`: who takes part, with which backend, sizes, timeouts, and
the argv, spec and environment of the job on each node. Pure: no I/O.

The job itself is ``orchestrator/remote/node_programs/collective_job.py`` (its source is sent to the nodes).
Backend: NCCL on GPU clusters (the backend vLLM's tensor- and pipeline-parallel groups use
there), Gloo on CPU clusters. Participants: every node with GPUs on a GPU cluster, every node
on a CPU cluster; rank 0, the hub every worker is paired with, is the head when it takes part.
Environment: ``ray_nodes.network_env`` (the NIC pinning, VLLM_HOST_IP, the manifest's env and
ORCH_CLUSTER, exactly what Ray and vLLM get), plus NCCL_DEBUG=INFO so the transport NCCL picks
is in its log.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.ray_nodes import network_env, node_address, node_gpus
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.remote.node_programs import python_argv

# Every wait of the job (forming a group, one all-reduce) gives up after this many seconds. A
# node that cannot reach its peers is named after about this long once all have joined.
TIMEOUT_S = 20
# Joining the rendezvous waits longer: each node's job starts Python and torch at that node's own
# pace, and on a busy node that alone took over 20 s (the 3-host bed beside a starting vLLM engine:
# a worker reported "could not join the rendezvous" although its link was fine). A node that
# cannot reach the head's store at all is named after this long.
JOIN_TIMEOUT_S = 60
# The job writes its report and exits at this point whatever it is doing; orch stops waiting
# for a node (and the node's `timeout` kills the job) RUNNER_GRACE_S later. The all-to-all
# between every pair (the mesh stage) may take one TIMEOUT_S more.
DEADLINE_S = JOIN_TIMEOUT_S + TIMEOUT_S + 15
MESH_DEADLINE_S = DEADLINE_S + TIMEOUT_S
RUNNER_GRACE_S = 30
JOB_MARK = "orch-collective"  # in every job's argv: `ps` shows what it is

# Message sizes (bytes) and timed iterations: a latency size, a middle one, a bandwidth size.
# NCCL over RDMA needs tens of MB to approach the link (nccl-tests#232: 16 MB 39.9 GB/s, 32 MB
# 41.3 GB/s of ~48 on 400G); Gloo on CPUs gets there sooner and costs more per byte.
SIZES: dict[str, tuple[tuple[int, int], ...]] = {
    "nccl": ((8 << 10, 50), (1 << 20, 20), (64 << 20, 10)),
    "gloo": ((8 << 10, 20), (1 << 20, 10), (16 << 20, 5)),
}

# Seconds one size of one group may take (its timed calls, after a warm-up and a probe call): a slow
# link is timed over fewer calls instead of running into the job's deadline (seen on the test bed
# with a pair shaped to 8 MB/s: 16 MiB x 7 calls per group did not fit in 75 s).
SIZE_BUDGET_S = 2.0

@dataclass(frozen=True)
class CollectivePlan:
    backend: str  # "nccl" | "gloo"
    ranks: tuple[str, ...]  # node names; rank i is ranks[i]; ranks[0] is the hub
    store_host: str  # the hub's address (the one Ray's head binds)
    interfaces: Mapping[str, str | None]  # node -> manifest interface
    addresses: Mapping[str, str]  # node -> the address its backend binds (for naming nodes in errors)
    alltoall: bool = True  # every pair of nodes in its own group, and an all-to-all over all of them

    @property
    def deadline_s(self) -> int:
        return MESH_DEADLINE_S if self.alltoall else DEADLINE_S

    @property
    def hub(self) -> str:
        return self.ranks[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.ranks[1:]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "ranks": list(self.ranks), "store_host": self.store_host,
                "interfaces": dict(self.interfaces), "alltoall": self.alltoall}  # fmt: skip


def plan_check(manifest: Manifest, facts: Mapping[str, Any], alltoall: bool = True) -> CollectivePlan | str:
    """The check to run, or why there is none (a string: fewer than two nodes take part).
    ``alltoall``: also the all-to-all between every pair of nodes (docs/preflight.md: what it costs)."""
    good = {n: f for n, f in facts.items() if isinstance(f, NodeFacts)}
    backend = "gloo" if manifest.accelerator == "cpu" else "nccl"
    nodes = [manifest.head] + list(manifest.workers)
    if backend == "nccl":
        nodes = [n for n in nodes if node_gpus(manifest, n, good.get(n.name)) > 0]
    if len(nodes) < 2:
        what = "node" if backend == "gloo" else "node with GPUs"
        return f"no collective check: fewer than two nodes take part (one {what}; nothing crosses the network)"
    return CollectivePlan(
        backend=backend,
        ranks=tuple(n.name for n in nodes),
        store_host=node_address(nodes[0], good.get(nodes[0].name)),
        interfaces={n.name: n.interface for n in nodes},
        addresses={n.name: node_address(n, good.get(n.name)) for n in nodes},
        alltoall=alltoall,
    )


def job_spec(plan: CollectivePlan, rank: int, port: int) -> dict[str, Any]:
    sizes = SIZES[plan.backend]
    return {
        "rank": rank,
        "world": len(plan.ranks),
        "backend": plan.backend,
        "store_host": plan.store_host,
        "store_port": port,
        "timeout_s": TIMEOUT_S,
        "join_timeout_s": JOIN_TIMEOUT_S,
        "size_budget_s": SIZE_BUDGET_S,
        "deadline_s": plan.deadline_s,
        "alltoall": plan.alltoall,
        "sizes": [s for s, _ in sizes],
        "iters": [i for _, i in sizes],
    }


def job_argv(python: str, spec: Mapping[str, Any]) -> list[str]:
    """The job (``remote/node_programs/collective_job.py``) as ``python -c SOURCE orch-collective SPEC``."""
    return python_argv(python, "collective_job", JOB_MARK, json.dumps(dict(spec), separators=(",", ":")))


def job_env(manifest: Manifest, node_name: str, facts: NodeFacts | None, backend: str) -> dict[str, str]:
    """``network_env`` plus NCCL's INFO log of its network choices (the manifest cannot turn it
    off for the check: the transport is read from it)."""
    env = network_env(manifest, manifest.node(node_name), facts)
    if backend == "nccl":
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET,ENV"
    return env


def free_port_argv(python: str) -> list[str]:
    """A TCP port free on the hub right now (the kernel's pick), for the job's rendezvous."""
    return python_argv(python, "free_port")


def parse_free_port(text: str) -> int:
    """The port printed by ``free_port_argv``; ValueError when there is none."""
    value = int(text.strip().splitlines()[-1])
    if not 0 < value < 65536:
        raise ValueError(f"not a TCP port: {value}")
    return value
