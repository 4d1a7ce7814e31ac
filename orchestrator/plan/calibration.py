"""What the planner predicts for one engine configuration, what the engine measured, and the
reserve the measurement implies. Pure.

A calibration record is keyed by everything that changes vLLM's memory profile: the model's
fingerprint, the GPU type, the vLLM version, TP, PP and the engine flags that size memory
(``PLANNED_ENGINE_ARGS``). With a matching record, `orch plan --cluster` replaces the modelled
reserve with the one the engine measured on that cluster:

    reserve = total * gpu_memory_utilization - weights - available KV cache memory

which makes the plan exact for that configuration after one rollout.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.plan.capacity import PlanOptions, stage_capacities, utilization
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape

CALIBRATION_FLAGS = ("max_model_len", "gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "block_size")


@dataclass(frozen=True)
class EngineFigures:
    """Per-GPU figures as vLLM logs them: weights ("Model loading took"), available KV-cache
    memory, KV tokens ("GPU KV cache size", the smallest worker's) and the CUDA graph memory."""

    weights_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    cuda_graph_gib: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


def predict_engine(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int, kv_stage: int | None = None) -> EngineFigures:
    """What orch predicts the engine will log: the heaviest stage's weights, the KV memory of
    ``kv_stage`` (default: the tightest stage, whose block count the engine takes) and tokens."""
    stages = stage_capacities(spec, shape, options, tp=tp, pp=pp)
    tight = min(stages, key=lambda s: (s.kv_tokens, s.kv_bytes))
    kv = stages[kv_stage] if kv_stage is not None else tight
    return EngineFigures(
        weights_gib=max(s.weights_bytes for s in stages) / GIB,
        kv_gib=kv.kv_bytes / GIB,
        kv_tokens=tight.kv_tokens,
    )


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured."""
    return (predicted - measured) / measured


def measured_reserve_gib(spec: ModelSpec, options: PlanOptions, total_gib: float, measured: EngineFigures) -> float | None:
    """The reserve per GPU the engine's own figures imply, or None when it did not log both."""
    if measured.weights_gib is None or measured.kv_gib is None:
        return None
    return total_gib * utilization(spec, options) - measured.weights_gib - measured.kv_gib


def model_fingerprint(spec: ModelSpec) -> str:
    """A hash of the numbers that size the model (not its name or path)."""
    numbers = {k: v for k, v in asdict(spec).items() if k not in ("name", "source")}
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()[:16]


def calibration_key(spec: ModelSpec, gpu_type: str, vllm_version: str, tp: int, pp: int, engine_kwargs: dict[str, Any]) -> str:
    """The key a measurement is stored and looked up under."""
    flags = {k: engine_kwargs.get(k) for k in CALIBRATION_FLAGS}
    blob = json.dumps({"model": model_fingerprint(spec), "gpu": gpu_type, "vllm": vllm_version, "tp": tp, "pp": pp, "flags": flags}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
