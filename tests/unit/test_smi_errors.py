"""What nvidia-smi's parsers say when they cannot read their input, and the edges of what they accept.

A ProbeParseError reads ``TOOL: line N: expected EXPECTED; got 'LINE' (FOUND)`` (its docstring);
preflight's PROBE_FAILED finding shows this text, so a person can find the line in the output. The
damaged outputs below are real captures (tests/data/probes/SOURCES.md) cut or edited the way pastes
and broken pipes damage them; each test says which.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.nodes import smi
from orchestrator.nodes.parse_error import ProbeParseError

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"


def read(name: str) -> str:
    return (DATA / name).read_text()


def read_nvidia_smi(name: str) -> str:
    return (DATA.parent / "nvidia-smi" / name).read_text()


def topo_error(text: str) -> ProbeParseError:
    with pytest.raises(ProbeParseError) as info:
        smi.parse_topo(text)
    return info.value


# ----------------------------------------------------------------------------------- --help-query-gpu


def test_help_query_gpu_refusal_is_quoted_whole():
    # What nvidia-smi prints for an option it does not know (drivers before --help-query-gpu).
    text = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
    with pytest.raises(ProbeParseError) as info:
        smi.parse_help_query_gpu(text)
    assert str(info.value) == (
        "nvidia-smi --help-query-gpu: line 1: expected lines that start with a quoted field name such as "
        '"name"; got "Invalid combination of input arguments. Please run \'nvidia-smi -h\' for help."'
    )


def test_help_query_gpu_that_printed_nothing_says_so():
    with pytest.raises(ProbeParseError) as info:
        smi.parse_help_query_gpu("\n\n")
    assert (info.value.line_no, info.value.line) == (1, "")
    assert str(info.value).endswith("; got ''")


# ----------------------------------------------------------------------------------- topo -m


def test_topo_of_an_empty_output_names_line_one():
    err = topo_error("")
    assert (err.line_no, err.line) == (1, "")
    assert str(err) == (
        "nvidia-smi topo -m: line 1: expected a header row of device columns starting with GPU0 "
        "(no such line in the output); got ''"
    )


def test_topo_header_missing_a_gpu_column_is_refused():
    # topo_2gpu_phb_club3090_1229.txt with the GPU1 column header lost (GPU0 then GPU2).
    text = read("topo_2gpu_phb_club3090_1229.txt").replace("GPU1\tCPU", "GPU2\tCPU", 1)
    header = text.splitlines()[0]
    assert "GPU2" in header and "GPU1" not in header
    err = topo_error(text)
    assert (
        str(err)
        == f"nvidia-smi topo -m: line 1: expected GPU columns numbered GPU0, GPU1, ... in order; got {header!r}"
    )


def test_topo_cut_right_after_the_header_names_every_missing_row():
    # The first line of topo_2gpu_phb_club3090_1229.txt alone, then the blank line before the legend.
    header = read("topo_2gpu_phb_club3090_1229.txt").splitlines()[0]
    err = topo_error(header + "\n\nLegend:\n")
    assert str(err) == (
        "nvidia-smi topo -m: line 1: expected one row per GPU column; no row for GPU0, GPU1 "
        f"(the matrix ends at line 1); got {header!r}"
    )


def test_topo_matrix_ends_at_a_legend_that_follows_without_a_blank_line():
    # topo_2gpu_phb_club3090_1229.txt without its GPU1 row and without the blank line before "Legend:".
    lines = read("topo_2gpu_phb_club3090_1229.txt").splitlines()
    assert lines[3] == "" and lines[4] == "Legend:"
    text = "\n".join([lines[0], lines[1], *lines[4:]]) + "\n"
    err = topo_error(text)
    assert err.line_no == 2 and err.line == lines[1]
    assert "no row for GPU1 (the matrix ends at line 2)" in str(err)


def test_topo_row_cut_before_its_link_cells_says_how_many_it_has():
    # topo_4gpu_h100_nv6_nccl_1617_excerpt.txt with the GPU2 row cut after its first link cell.
    lines = read("topo_4gpu_h100_nv6_nccl_1617_excerpt.txt").splitlines()
    no = next(i for i, ln in enumerate(lines, 1) if ln.startswith("GPU2"))
    cut = " ".join(lines[no - 1].split()[:2])
    text = "\n".join([*lines[: no - 1], cut, *lines[no:]]) + "\n"
    err = topo_error(text)
    assert (
        str(err)
        == f"nvidia-smi topo -m: line {no}: expected 4 link cells (one per GPU); got {cut!r} (row GPU2 has 1 cells)"
    )


def test_topo_matrix_without_trailing_columns_is_read():
    # The GPU x GPU part of topo_2gpu_phb_club3090_1229.txt alone (what `cut -f1-3` leaves): each row
    # has exactly as many cells as GPUs, and the last one ends in the X of the diagonal.
    lines = [ln.split("\t") for ln in read("topo_2gpu_phb_club3090_1229.txt").splitlines()[:3]]
    text = "\n".join("\t".join(cells[:3]).rstrip() for cells in lines) + "\n"
    assert text.endswith("PHB\t X\n")
    t = smi.parse_topo(text)
    assert t.links == (("X", "PHB"), ("PHB", "X")) and t.nvlink is False


def test_topo_quotes_a_bad_line_as_printed_with_its_trailing_blanks():
    # The cut GPU6 row of topo_8gpu_pcie_deepep_128_excerpt.txt with the tab a pipe left behind it.
    lines = read("topo_8gpu_pcie_deepep_128_excerpt.txt").splitlines()
    text = "\n".join([*lines[:-1], lines[-1] + "\t"]) + "\n"
    err = topo_error(text)
    assert err.line == "GPU6    SYS     SYS     SYS\t"


def test_topo_self_link_that_is_not_x_names_the_diagonal():
    # topo_2gpu_phb_club3090_1229.txt with GPU1's own cell overwritten by a link kind.
    text = read("topo_2gpu_phb_club3090_1229.txt").replace("GPU1\tPHB\t X ", "GPU1\tPHB\tPHB", 1)
    err = topo_error(text)
    assert str(err) == (
        "nvidia-smi topo -m: line 3: expected X (the GPU itself) in column GPU1; "
        "got 'GPU1\\tPHB\\tPHB\\t0-63\\t0\\t\\tN/A' (row GPU1 has 'PHB')"
    )


def test_topo_x_off_the_diagonal_asks_for_a_link_kind():
    # topo_2gpu_phb_club3090_1229.txt with GPU0's link to GPU1 overwritten by X.
    text = read("topo_2gpu_phb_club3090_1229.txt").replace("GPU0\t X \tPHB", "GPU0\t X \t X ", 1)
    err = topo_error(text)
    assert str(err) == (
        "nvidia-smi topo -m: line 2: expected a link kind (NV#, PIX, PXB, PHB, NODE, SYS) in column GPU1; "
        "got 'GPU0\\t X \\t X \\t0-63\\t0\\t\\tN/A' (row GPU0 has 'X')"
    )


# ----------------------------------------------------------------------------------- --query-gpu


def test_gpu_query_with_too_few_values_names_the_fields_it_wanted():
    # gpu_query_h100nvl_akash_91.csv is the output of `--query-gpu=name,pci.device_id`: 2 values, not 3.
    with pytest.raises(ProbeParseError) as info:
        smi.parse_gpu_query(read("gpu_query_h100nvl_akash_91.csv"), fields=("name", "pci.device_id", "uuid"))
    assert str(info.value) == (
        "nvidia-smi --query-gpu: line 1: expected 3 comma-separated values (name, pci.device_id, uuid); "
        "got 'NVIDIA H100 NVL, 0x232110DE' (2 values)"
    )


def test_gpu_query_index_is_read_from_its_column_not_the_row_position():
    # `nvidia-smi -i 1 --query-gpu=...` prints GPU 1 alone: the second row of gpu_query_csv_header_triton_8070.csv.
    row = read("gpu_query_csv_header_triton_8070.csv").splitlines()[2]
    (gpu,) = smi.parse_gpu_query(row + "\n", fields=("compute_cap", "compute_mode", "driver_version", "name", "index"))
    assert (gpu.index, gpu.name) == (1, "NVIDIA RTX 5880 Ada Generation")


def test_gpu_query_blank_lines_before_the_rows_are_skipped():
    text = "\n" + read("gpu_query_mig_disabled_nvtop_470.csv")
    assert [g.mig_mode for g in smi.parse_gpu_query(text, fields=("mig.mode.current",))] == ["Disabled", "Disabled"]


def test_gpu_query_header_with_units_on_the_first_field_is_skipped():
    # tests/data/nvidia-smi/query-gpu-h100.csv (`--format=csv`, units in the header and values) with
    # its columns in the order `--query-gpu=memory.total,index,name` asks for them.
    header, row = ([c.strip() for c in ln.split(",")] for ln in read_nvidia_smi("query-gpu-h100.csv").splitlines()[:2])
    order = (2, 0, 1)
    text = "\n".join(", ".join(cells[i] for i in order) for cells in (header, row)) + "\n"
    assert text.startswith("memory.total [MiB], index, name\n")
    (gpu,) = smi.parse_gpu_query(text, fields=("memory.total", "index", "name"))
    assert (gpu.index, gpu.name, gpu.memory_total_mib) == (0, "NVIDIA H100 80GB HBM3", 81559)


def test_gpu_query_without_a_name_column_names_the_gpu_unknown():
    (gpu,) = smi.parse_gpu_query(
        read("gpu_query_na_i3pystatus_776.csv"),
        fields=(
            "memory.total",
            "memory.free",
            "memory.used",
            "temperature.gpu",
            "fan.speed",
            "utilization.gpu",
            "utilization.memory",
        ),
    )
    assert gpu.name == "unknown"


def test_gpu_query_reads_the_aliases_help_query_gpu_lists():
    # smi_help_query_gpu_470_candle_733_excerpt.txt: `"name" or "gpu_name"`, `"uuid" or "gpu_uuid"`,
    # `"pci.bus_id" or "gpu_bus_id"`: either spelling asks for the same value.
    known = smi.parse_help_query_gpu(read("smi_help_query_gpu_470_candle_733_excerpt.txt"))
    assert {"gpu_name", "uuid", "gpu_bus_id"} <= known
    (nvl,) = smi.parse_gpu_query(read("gpu_query_h100nvl_akash_91.csv"), fields=("gpu_name", "pci.device_id"))
    assert nvl.name == "NVIDIA H100 NVL"
    fields = tuple(
        "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,uuid,"
        "power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,"
        "utilization.gpu,utilization.memory,fan.speed,pcie.link.width.current,pstate".split(",")
    )
    (rtx,) = smi.parse_gpu_query(read("gpu_query_noheader_nounits_gpuutils_83.csv"), fields=fields)
    assert rtx.uuid == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"
    # GPU 0 of smi_banner_595_l40s_gpu_exporter.txt as `--query-gpu=index,gpu_name,gpu_bus_id` prints it.
    (l40s,) = smi.parse_gpu_query("0, NVIDIA L40S, 00000000:01:00.0\n", fields=("index", "gpu_name", "gpu_bus_id"))
    assert (l40s.name, l40s.pci_bus_id) == ("NVIDIA L40S", "00000000:01:00.0")


# ----------------------------------------------------------------------------------- banner


def test_banner_pasted_with_markdown_bold_values():
    # smi_banner_535_cuda122_akash_12.txt's version line with both versions in markdown bold, as
    # smi_banner_450_cuda_na_markdown_rapidsai_405.txt pastes `**CUDA Version: N/A**`.
    line = read("smi_banner_535_cuda122_akash_12.txt").splitlines()[2]
    bold = line.replace("535.129.03   ", "**535.129.03** ").replace("12.2", "**12.2**")
    assert "Driver Version: **535.129.03**" in bold and "CUDA Version: **12.2**" in bold
    assert smi.parse_smi_banner(bold) == ("535.129.03", "12.2")
    label = line.replace("Driver Version:", "**Driver Version**:").replace("CUDA Version:", "**CUDA Version**:")
    assert smi.parse_smi_banner(label) == ("535.129.03", "12.2")


def test_topo_with_windows_line_ends_reads_like_the_original():
    # nvidia-smi on Windows (WDDM) and pastes saved there end lines with \r\n.
    text = read("topo_2gpu_phb_club3090_1229.txt")
    crlf = smi.parse_topo(text.replace("\n", "\r\n"))
    assert crlf == smi.parse_topo(text) and crlf.links == (("X", "PHB"), ("PHB", "X"))
