"""Where a replica's engine workers run: vLLM's Ray executor ranks, read from Ray's state API. Pure.

On a GPU cluster vLLM runs each tensor/pipeline-parallel rank of a replica in its own Ray actor
(``RayWorkerProc`` in vLLM 0.32's executor, ``RayWorkerWrapper`` in older ones), named
``vllm_Worker_<id>_TP<rank>`` (``_PP<stage>_TP<rank>`` with pipeline stages). Ray Serve LLM
creates one placement group per replica and puts the replica's own actor in it; the worker
actors are scheduled into the same placement group. So the workers of a replica are the ALIVE
worker actors sharing its actor's ``placement_group_id``, as ``GET /api/v0/actors?detail=true``
reports them (node id and pid each). `orch status` shows them per replica with the manifest node
each one runs on (a replica spanning nodes has workers on several).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.node_state import DashboardFormatError

WORKER_CLASSES = ("RayWorkerProc", "RayWorkerWrapper")
ACTORS_PATH = "/api/v0/actors"
ACTORS_PARAMS = {"detail": "true", "limit": "10000"}
_RANK = re.compile(r"_((?:PP\d+_)?TP\d+)$")


@dataclass(frozen=True)
class ActorRecord:
    """One Ray actor as the state API reports it (the fields orch reads)."""

    actor_id: str
    class_name: str
    name: str
    state: str
    node_id: str | None
    pid: int | None
    placement_group_id: str | None


@dataclass(frozen=True)
class EngineWorker:
    """One rank of a replica's engine: its actor name, rank label (``TP1``), where it runs."""

    name: str
    rank: str | None
    node_id: str | None
    pid: int | None
    state: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "node_id": self.node_id, "pid": self.pid, "state": self.state}


def parse_actors(payload: Mapping[str, Any]) -> list[ActorRecord]:
    """``GET /api/v0/actors?detail=true`` -> one ActorRecord per actor (dead ones too)."""
    if not isinstance(payload, Mapping) or not payload.get("result", False) or not isinstance(payload.get("data"), Mapping):
        raise DashboardFormatError(f"{ACTORS_PATH}: the dashboard answered without data")
    result = payload["data"].get("result")
    rows = result.get("result") if isinstance(result, Mapping) else None
    if not isinstance(rows, list):
        raise DashboardFormatError(f"{ACTORS_PATH}: no actor list in the answer")
    out = []
    for row in rows:
        if not isinstance(row, Mapping) or "actor_id" not in row:
            raise DashboardFormatError(f"{ACTORS_PATH}: an actor record without actor_id")
        pid = row.get("pid")
        out.append(
            ActorRecord(
                actor_id=str(row["actor_id"]),
                class_name=str(row.get("class_name") or ""),
                name=str(row.get("name") or ""),
                state=str(row.get("state") or "UNKNOWN"),
                node_id=row.get("node_id") or None,
                pid=int(pid) if isinstance(pid, int) and pid > 0 else None,
                placement_group_id=row.get("placement_group_id") or None,
            )
        )
    return out


def rank_of(actor_name: str) -> str | None:
    m = _RANK.search(actor_name)
    return m.group(1) if m else None


def _rank_key(worker: EngineWorker) -> tuple[int, int, str]:
    nums = [int(n) for n in re.findall(r"\d+", worker.rank or "")]
    pp, tp = (nums[0], nums[1]) if len(nums) == 2 else (0, nums[0] if nums else 1 << 30)
    return pp, tp, worker.name


def engine_workers(replica_actor_name: str | None, actors: Sequence[ActorRecord]) -> list[EngineWorker]:
    """The engine workers of the ALIVE replica whose actor is named ``replica_actor_name``, in rank
    order, in any state (a worker whose node died is DEAD while the replica actor may still look
    alive); empty when the replica has none (CPU layout: vLLM's mp executor has no actors)."""
    if not replica_actor_name:
        return []
    replica = next((a for a in actors if a.name == replica_actor_name and a.state == "ALIVE"), None)
    if replica is None or replica.placement_group_id is None:
        return []
    workers = [
        EngineWorker(a.name, rank_of(a.name), a.node_id, a.pid, a.state)
        for a in actors
        if a.class_name in WORKER_CLASSES and a.placement_group_id == replica.placement_group_id
    ]
    return sorted(workers, key=_rank_key)
