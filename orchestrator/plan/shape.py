"""The cluster shape the planner sizes against: GPUs per node, nodes, memory per GPU, NVLink.

Owns ``ClusterShape`` and the ways to build a shape from what orch knows:
``shape_from_manifest(manifest)`` (what cluster.yaml declares), ``shape_from_facts(manifest,
facts)`` (what nvidia-smi reported on each node) and ``shape_from_flags`` (`orch plan`'s flags).
The table of GPU types (memory per GPU as CUDA reports it, NVLink, aliases) is
``orchestrator.manifest.gpu_types``: `orch validate` checks a manifest's gpu_type with the same
rule. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.manifest.gpu_types import GIB, GPU_TYPES, GpuType, find_gpu_type, smi_memory_bytes, unknown_gpu_type
from orchestrator.manifest.model import Manifest

CPU = "cpu"


@dataclass(frozen=True)
class ClusterShape:
    """What one plan is sized against. ``gpu_memory_bytes`` is None on a CPU cluster (vLLM's CPU
    backend takes its KV cache size from VLLM_CPU_KVCACHE_SPACE, not from a device total).
    ``nvlink`` None means unknown: the GPU type's usual board decides."""

    gpus_per_node: int
    nodes: int
    gpu_memory_bytes: int | None
    gpu_type: str
    nvlink: bool | None = None
    notes: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def is_cpu(self) -> bool:
        return self.gpu_type == CPU

    @property
    def has_nvlink(self) -> bool:
        if self.nvlink is not None:
            return self.nvlink
        known = GPU_TYPES.get(self.gpu_type)
        return known.nvlink if known else False

    @property
    def gpu_memory_gib(self) -> float | None:
        return None if self.gpu_memory_bytes is None else self.gpu_memory_bytes / GIB

    def interconnect_assumption(self) -> str | None:
        """What the plan assumes about the link between a node's GPUs when nobody said
        (``nvlink`` None: no --nvlink/--no-nvlink and no probed topology); None when known."""
        if self.is_cpu or self.nvlink is not None or self.gpus_per_node < 2:
            return None
        known = GPU_TYPES.get(self.gpu_type)
        if known is None:
            return (
                f"the interconnect of {self.gpu_type} is unknown: assumed PCIe without NVLink, so tensor parallelism "
                "is avoided inside a node; pass --nvlink if the GPUs share NVLink"
            )
        if known.nvlink:
            return f"interconnect not probed: assumed NVLink, as on the usual {known.name} SXM boards; pass --no-nvlink for PCIe cards"
        return f"interconnect not probed: assumed PCIe without NVLink, as usual for {known.name}; pass --nvlink if the GPUs share NVLink"

    def describe(self) -> str:
        if self.is_cpu:
            return f"{self.nodes} CPU node{'s' if self.nodes != 1 else ''}"
        link = "NVLink" if self.has_nvlink else "no NVLink"
        return f"{self.nodes} x {self.gpus_per_node} {self.gpu_type} ({self.gpu_memory_gib:.2f} GiB each, {link})"


def gpu_type(name: str) -> GpuType:
    """A known GPU type by name or alias (case-insensitive); PlanError with the closest name.
    The same rule `orch validate` applies to a manifest's gpu_type (manifest/gpu_types.py)."""
    known = find_gpu_type(name)
    if known is None:
        raise PlanError(unknown_gpu_type(name, also=(CPU,)), hint="or give the memory per GPU yourself with --gpu-memory-gib")
    return known


def make_shape(
    *,
    gpu_type_name: str | None,
    gpus_per_node: int,
    nodes: int,
    gpu_memory_gib: float | None = None,
    nvlink: bool | None = None,
    notes: tuple[str, ...] = (),
) -> ClusterShape:
    """A shape from flags: a known GPU type and/or an explicit memory size."""
    if nodes < 1:
        raise PlanError(f"nodes must be at least 1, got {nodes}")
    if gpu_type_name and gpu_type_name.lower() == CPU:
        return ClusterShape(1, nodes, None, CPU, False, notes)
    if gpus_per_node < 1:
        raise PlanError(f"gpus per node must be at least 1, got {gpus_per_node}")
    if gpu_memory_gib is not None:
        if gpu_memory_gib <= 0:
            raise PlanError(f"GPU memory must be positive, got {gpu_memory_gib} GiB")
        name = gpu_type(gpu_type_name).name if gpu_type_name else f"{gpu_memory_gib:g}GiB-GPU"
        return ClusterShape(gpus_per_node, nodes, int(gpu_memory_gib * GIB), name, nvlink, notes)
    if not gpu_type_name:
        raise PlanError("no GPU type or memory size given", hint="pass --gpu-type (e.g. H100-80GB) or --gpu-memory-gib, or --cluster cluster.yaml")
    known = gpu_type(gpu_type_name)
    return ClusterShape(gpus_per_node, nodes, known.memory_bytes, known.name, nvlink, notes)


