"""Preflight findings: severities, thresholds, the registry of codes, and the Finding value. Pure.

A finding names its node (None for the whole cluster), says what is wrong in its message, and its
hint ends with the runbook that explains the fix (``orchestrator.runbooks``). ``fail`` stops
``orch up`` before anything starts; ``warn`` needs ``--force``; ``info`` is only shown.

Every code lives in ``CODES`` (code -> one-line title); ``tests/unit/test_runbooks.py`` checks that
each has a runbook and an entry in ``runbooks/README.md``.
"""


from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from orchestrator.runbooks import runbook

Severity = Literal["fail", "warn", "info"]
FAIL: Severity = "fail"
WARN: Severity = "warn"
INFO: Severity = "info"
_SEVERITY_ORDER = {FAIL: 0, WARN: 1, INFO: 2}

# ---- thresholds (docs/preflight.md explains each) ----
# NCCL and vLLM's shared-memory transports put buffers in /dev/shm; Docker's default of 64 MiB
# ends in "Bus error" or NCCL failures. 1 GiB is the floor; Ray also wants its object store there.
SHM_MIN_BYTES = 1 << 30
# Ray's temp dir, logs, compile caches and downloads need room next to the model store.
DISK_MIN_FREE_BYTES = 10 << 30
# Clocks further apart than this make logs and metrics of different nodes hard to line up.
CLOCK_SKEW_MAX_S = 2.0
# GPUs whose total memory differs by more than this are different SKUs.
GPU_MEMORY_TOLERANCE = 0.01
# A gpu_type's memory ("80GB") matches nvidia-smi's total within this (H100 80GB: 79.6 GiB).
GPU_TYPE_MEMORY_TOLERANCE = 0.10

# ---- codes ----
NODE_UNREACHABLE = "NODE_UNREACHABLE"
GPU_NOT_FOUND = "GPU_NOT_FOUND"
GPU_COUNT_MISMATCH = "GPU_COUNT_MISMATCH"
GPU_TYPE_MISMATCH = "GPU_TYPE_MISMATCH"
GPU_MEMORY_MISMATCH = "GPU_MEMORY_MISMATCH"
DRIVER_MISMATCH = "DRIVER_MISMATCH"
CUDA_MISMATCH = "CUDA_MISMATCH"
MIG_ENABLED = "MIG_ENABLED"
NO_NVLINK = "NO_NVLINK"
NIC_MISSING = "NIC_MISSING"
NIC_DOWN = "NIC_DOWN"
NIC_NO_ADDRESS = "NIC_NO_ADDRESS"
NIC_SUBNET_MISMATCH = "NIC_SUBNET_MISMATCH"
IB_PORT_DOWN = "IB_PORT_DOWN"
HEAD_PORT_UNREACHABLE = "HEAD_PORT_UNREACHABLE"
PYTHON_MISSING = "PYTHON_MISSING"
RAY_MISSING = "RAY_MISSING"
VLLM_MISSING = "VLLM_MISSING"
VERSION_MISMATCH = "VERSION_MISMATCH"
SHM_TOO_SMALL = "SHM_TOO_SMALL"
MODEL_PATH_MISSING = "MODEL_PATH_MISSING"
MODEL_PATH_DIFFERS = "MODEL_PATH_DIFFERS"
DISK_LOW = "DISK_LOW"
CLOCK_SKEW = "CLOCK_SKEW"
PROBE_FAILED = "PROBE_FAILED"
COLLECTIVE_INIT_FAILED = "COLLECTIVE_INIT_FAILED"
COLLECTIVE_SLOW = "COLLECTIVE_SLOW"
COLLECTIVE_SOCKET_FALLBACK = "COLLECTIVE_SOCKET_FALLBACK"
# Judged by the collective check (orchestrator.collective.verdict), not by run_checks' static checks.
COLLECTIVE_CODES = frozenset({COLLECTIVE_INIT_FAILED, COLLECTIVE_SLOW, COLLECTIVE_SOCKET_FALLBACK})

