"""Preflight checks of GPUs: tool present, count, kind, memory, driver/CUDA, MIG, NVLink. Pure.

Skipped on CPU clusters (``accelerator: cpu``). See ``orchestrator.preflight.checks`` for the
conventions (facts map, head as the reference for comparisons).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.plan.gpu_names import gpu_type_matches
from orchestrator.preflight.compare import Facts, differing, probed
from orchestrator.preflight.findings import (
    CUDA_MISMATCH,
    DRIVER_MISMATCH,
    FAIL,
    GPU_COUNT_MISMATCH,
    GPU_MEMORY_MISMATCH,
    GPU_MEMORY_TOLERANCE,
    GPU_NOT_FOUND,
    GPU_TYPE_MEMORY_TOLERANCE,
    GPU_TYPE_MISMATCH,
    MIG_ENABLED,
    NO_NVLINK,
    WARN,
    Finding,
    finding,
)


def _gpu_nodes(manifest: Manifest, facts: Facts) -> list[tuple[Any, NodeFacts]]:
    if manifest.accelerator != "gpu":
        return []
    return [(n, f) for n, f in probed(manifest, facts) if f.nvidia_smi]


def check_gpu_tool(manifest: Manifest, facts: Facts) -> list[Finding]:
    if manifest.accelerator != "gpu":
        return []
    out = []
    for node, f in probed(manifest, facts):
        if f.nvidia_smi is False:
            why = f.errors.get("gpus", "nvidia-smi did not run")
            out.append(
                finding(
                    FAIL, GPU_NOT_FOUND, node.name,
                    f"{node.name}: no usable nvidia-smi ({why}); the manifest expects {node.gpus} GPU(s)",
                    "install the NVIDIA driver (it ships nvidia-smi) and check `nvidia-smi` on the node, "
                    "or set `accelerator: cpu` for a CPU cluster",
                )
            )
    return out


def check_gpu_count(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in _gpu_nodes(manifest, facts):
        if "gpus" in f.errors:
            continue  # output unreadable: PROBE_FAILED says so
        found = len(f.gpus)
        if found == node.gpus:
            continue
        names = Counter(g.name for g in f.gpus)
        listing = ", ".join(f"{c}x {n}" for n, c in names.items()) or "none"
        sev = FAIL if found < node.gpus else WARN
        out.append(
            finding(
                sev, GPU_COUNT_MISMATCH, node.name,
                f"{node.name}: the manifest says {node.gpus} GPU(s), nvidia-smi lists {found} ({listing})",
                f"set `gpus: {found}` for {node.name} in the manifest, or find out why GPUs are missing "
                "(`nvidia-smi -L`, `dmesg | grep -i nvrm`, CUDA_VISIBLE_DEVICES)",
            )
        )
    return out


def check_gpu_type(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in _gpu_nodes(manifest, facts):
        if not f.gpus:
            continue
        kinds = Counter(g.name for g in f.gpus)
        if len(kinds) > 1:
            listing = ", ".join(f"{c}x {n}" for n, c in kinds.items())
            out.append(
                finding(
                    FAIL, GPU_TYPE_MISMATCH, node.name,
                    f"{node.name}: GPUs of different kinds in one node ({listing})",
                    "use nodes with one GPU kind, or restrict the node to one kind with CUDA_VISIBLE_DEVICES in its env",
                )
            )
            continue
        if node.gpu_type and not all(gpu_type_matches(node.gpu_type, g.name, g.memory_total_mib, GPU_TYPE_MEMORY_TOLERANCE) for g in f.gpus):
            g = f.gpus[0]
            mem = f", {g.memory_total_mib} MiB" if g.memory_total_mib else ""
            out.append(
                finding(
                    FAIL, GPU_TYPE_MISMATCH, node.name,
                    f"{node.name}: the manifest says gpu_type {node.gpu_type}, nvidia-smi reports {g.name}{mem}",
                    f"set gpu_type for {node.name} to what the node has (the planner sizes memory from it)",
                )
            )
    return out


def check_gpu_memory(manifest: Manifest, facts: Facts) -> list[Finding]:
    per_node = {}
    for node, f in _gpu_nodes(manifest, facts):
        mems = [g.memory_total_mib for g in f.gpus if g.memory_total_mib]
        if mems:
            per_node[node.name] = (min(mems), max(mems))
    out = []
    for name, (lo, hi) in per_node.items():
        if hi > lo * (1 + GPU_MEMORY_TOLERANCE):
            out.append(
                finding(
                    FAIL, GPU_MEMORY_MISMATCH, name,
                    f"{name}: its GPUs have between {lo} and {hi} MiB of memory",
                    "one GPU kind per node: the planner sizes every GPU like the smallest and the largest ones run out of balance",
                )
            )
    if len(per_node) > 1:
        top = max(hi for _, hi in per_node.values())
        biggest = [n for n, (_, hi) in per_node.items() if hi == top]
        for name, (lo, _) in per_node.items():
            if top > lo * (1 + GPU_MEMORY_TOLERANCE):
                out.append(
                    finding(
                        FAIL, GPU_MEMORY_MISMATCH, name,
                        f"{name}: GPUs have {lo} MiB, {', '.join(biggest)} {top} MiB",
                        "use GPUs of one memory size across the cluster; otherwise pipeline stages on the smaller "
                        "GPUs run out of memory first (size the plan to the smallest)",
                    )
                )
    return out


def check_driver(manifest: Manifest, facts: Facts) -> list[Finding]:
    values = {n.name: f.driver_version for n, f in _gpu_nodes(manifest, facts)}
    return [
        finding(
            WARN, DRIVER_MISMATCH, n,
            f"{n}: NVIDIA driver {v}, {label} has {ref}",
            f"install driver {ref} on {n} (pin one driver branch on every node)",
        )
        for n, v, ref, label in differing(manifest, values)
    ]


def check_cuda(manifest: Manifest, facts: Facts) -> list[Finding]:
    values = {n.name: f.cuda_version for n, f in _gpu_nodes(manifest, facts)}
    out = []
    for n, v, ref, label in differing(manifest, values):
        major_differs = v.split(".")[0] != str(ref).split(".")[0]
        out.append(
            finding(
                FAIL if major_differs else WARN, CUDA_MISMATCH, n,
                f"{n}: driver supports CUDA {v}, {label} CUDA {ref}",
                "use the same driver (and so the same CUDA version) on every node; torch built for a newer "
                "CUDA major does not run on an older driver",
            )
        )
    return out


def check_mig(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in _gpu_nodes(manifest, facts):
        on = [str(g.index) for g in f.gpus if g.mig_enabled]
        if on:
            out.append(
                finding(
                    FAIL, MIG_ENABLED, node.name,
                    f"{node.name}: MIG is enabled on GPU {', '.join(on)}; Ray counts whole GPUs and vLLM "
                    "tensor parallelism cannot span MIG slices",
                    f"disable MIG on {node.name}: `nvidia-smi -i {on[0]} -mig 0` (then reset the GPU or reboot)",
                )
            )
    return out


def check_nvlink(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in _gpu_nodes(manifest, facts):
        if f.topology is None or f.topology.nvlink is not False:
            continue
        pairs = f.topology.non_nvlink_pairs()
        kinds = sorted({k for _, _, k in pairs})
        example = ", ".join(f"{a}-{b} {k}" for a, b, k in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
        out.append(
            finding(
                WARN, NO_NVLINK, node.name,
                f"{node.name}: {len(pairs)} GPU pair(s) are not joined by NVLink/NVSwitch "
                f"({'/'.join(kinds)}: {example}); tensor parallelism across them goes over PCIe",
                "keep tensor-parallel groups inside NVLink islands and prefer pipeline parallelism over "
                "the slower links (or more replicas with a smaller tp); pass --force to go ahead",
            )
        )
    return out
