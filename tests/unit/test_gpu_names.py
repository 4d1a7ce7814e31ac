"""Every catalog GPU type and every alias orch lists matches the names real nvidia-smi prints
for that card, and no other card's name. The real names and their memory totals were read by
hand in the captures named here (tests/data/probes/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.manifest.load import load_manifest
from orchestrator.nodes.facts import GpuInfo, NodeFacts
from orchestrator.plan.gpu_names import SMI_NAMES, gpu_type_matches, type_of_smi_name
from orchestrator.plan.shape import GPU_TYPES
from orchestrator.preflight.gpu_checks import check_gpu_type

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"

# real name -> (capture where nvidia-smi printed it, the MiB total printed beside it or None)
CAPTURED: dict[str, tuple[str, int | None]] = {
    "NVIDIA H100 80GB HBM3": ("smi_banner_535_h100_gvisor_10413_excerpt.txt", 81559),
    "NVIDIA H100 NVL": ("smi_banner_535_h100nvl_mig_dcgm_exporter_544_excerpt.txt", None),  # MIG on: memory cell N/A
    "NVIDIA H200": ("smi_banner_590_h200_gpu_exporter.txt", 143771),
    "NVIDIA B200": ("smi_banner_610_kmd_b200_sglang_27487_excerpt.txt", 183359),
    "NVIDIA A100-SXM4-80GB": ("smi_table_535_a100sxm4_80gb_nccl_tests_228_excerpt.txt", 81920),
    "A100-SXM-80GB": ("smi_banner_450_cuda113_spark_8.txt", 81252),
    "NVIDIA A100-SXM4-40GB": ("smi_banner_580_cuda13_bottlerocket_834.txt", 40960),
    "NVIDIA A100-PCIE-40GB": ("smi_banner_550_a100pcie_mig_dcgm_exporter_272_excerpt.txt", 40960),
    "NVIDIA L40S": ("smi_banner_595_l40s_gpu_exporter.txt", 46068),
    "NVIDIA L4": ("smi_banner_570_l4_speaches_438_excerpt.txt", 23034),
    "NVIDIA A10G": ("smi_banner_535_a10g_dcgm_232_excerpt.txt", 23028),
    "NVIDIA GeForce RTX 3090": ("smi_banner_595_rtx3090_club3090_1129_excerpt.txt", 24576),
    "NVIDIA GeForce RTX 4090": ("smi_banner_550_rtx4090_rlinf_255_excerpt.txt", 24564),
    "NVIDIA GeForce RTX 4090 D": ("smi_banner_550_rtx4090d_spatiallm_28_excerpt.txt", 24564),
}

PAIRS = [(t, ident, real) for t, names in SMI_NAMES.items() for ident in (t, *GPU_TYPES[t].aliases) for real in names]


@pytest.mark.parametrize("real", sorted(CAPTURED))
def test_each_real_name_is_printed_in_its_capture(real):
    capture, mib = CAPTURED[real]
    text = (DATA / capture).read_text()
    assert f" {real} " in text
    if mib is not None:
        assert f"{mib}MiB" in text


# Catalog types with no public nvidia-smi capture found yet (the name below is how the vLLM logs of
# tests/data/planner/SOURCES.md rows M-P name the card); they match by their aliases' words.
UNCAPTURED = {"RTXPRO6000-96GB": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)}


def test_the_table_covers_every_catalog_type_with_captured_names():
    assert set(SMI_NAMES) | set(UNCAPTURED) == set(GPU_TYPES) and not set(SMI_NAMES) & set(UNCAPTURED)
    assert {n for names in SMI_NAMES.values() for n in names} == set(CAPTURED)


@pytest.mark.parametrize("declared, ident, real", PAIRS, ids=[f"{i}={r}" for _, i, r in PAIRS])
def test_every_type_and_alias_matches_its_real_names(declared, ident, real):
    mib = CAPTURED[real][1]
    assert type_of_smi_name(real) == declared
    assert gpu_type_matches(ident, real, mib) is True
    assert gpu_type_matches(ident.upper(), real, mib) is True


@pytest.mark.parametrize("declared", sorted(SMI_NAMES))
def test_no_type_matches_another_cards_name(declared):
    others = [r for t, names in SMI_NAMES.items() if t != declared for r in names]
    for ident in (declared, *GPU_TYPES[declared].aliases):
        assert [r for r in others if gpu_type_matches(ident, r, CAPTURED[r][1])] == [], ident


@pytest.mark.parametrize("declared", sorted(UNCAPTURED))
def test_a_type_without_a_captured_name_matches_its_card_by_alias_and_no_other(declared):
    real, mib = UNCAPTURED[declared]
    assert type_of_smi_name(real) is None
    assert gpu_type_matches(declared, real, mib) is True
    assert [r for names in SMI_NAMES.values() for r in names if gpu_type_matches(declared, r, CAPTURED[r][1])] == []


def test_the_issue_case_rtx4090_passes_preflight():
    # Before: RTX4090-24GB was split into the word RTX4090, which "NVIDIA GeForce RTX 4090" lacks.
    m = load_manifest(yaml.safe_dump({"name": "t", "nodes": [
        {"name": "a", "host": "10.0.0.1", "role": "head", "gpus": 2, "gpu_type": "RTX4090-24GB"}]}), "/tmp/c.yaml")  # fmt: skip
    gpus = tuple(GpuInfo(index=i, name="NVIDIA GeForce RTX 4090", memory_total_mib=24564, driver_version="550.163.01") for i in range(2))
    assert check_gpu_type(m, {"a": NodeFacts(node="a", host="10.0.0.1", gpus=gpus, nvidia_smi=True)}) == []
    h100 = tuple(GpuInfo(index=i, name="NVIDIA H100 NVL", memory_total_mib=None, driver_version="535.230.02") for i in range(2))
    (f,) = check_gpu_type(m, {"a": NodeFacts(node="a", host="10.0.0.1", gpus=h100, nvidia_smi=True)})
    assert f.code == "GPU_TYPE_MISMATCH" and "NVIDIA H100 NVL" in f.message
