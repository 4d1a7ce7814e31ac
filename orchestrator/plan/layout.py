"""Layouts: one (TP, PP) evaluated, how many replicas a cluster holds of it, and which GPUs it
leaves idle. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.capacity import StageCapacity
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape


@dataclass(frozen=True)
class Candidate:
    """One (tp, pp) evaluated: its stages and whether vLLM would serve with it."""

    tp: int
    pp: int
    stages: tuple[StageCapacity, ...]
    max_model_len: int
    min_concurrency: float

    @property
    def tightest(self) -> StageCapacity:
        return min(self.stages, key=lambda s: (s.kv_tokens, s.kv_bytes))

    @property
    def kv_tokens(self) -> int:
        return self.tightest.kv_tokens

    @property
    def weights_fit(self) -> bool:
        return all(s.kv_bytes > 0 for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.weights_fit and self.kv_tokens >= self.min_concurrency * self.max_model_len

    def summary(self) -> str:
        t = self.tightest
        where = f" on stage {t.index}" if self.pp > 1 else ""
        if not self.weights_fit:
            return (
                f"TP={self.tp} PP={self.pp}: {t.weights_bytes / GIB:.1f} GiB of weights + {t.reserve_bytes / GIB:.1f} GiB "
                f"reserve per GPU{where} exceed the usable memory by {-t.kv_bytes / GIB:.1f} GiB"
            )
        return (
            f"TP={self.tp} PP={self.pp}: {t.weights_bytes / GIB:.1f} GiB weights + {t.reserve_bytes / GIB:.1f} GiB reserve "
            f"leave {t.kv_bytes / GIB:.1f} GiB KV cache per GPU{where} = {t.kv_tokens:,} tokens "
            f"({t.kv_tokens / self.max_model_len:.2f} x max_model_len {self.max_model_len:,})"
        )



def replicas_for(shape: ClusterShape, tp: int, pp: int) -> int:
    """Replicas the cluster holds: whole groups per node when a replica fits a node, otherwise
    groups of whole nodes (TP inside a node, PP across nodes)."""
    group = tp * pp
    if shape.is_cpu:
        return shape.nodes
    if group <= shape.gpus_per_node:
        return shape.nodes * (shape.gpus_per_node // group)
    return shape.total_gpus // group


def idle_gpus(shape: ClusterShape, tp: int, pp: int) -> str | None:
    """Why GPUs stay unused by the replicas of a (tp, pp) layout, or None when every GPU serves."""
    group = tp * pp
    used = replicas_for(shape, tp, pp) * group
    if shape.is_cpu or used >= shape.total_gpus:
        return None
    if group <= shape.gpus_per_node:
        per_node = shape.gpus_per_node - (shape.gpus_per_node // group) * group
        return (
            f"{per_node} GPU(s) per node stay idle: a replica takes {group} GPU(s) (TP={tp} x PP={pp}) "
            f"and {shape.gpus_per_node} is not a multiple of {group}"
        )
    return (
        f"{shape.total_gpus - used} of {shape.total_gpus} GPU(s) stay idle: a replica spans {group} GPU(s) "
        f"(TP={tp} x PP={pp}) and the cluster holds {used // group} such replica(s)"
    )


def fill_nodes(shape: ClusterShape, fitting: list[Candidate], first: Candidate, reasons: list[str]) -> Candidate:
    """Among fitting pipeline layouts, prefer one that leaves no GPU of a node idle when it serves
    at least as many replicas as the smallest fitting one (PP=4 over PP=3 on 8 GPUs: both give 2
    replicas, and PP=4 has more KV cache per replica)."""
    if idle_gpus(shape, first.tp, first.pp) is None:
        return first
    best = replicas_for(shape, first.tp, first.pp)
    for cand in fitting:
        bigger = cand.tp * cand.pp > first.tp * first.pp
        if bigger and idle_gpus(shape, cand.tp, cand.pp) is None and replicas_for(shape, cand.tp, cand.pp) >= best:
            reasons.append(
                f"TP={first.tp} PP={first.pp} would leave GPUs idle ({idle_gpus(shape, first.tp, first.pp)}); "
                f"TP={cand.tp} PP={cand.pp} uses every GPU with as many replicas ({best})"
            )
            return cand
    reasons.append(f"no layout that uses every GPU serves as many replicas as TP={first.tp} PP={first.pp}")
    return first
