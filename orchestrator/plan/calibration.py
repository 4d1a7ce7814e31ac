"""What the planner predicts for one engine configuration, what the engine measured, and the
reserve the measurement implies. Pure.

A calibration record is keyed by everything that changes vLLM's memory profile: the model's
fingerprint, the GPU type, the vLLM version, TP, PP and the engine flags that size memory
(``PLANNED_ENGINE_ARGS``). With a matching record, `orch plan --cluster` replaces the modelled
reserve with the one the engine measured on that cluster:

    reserve = total * gpu_memory_utilization - weights - available KV cache memory

which makes the plan exact for that configuration after one rollout.

The device in the key is the one the engine really ran on, read from its log
(``engine_platform``), not the one the plan was made for: a CPU engine standing in for a GPU (the
test beds) is keyed ``cpu`` and never calibrates a GPU type. A record whose log did not say which
platform ran is kept (status shows it) but never reused (``why_not_reusable``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.plan.capacity import PlanOptions, stage_capacities, utilization
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape

# vLLM's platform names (vllm/platforms/__init__.py) that are a GPU; "gpu" is a GPU the log shows
# without naming CUDA or ROCm (both run vLLM's gpu_worker / gpu_model_runner).
GPU_PLATFORMS = frozenset({"cuda", "rocm", "gpu"})

LAYOUT_FLAGS = ("data_parallel_size", "enable_expert_parallel")
CALIBRATION_FLAGS = ("max_model_len", "gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "block_size")


@dataclass(frozen=True)
class EngineFigures:
    """Per-GPU figures as vLLM logs them: weights ("Model loading took"), available KV-cache
    memory, KV tokens ("GPU KV cache size", the smallest worker's) and the CUDA graph memory."""

    weights_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    cuda_graph_gib: float | None = None
    platform: str | None = None  # vLLM's platform the engine ran on (engine_platform); None: not logged

    def to_json(self) -> dict:
        return asdict(self)


def predict_engine(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, *, tp: int, pp: int, kv_stage: int | None = None,
                   dp: int = 1, expert_parallel: bool = False) -> EngineFigures:  # fmt: skip
    """What orch predicts one engine (one DP rank) will log: the heaviest stage's weights, the KV
    memory of ``kv_stage`` (default: the tightest stage, whose block count the engine takes) and tokens."""
    stages = stage_capacities(spec, shape, options, tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel)
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
    numbers = {k: v for k, v in asdict(spec).items() if k not in ("name", "source", "quantization", "tower_params", "towers")}
    if spec.tower_params:  # fields added later count only when set, so older fingerprints stay valid
        numbers["tower_params"] = spec.tower_params
    if spec.quantization is not None:  # what it is, not where it was read (None keeps older fingerprints)
        numbers["quantization"] = {k: v for k, v in asdict(spec.quantization).items() if k != "source"}
    return hashlib.sha256(json.dumps(numbers, sort_keys=True).encode()).hexdigest()[:16]


# ---- what the engine logged (pure parsing of its start-up lines) ----

_NUM = r"(-?\d+(?:\.\d+)?)"
_WEIGHTS = (
    re.compile(r"Model loading took " + _NUM + r" ?GiB"),  # V1
    re.compile(r"Loading model weights took " + _NUM + r" ?GB"),  # V0 (GiB, printed as GB)
    re.compile(r"model weights take\s+" + _NUM + r" ?GiB"),  # V0 memory profile lines
)
_KV_GIB = (
    re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB"),
    re.compile(r"the rest of the memory reserved for KV Cache is " + _NUM + r" ?GiB"),
    re.compile(r"available_kv_cache_memory\s+" + _NUM + r" ?GiB"),
    re.compile(r"Current kv cache memory in use is " + _NUM + r" ?GiB"),
)
_KV_TOKENS = re.compile(r"KV cache size: (\d[\d,]*) tokens")
_GRAPHS = (
    re.compile(r"Estimated CUDA graph memory: " + _NUM + r" ?GiB"),
    re.compile(_NUM + r" GiB for CUDAGraph memory"),
    re.compile(r"Graph capturing finished in \d+ secs?, took " + _NUM + r" ?GiB"),
)


# Which platform the engine ran on. vLLM names it in "Automatically detected platform cpu."
# (vllm/platforms/__init__.py: INFO in some releases, DEBUG in 0.32). Otherwise the lines tell:
# 0.32 names the KV pool after the device ("CPU KV cache size: 524,288 tokens",
# v1/core/kv_cache_utils.py _kv_cache_device_name) and the CPU worker's files are cpu_worker.py /
# cpu_model_runner.py; a GPU engine logs from gpu_worker.py / gpu_model_runner.py and its CUDA
# graph and V0 total_gpu_memory lines. "GPU KV cache size" alone is weak: releases before the
# device-named line printed "GPU" on every platform, so any CPU sign wins over it.
_PLATFORM_NAMED = re.compile(r"Automatically detected platform (\w+)\.")
_CPU_SIGNS = (re.compile(r"\bCPU KV cache size:"), re.compile(r"\[cpu_(?:worker|model_runner)\.py:\d+\]"))
_GPU_SIGNS = (re.compile(r"\[gpu_(?:worker|model_runner)\.py:\d+\]"), re.compile(r"\btotal_gpu_memory\b"), *_GRAPHS)
_GPU_WEAK = re.compile(r"\bGPU KV cache size:")


def engine_platform(lines: Iterable[str]) -> str | None:
    """The vLLM platform the engine ran on ("cpu", "cuda", "rocm", ..., "gpu" for a GPU the log
    does not name), or None when its lines do not tell."""
    named = cpu = gpu = weak = False
    name = None
    for line in lines:
        if m := _PLATFORM_NAMED.search(line):
            named, name = True, m.group(1).lower()
        cpu = cpu or any(p.search(line) for p in _CPU_SIGNS)
        gpu = gpu or any(p.search(line) for p in _GPU_SIGNS)
        weak = weak or bool(_GPU_WEAK.search(line))
    if named:
        return name
    if cpu:
        return "cpu"
    return "gpu" if gpu or weak else None


def parse_engine_figures(lines: Iterable[str]) -> EngineFigures:
    """The figures of the engine's start-up lines (every worker's): the heaviest weights, the
    smallest available KV memory and token count (the engine takes the tightest worker's), and
    the CUDA graph memory. Fields the log does not carry stay None."""
    lines = list(lines)
    weights: list[float] = []
    kv: list[float] = []
    tokens: list[int] = []
    graphs: list[float] = []
    for line in lines:
        for pattern in _WEIGHTS:
            if m := pattern.search(line):
                weights.append(float(m.group(1)))
        for pattern in _KV_GIB:
            if m := pattern.search(line):
                kv.append(float(m.group(1)))
        if m := _KV_TOKENS.search(line):
            tokens.append(int(m.group(1).replace(",", "")))
        for pattern in _GRAPHS:
            if m := pattern.search(line):
                graphs.append(float(m.group(1)))
    return EngineFigures(
        weights_gib=max(weights) if weights else None,
        kv_gib=min(kv) if kv else None,
        kv_tokens=min(tokens) if tokens else None,
        cuda_graph_gib=max(graphs) if graphs else None,
        platform=engine_platform(lines),
    )


def engine_device(planned_gpu_type: str, platform: str | None) -> str:
    """The device a measurement is a measurement of: the planned GPU type when the engine ran on a
    GPU (or did not say), else the platform it ran on ("cpu")."""
    if platform is None or platform in GPU_PLATFORMS:
        return planned_gpu_type
    return platform


def calibration_record(plan: Mapping[str, Any], measured: EngineFigures) -> dict | None:
    """What to keep about one served revision: its key, what the plan predicted, what the engine
    measured, the errors and the reserve the measurement implies. None without a usable plan."""
    needed = ("model_fingerprint", "gpu_type", "vllm_version", "tp", "pp", "engine_kwargs")
    if any(plan.get(k) is None for k in needed):
        return None
    planned = plan["gpu_type"]
    device = engine_device(planned, measured.platform)
    parts = (plan["model_fingerprint"], plan["vllm_version"], plan["tp"], plan["pp"], plan["engine_kwargs"])
    predicted = EngineFigures(plan.get("weights_gib_per_gpu"), plan.get("kv_cache_gib_per_gpu"), plan.get("kv_cache_tokens"))
    errors = {}
    reserve = None
    mismatch = None
    if device != planned:
        # e.g. vLLM's CPU backend answering to Ray's GPU key on a test bed planned as H100: its
        # figures measure the CPU, so they are neither compared with the plan nor a GPU reserve
        mismatch = f"the engine ran on vLLM's {measured.platform} platform, not on {planned}: not compared with the plan, not used by `orch plan --cluster`"
    else:
        for field in ("weights_gib", "kv_gib", "kv_tokens"):
            want, got = getattr(predicted, field), getattr(measured, field)
            if want is not None and got:
                errors[field] = round(relative_error(want, got), 4)
        total, util = plan.get("gpu_memory_gib"), plan["engine_kwargs"].get("gpu_memory_utilization")
        if total and util and measured.weights_gib is not None and measured.kv_gib is not None:
            reserve = round(total * util - measured.weights_gib - measured.kv_gib, 3)
    return {
        "key": _key(parts[0], device, *parts[1:]),
        "planned_key": _key(parts[0], planned, *parts[1:]),
        "model": plan.get("model"),
        "gpu_type": device,
        "planned_gpu_type": planned,
        "platform": measured.platform,
        "mismatch": mismatch,
        "vllm_version": plan["vllm_version"],
        "tp": plan["tp"],
        "pp": plan["pp"],
        "flags": {k: plan["engine_kwargs"].get(k) for k in CALIBRATION_FLAGS},
        "predicted": predicted.to_json(),
        "measured": measured.to_json(),
        "error": errors,
        "measured_reserve_gib": reserve,
    }


def why_not_reusable(record: Mapping[str, Any], gpu_type: str) -> str | None:
    """Why a stored record may not size a plan for ``gpu_type`` (None: it may): the engine must
    have run on that device, said which platform it was, and logged weights and KV memory."""
    platform = record.get("platform")
    if platform is None:
        return "its engine log did not say which platform vLLM ran on"
    if record.get("gpu_type") != gpu_type or engine_device(gpu_type, platform) != gpu_type:
        return f"its engine ran on vLLM's {platform} platform, not on {gpu_type}"
    if record.get("measured_reserve_gib") is None:
        return "its engine log lacked the weights or the available KV-cache memory"
    return None


def calibration_key(spec: ModelSpec, gpu_type: str, vllm_version: str, tp: int, pp: int, engine_kwargs: Mapping[str, Any]) -> str:
    """The key a measurement is stored and looked up under (the same for `orch plan` and the record)."""
    return _key(model_fingerprint(spec), gpu_type, vllm_version, tp, pp, engine_kwargs)


def _key(fingerprint: str, gpu_type: str, vllm_version: str, tp: int, pp: int, engine_kwargs: Mapping[str, Any]) -> str:
    flags = {k: engine_kwargs.get(k) for k in CALIBRATION_FLAGS}
    # A DP or expert-parallel engine sizes memory differently (experts over DP x TP, all-gathered MoE
    # activations); those keys are in the blob only when set, so the keys of TP x PP records stay as they were.
    flags.update({k: engine_kwargs[k] for k in LAYOUT_FLAGS if k in engine_kwargs})
    blob = json.dumps({"model": fingerprint, "gpu": gpu_type, "vllm": vllm_version, "tp": tp, "pp": pp, "flags": flags}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]