def shape_from_manifest(manifest: Manifest) -> ClusterShape:
    """The shape cluster.yaml declares. Mixed nodes: the smallest GPU count and memory decide
    (a replica must fit on any of them), and a note says so."""
    nodes = list(manifest.nodes)
    if manifest.accelerator == CPU:
        return ClusterShape(1, len(nodes), None, CPU, False)
    notes: list[str] = []
    counts = {n.name: n.gpus for n in nodes}
    missing = [n.name for n in nodes if not n.gpu_type]
    if missing:
        raise PlanError(
            f"node(s) {', '.join(missing)} in the manifest have no gpu_type, so the memory per GPU is unknown",
            hint="set gpu_type (e.g. H100-80GB) on every node, or pass --gpu-type / --gpu-memory-gib",
        )
    types = {n.name: gpu_type(n.gpu_type) for n in nodes}
    smallest = min(types.values(), key=lambda t: t.memory_bytes)
    if len({t.name for t in types.values()}) > 1:
        notes.append(f"mixed GPU types; sized for the smallest, {smallest.name}")
    gpn = min(counts.values())
    if len(set(counts.values())) > 1:
        notes.append(f"nodes have {sorted(set(counts.values()))} GPUs; sized for {gpn} per node")
    nvlink = all(t.nvlink for t in types.values())
    return ClusterShape(gpn, len(nodes), smallest.memory_bytes, smallest.name, nvlink, tuple(notes))


def shape_from_facts(manifest: Manifest, facts: Mapping[str, Any]) -> ClusterShape:
    """The shape nvidia-smi reported (``NodeFacts`` per node name); falls back to the manifest for
    nodes without facts. Memory: the known type's CUDA total when the GPU name matches one, else
    nvidia-smi's total less the driver's share. NVLink: the probed topology where there is one."""
    declared = shape_from_manifest(manifest)
    if declared.is_cpu:
        return declared
    gpn, mem, nvlink, names = declared.gpus_per_node, declared.gpu_memory_bytes, declared.has_nvlink, declared.gpu_type
    probed = [f for f in (facts.get(n.name) for n in manifest.nodes) if f is not None and f.gpus]
    if probed:
        gpn = min(len(f.gpus) for f in probed)
        sizes = []
        for f in probed:
            for g in f.gpus:
                try:
                    sizes.append((gpu_type(g.name).memory_bytes, gpu_type(g.name).name))
                except PlanError:
                    if g.memory_total_mib:
                        sizes.append((smi_memory_bytes(g.memory_total_mib), g.name))
        if sizes:
            mem, names = min(sizes)
        links = [f.topology.nvlink for f in probed if getattr(f, "topology", None) is not None and f.topology.nvlink is not None]
        if links:
            nvlink = all(links)
    return ClusterShape(gpn, declared.nodes, mem, names, nvlink, declared.notes)


@dataclass(frozen=True)
class _RecordedGpu:
    name: str
    memory_total_mib: int | None


@dataclass(frozen=True)
class _RecordedTopology:
    nvlink: bool | None


@dataclass(frozen=True)
class RecordedFacts:
    """The part of a node's recorded facts (``NodeFacts.to_dict()``) that sizes a plan."""

    gpus: tuple[_RecordedGpu, ...]
    topology: _RecordedTopology | None


def recorded_facts(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, RecordedFacts]:
    """node name -> RecordedFacts, from the JSON `orch up` kept; for ``shape_from_facts``."""
    out: dict[str, RecordedFacts] = {}
    for name, d in nodes.items():
        gpus = tuple(_RecordedGpu(str(g.get("name") or ""), g.get("memory_total_mib")) for g in d.get("gpus") or ())
        topo = d.get("topology")
        out[name] = RecordedFacts(gpus, _RecordedTopology(topo.get("nvlink")) if isinstance(topo, Mapping) else None)
    return out


DEFAULT_GPU_TYPE = "H100-80GB"
DEFAULT_GPUS_PER_NODE = 8


def shape_from_flags(base: ClusterShape | None, gpu_type: str | None, gpu_memory_gib: float | None, gpus_per_node: int | None,
                     nodes: int | None, nvlink: bool | None) -> ClusterShape:  # fmt: skip
    """`orch plan`'s shape: ``base`` (the cluster's, when --cluster is given) with the flags laid
    over it, else the flags alone on the default GPU type. --gpu-memory-gib alone changes only
    the memory: the type (and its interconnect) stays the default's."""
    notes: tuple[str, ...] = ()
    if base is not None:
        if not any(v is not None for v in (gpu_type, gpu_memory_gib, gpus_per_node, nodes, nvlink)):
            return base
        gpu_type = gpu_type or base.gpu_type
        gpus_per_node = gpus_per_node or base.gpus_per_node
        nodes = nodes or base.nodes
        if gpu_memory_gib is None and gpu_type == base.gpu_type and base.gpu_memory_gib is not None:
            gpu_memory_gib = base.gpu_memory_gib
        nvlink = base.nvlink if nvlink is None else nvlink
        notes = base.notes + ("flags override parts of the manifest's shape",)
    elif gpu_type is None:
        gpu_type = DEFAULT_GPU_TYPE
        memory = f" with {gpu_memory_gib:g} GiB each (--gpu-memory-gib)" if gpu_memory_gib is not None else ""
        notes = (f"no --cluster or --gpu-type: assumed {nodes or 1} node(s) of {gpus_per_node or DEFAULT_GPUS_PER_NODE} x {DEFAULT_GPU_TYPE}{memory}",)
    return make_shape(
        gpu_type_name=gpu_type,
        gpus_per_node=gpus_per_node or (1 if (gpu_type or "").lower() == CPU else DEFAULT_GPUS_PER_NODE),
        nodes=nodes or 1,
        gpu_memory_gib=gpu_memory_gib,
        nvlink=nvlink,
        notes=notes,
    )
