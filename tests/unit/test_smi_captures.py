"""nvidia-smi parsers on the captures of issue 13 (tests/data/probes/SOURCES.md): drivers 450 to
610, HGX/DGX boards, MIG, containers without the CUDA user library, pasted and raw ANSI headers.
Every expected value below was read off the capture file by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.nodes import probes, smi
from orchestrator.nodes.parse_error import ProbeParseError

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"


def read(name: str) -> str:
    return (DATA / name).read_text()


# ----------------------------------------------------------------------------------- topo -m


def test_topo_b300_header_wrapped_in_pasted_underline_escapes():
    text = read("topo_8gpu_b300_nv18_ansi_sglang_26039.txt")
    assert "\t[4mGPU0" in text and "GPU NUMA ID[0m" in text and "\x1b" not in text  # the paste lost the ESC byte
    t = smi.parse_topo(text)
    assert t.gpus == tuple(f"GPU{i}" for i in range(8))
    assert t.nvlink is True and {t.link(i, j) for i in range(8) for j in range(8) if i != j} == {"NV18"}
    assert t.nics == tuple(f"NIC{i}" for i in range(9))
    assert t.nic_names == {**{f"NIC{i}": f"mlx5_{10 + i}" for i in range(8)}, "NIC8": "mlx5_bond_0"}


def test_topo_raw_escape_bytes_around_the_header():
    text = read("topo_1gpu_610_ansi_gpu_exporter.txt")
    assert text.startswith("\t\x1b[4mGPU0\tCPU Affinity") and "GPU NUMA ID\x1b[0m\n" in text
    t = smi.parse_topo(text)
    assert t.gpus == ("GPU0",) and t.links == (("X",),) and t.nvlink is None


@pytest.mark.parametrize(
    "name, gpus, kind, nics",
    [
        ("topo_8gpu_h20_nv18_sglang_24966.txt", 8, "NV18", 8),
        ("topo_8gpu_b200_nv18_vllm_24513_excerpt.txt", 8, "NV18", 8),  # NIC4 row cut: GPU rows complete
        ("topo_8gpu_h100_nv18_spaces_sglang_30401.txt", 8, "NV18", 8),
        ("topo_4gpu_h100_nv6_nccl_1617_excerpt.txt", 4, "NV6", 4),
        ("topo_4gpu_gb200_nv18_k8s_test_infra_371_excerpt.txt", 4, "NV18", 0),
        ("topo_2gpu_nv12_blank_affinity_vllm_19607_excerpt.txt", 2, "NV12", 8),
    ],
)
def test_topo_all_nvlink_boards(name, gpus, kind, nics):
    t = smi.parse_topo(read(name))
    assert len(t.gpus) == gpus and t.nvlink is True
    assert {t.link(i, j) for i in range(gpus) for j in range(gpus) if i != j} == {kind}
    assert all(t.link(i, i) == "X" for i in range(gpus))
    assert t.nics == tuple(f"NIC{i}" for i in range(nics))


def test_topo_nic_legends():
    assert smi.parse_topo(read("topo_8gpu_h20_nv18_sglang_24966.txt")).nic_names == {f"NIC{i}": f"mlx5_{i + 1}" for i in range(8)}
    assert smi.parse_topo(read("topo_8gpu_h100_nv18_spaces_sglang_30401.txt")).nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
    assert smi.parse_topo(read("topo_4gpu_h100_nv6_nccl_1617_excerpt.txt")).nic_names == {}  # legend cut before the NIC part


def test_topo_two_rtx3090_over_sys_with_a_numa_na_cell():
    t = smi.parse_topo(read("topo_2gpu_rtx3090_sys_numa_na_club3090_178_excerpt.txt"))
    assert t.links == (("X", "SYS"), ("SYS", "X"))
    assert t.nvlink is False and t.non_nvlink_pairs() == [("GPU0", "GPU1", "SYS")]


def test_topo_single_l40s():
    t = smi.parse_topo(read("topo_1gpu_l40s_595_gpu_exporter.txt"))
    assert t.gpus == ("GPU0",) and t.nvlink is None and t.nics == ()


def test_topo_header_tokens_glued_by_a_paste_are_split():
    # vllm#31594 pasted `NIC11NIC12` (tab stops lost): 13 NIC columns, not 12.
    text = (
        "        GPU0    GPU1    NIC10   NIC11NIC12    CPU Affinity    NUMA Affinity   GPU NUMA ID\n"
        "GPU0     X      NV18    NODE    PIX  NODE     0-15    0               N/A\n"
        "GPU1    NV18     X      PIX     NODE NODE     0-15    0               N/A\n"
    )
    assert smi.parse_topo(text).nics == ("NIC10", "NIC11", "NIC12")


def test_topo_cut_inside_the_matrix_names_the_line_and_the_missing_row():
    with pytest.raises(ProbeParseError) as info:
        smi.parse_topo(read("topo_8gpu_pcie_deepep_128_excerpt.txt"))
    err = info.value
    assert err.line_no == 8 and err.line == "GPU6    SYS     SYS     SYS"
    assert str(err).startswith("nvidia-smi topo -m: line 8: expected one row per GPU column; no row for GPU7")


def test_topo_of_something_else_says_what_it_expected_and_where():
    with pytest.raises(ProbeParseError) as info:
        smi.parse_topo(read("smi_banner_590_h200_gpu_exporter.txt"))
    assert info.value.line_no == 1 and "a header row of device columns starting with GPU0" in str(info.value)
    assert "Fri Jul  3 22:10:45 2026" in str(info.value)


def test_topo_corrupt_cell_names_row_column_and_line():
    # vLLM pastes where cells ran together ("PH0-115") must not read as a topology.
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPH0-115\t0-3\nGPU1\tPHB\t X \t0-3\n"
    with pytest.raises(ProbeParseError) as info:
        smi.parse_topo(text)
    assert info.value.line_no == 2 and "in column GPU1" in str(info.value) and "'PH0-115'" in str(info.value)


# ----------------------------------------------------------------------------------- banner


@pytest.mark.parametrize(
    "name, driver, cuda",
    [
        ("smi_banner_590_h200_gpu_exporter.txt", "590.48.01", "13.1"),
        ("smi_banner_590_h200_mig_gpu_exporter.txt", "590.48.01", "13.1"),
        ("smi_banner_595_l40s_gpu_exporter.txt", "595.80", "13.2"),
        ("smi_banner_610_kmd_wddm_gpu_exporter.txt", "610.62", "13.3"),
        ("smi_version_610_kmd_gpu_exporter.txt", "610.62", "13.3"),
        ("smi_q_610_kmd_head_gpu_exporter.txt", "610.62", "13.3"),
        ("smi_banner_610_kmd_b200_sglang_27487_excerpt.txt", "610.43.02", "13.3"),
        ("smi_banner_535_h100nvl_mig_dcgm_exporter_544_excerpt.txt", "535.230.02", "12.4"),
        ("smi_banner_550_a100pcie_mig_dcgm_exporter_272_excerpt.txt", "550.54.14", "12.4"),
        ("smi_banner_550_rtx4090_rlinf_255_excerpt.txt", "550.163.01", "12.4"),
        ("smi_banner_550_rtx4090d_spatiallm_28_excerpt.txt", "550.107.02", "12.4"),
        ("smi_banner_535_h100_gvisor_10413_excerpt.txt", "535.129.03", "12.2"),
        # containers without the CUDA user library: the driver is still known
        ("smi_banner_470_cuda_na_ros_docker_gui_12_excerpt.txt", "470.57.02", None),
        ("smi_banner_450_cuda_na_markdown_rapidsai_405.txt", "450.36.06", None),
        # a 470 nvidia-smi inside a snap on a 580 driver: the driver, not the tool
        ("smi_banner_470tool_580driver_inference_snaps_89.txt", "580.95.05", "13.0"),
    ],
)
def test_banner_driver_and_cuda(name, driver, cuda):
    assert smi.parse_smi_banner(read(name)) == (driver, cuda)


def test_kmd_labels_are_what_driver_610_prints():
    text = read("smi_banner_610_kmd_b200_sglang_27487_excerpt.txt")
    assert "KMD Version: 610.43.02" in text and "Driver Version" not in text and "CUDA UMD Version: 13.3" in text


# ----------------------------------------------------------------------------------- query fields


def test_help_query_gpu_of_driver_470_lists_names_and_aliases_but_not_compute_cap():
    known = smi.parse_help_query_gpu(read("smi_help_query_gpu_470_candle_733_excerpt.txt"))
    assert {"name", "gpu_name", "uuid", "gpu_uuid", "pci.bus_id", "gpu_bus_id", "driver_version", "pcie.link.gen.max"} <= known
    assert "compute_cap" not in known
    # the excerpt ends before index and memory.total: only what it lists is kept
    assert smi.supported_fields(smi.GPU_FIELDS, known) == ("name", "driver_version", "uuid", "pci.bus_id")


def test_help_query_gpu_unreadable_names_line_one():
    with pytest.raises(ProbeParseError, match="line 1: expected lines that start with a quoted field name"):
        smi.parse_help_query_gpu("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")


def test_the_refused_field_is_read_from_the_message():
    assert smi.invalid_query_field(read("smi_query_invalid_field_compute_cap_inference_snaps_89.txt")) == "compute_cap"
    assert smi.invalid_query_field(read("smi_banner_470_cuda_na_ros_docker_gui_12_excerpt.txt")) is None


def test_query_argv_is_built_from_the_fields_given():
    assert smi.gpu_query_argv(("index", "name")) == ["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader,nounits"]
    assert smi.help_query_gpu_argv() == ["nvidia-smi", "--help-query-gpu"]


# ----------------------------------------------------------------------------------- ibstat (RoCE, Omni-Path)


def test_ibstat_bonded_roce_devices():
    ports = probes.parse_ibstat(read("ibstat_roce_bond_pplx_garden_2_excerpt.txt"))
    # the third CA is cut before its port: two ports
    assert [(p.device, p.port, p.state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_bond_0", 1, "Active", 200.0, "Ethernet"),
        ("mlx5_bond_1", 1, "Active", 200.0, "Ethernet"),
    ]
    assert all(p.active for p in ports)


def test_ibstat_roce_and_a_disabled_port_cut_before_its_rate():
    ports = probes.parse_ibstat(read("ibstat_roce_cx7_and_down_cx6_mooncake_1999_excerpt.txt"))
    assert [(p.device, p.state, p.physical_state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_0", "Active", "LinkUp", 200.0, "Ethernet"),
        ("mlx5_1", "Active", "LinkUp", 200.0, "Ethernet"),
        ("mlx5_10", "Down", "Disabled", None, None),
    ]
    assert [p.active for p in ports] == [True, True, False]


def test_ibstat_infiniband_ndr_and_hdr():
    ndr = probes.parse_ibstat(read("ibstat_ib_ndr400_deepep_303_excerpt.txt"))
    assert [(p.device, p.rate_gbps, p.link_layer) for p in ndr] == [
        ("mlx5_0", 400.0, "InfiniBand"), ("mlx5_1", 400.0, "InfiniBand"), ("mlx5_2", None, None)]  # fmt: skip
    hdr = probes.parse_ibstat(read("ibstat_ib_hdr_down_disabled_nccl_tests_128_excerpt.txt"))
    assert [(p.device, p.state, p.physical_state, p.rate_gbps) for p in hdr] == [
        ("mlx5_0", "Active", "LinkUp", 200.0), ("mlx5_1", "Down", "Disabled", 10.0), ("mlx5_2", "Active", "LinkUp", None)]  # fmt: skip


def test_ibstat_omni_path_hfi_with_empty_values_and_four_space_indent():
    (port,) = probes.parse_ibstat(read("ibstat_omnipath_hfi1_opa_ff_4.txt"))
    assert (port.device, port.port, port.state, port.physical_state, port.rate_gbps, port.link_layer) == (
        "hfi1_0", 1, "Active", "LinkUp", 100.0, "InfiniBand")  # fmt: skip