CODES: dict[str, str] = {
    NODE_UNREACHABLE: "a node could not be probed over SSH",
    GPU_NOT_FOUND: "nvidia-smi missing or not talking to the driver on a GPU node",
    GPU_COUNT_MISMATCH: "the node has a different number of GPUs than the manifest says",
    GPU_TYPE_MISMATCH: "the node's GPUs are not the gpu_type of the manifest (or are mixed)",
    GPU_MEMORY_MISMATCH: "GPU memory differs between nodes or within a node",
    DRIVER_MISMATCH: "NVIDIA driver version differs between nodes",
    CUDA_MISMATCH: "CUDA version supported by the driver differs between nodes",
    MIG_ENABLED: "MIG mode is enabled on a GPU",
    NO_NVLINK: "GPUs inside a node are not joined by NVLink/NVSwitch",
    NIC_MISSING: "the manifest's interface does not exist on the node",
    NIC_DOWN: "the manifest's interface is down",
    NIC_NO_ADDRESS: "the manifest's interface has no usable address",
    NIC_SUBNET_MISMATCH: "a worker's interface is not on the head's subnet",
    IB_PORT_DOWN: "an InfiniBand/RoCE port is not active",
    HEAD_PORT_UNREACHABLE: "a worker cannot open a TCP connection to the head's Ray port",
    PYTHON_MISSING: "the node's Python interpreter could not run",
    RAY_MISSING: "Ray is not installed for the node's Python",
    VLLM_MISSING: "vLLM is not installed for the node's Python",
    VERSION_MISMATCH: "python/ray/vllm/torch (or NCCL) versions differ between nodes",
    SHM_TOO_SMALL: "/dev/shm is smaller than NCCL, vLLM and Ray need",
    MODEL_PATH_MISSING: "the model path does not exist on a node",
    MODEL_PATH_DIFFERS: "the model files differ between nodes",
    DISK_LOW: "little free disk at the model store / Ray temp dir",
    CLOCK_SKEW: "a node's clock is off from the head's",
    PROBE_FAILED: "a probe could not run or its output could not be read",
    COLLECTIVE_INIT_FAILED: "the collective check's job could not start, rendezvous or connect between two nodes",
    COLLECTIVE_SLOW: "all-reduce or all-to-all bus bandwidth far below the link speed (or a pair far below the others)",
    COLLECTIVE_SOCKET_FALLBACK: "NCCL used TCP sockets although InfiniBand/RoCE ports are active",
}


@dataclass(frozen=True)
class Finding:
    """One problem (or note) found by preflight. ``node`` is None for cluster-wide findings."""

    severity: Severity
    code: str
    node: str | None
    message: str
    hint: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def finding(severity: Severity, code: str, node: str | None, message: str, fix: str) -> Finding:
    """A Finding whose hint is ``fix`` followed by its runbook path (always last)."""
    if code not in CODES:
        raise KeyError(f"unregistered finding code {code}")
    fix = fix.rstrip(". ")
    return Finding(severity=severity, code=code, node=node, message=message, hint=f"{fix}; see {runbook(code)}")


def failures(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == FAIL]


def warnings(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == WARN]


def blocking(findings: list[Finding], force: bool = False) -> list[Finding]:
    """What stops ``orch up``: failures always, warnings unless ``--force``."""
    return [f for f in findings if f.severity == FAIL or (f.severity == WARN and not force)]


def by_node(findings: list[Finding]) -> dict[str | None, list[Finding]]:
    """Findings grouped by node (None: cluster-wide), keeping their order."""
    out: dict[str | None, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.node, []).append(f)
    return out


def report_json(findings: list[Finding], facts: dict[str, Any], collective: dict[str, Any] | None = None) -> str:
    """``orch up --check-only --json``: facts per node, the findings and the collective check's
    figures (None when it did not run)."""
    nodes = {}
    for name, value in facts.items():
        if hasattr(value, "to_dict"):
            nodes[name] = value.to_dict()
        else:
            nodes[name] = {"node": name, "error": str(value), "kind": type(value).__name__}
    return json.dumps(
        {
            "ok": not failures(findings),
            "findings": [f.to_dict() for f in findings],
            "nodes": nodes,
            "collective": collective,
        },
        indent=2,
    )
