"""Cluster shapes: known GPU types, flags, cluster.yaml and probed nvidia-smi facts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import PlanError
from orchestrator.manifest.load import load_manifest, load_manifest_file
from orchestrator.nodes.facts import GpuInfo, NodeFacts, TopologyInfo
from orchestrator.plan.shape import GIB, GPU_TYPES, gpu_type, make_shape, shape_from_facts, shape_from_manifest

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"


def test_gpu_types_resolve_by_name_or_alias_and_report_cuda_totals():
    assert gpu_type("h100").name == "H100-80GB"
    assert gpu_type("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    # CUDA's device total is below the nominal size read as GiB (H100: 79.18 GiB, as vLLM logs it).
    assert GPU_TYPES["H100-80GB"].memory_bytes / GIB == pytest.approx(79.18)
    assert all(t.memory_bytes < int(t.name.split("-")[1].rstrip("GB")) * GIB for t in GPU_TYPES.values())
    with pytest.raises(PlanError, match="did you mean 'H100-80GB'"):
        gpu_type("H100-80GiB")


def test_flags_make_a_shape():
    shape = make_shape(gpu_type_name="L40S-48GB", gpus_per_node=4, nodes=2)
    assert (shape.total_gpus, shape.has_nvlink, shape.is_cpu) == (8, False, False)
    custom = make_shape(gpu_type_name=None, gpu_memory_gib=40, gpus_per_node=2, nodes=1)
    assert custom.gpu_memory_bytes == 40 * GIB and not custom.has_nvlink
    assert make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=3).is_cpu
    with pytest.raises(PlanError, match="no GPU type"):
        make_shape(gpu_type_name=None, gpus_per_node=8, nodes=1)


def test_shape_from_the_405b_template():
    shape = shape_from_manifest(load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml"))
    assert (shape.nodes, shape.gpus_per_node, shape.gpu_type, shape.has_nvlink) == (2, 8, "H100-80GB", True)


def test_shape_from_the_local_cpu_template():
    shape = shape_from_manifest(load_manifest_file(TEMPLATES / "local.yaml"))
    assert shape.is_cpu and shape.nodes == 1 and shape.gpu_memory_bytes is None


MIXED = """\
name: mixed
nodes:
  - {name: a, host: 10.0.0.1, role: head, gpus: 8, gpu_type: H100-80GB}
  - {name: b, host: 10.0.0.2, gpus: 4, gpu_type: A100-40GB}
"""


def test_mixed_nodes_are_sized_for_the_smallest(tmp_path):
    shape = shape_from_manifest(load_manifest(MIXED, tmp_path / "cluster.yaml"))
    assert (shape.gpus_per_node, shape.gpu_type) == (4, "A100-40GB")
    assert len(shape.notes) == 2


def test_manifest_without_gpu_type_is_a_plan_error(tmp_path):
    text = MIXED.replace(", gpu_type: A100-40GB", "")
    with pytest.raises(PlanError, match="node\\(s\\) b"):
        shape_from_manifest(load_manifest(text, tmp_path / "cluster.yaml"))


def _facts(node: str, count: int, name: str, mib: int, nvlink: bool | None) -> NodeFacts:
    gpus = tuple(GpuInfo(index=i, name=name, memory_total_mib=mib, driver_version="570.0") for i in range(count))
    topo = TopologyInfo(gpus=tuple(f"GPU{i}" for i in range(count)), links=(), nvlink=nvlink)
    return NodeFacts(node=node, host="10.0.0.1", gpus=gpus, topology=topo)


def test_probed_facts_override_the_declared_shape(tmp_path):
    manifest = load_manifest(MIXED.replace("A100-40GB", "H100-80GB").replace("gpus: 4", "gpus: 8"), tmp_path / "c.yaml")
    facts = {
        "a": _facts("a", 8, "NVIDIA H100 80GB HBM3", 81559, True),
        "b": _facts("b", 7, "NVIDIA H100 80GB HBM3", 81559, False),  # one GPU missing, PCIe pairs
    }
    shape = shape_from_facts(manifest, facts)
    assert (shape.gpus_per_node, shape.gpu_type, shape.has_nvlink) == (7, "H100-80GB", False)
    unknown = {"a": _facts("a", 8, "Some New GPU", 100_000, None)}
    odd = shape_from_facts(manifest, unknown)
    assert odd.gpu_memory_bytes == 100_000 * 2**20 - int(0.47 * GIB)
