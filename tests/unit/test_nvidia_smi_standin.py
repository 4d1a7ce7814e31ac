"""The test bed's stand-in nvidia-smi prints the real tool's formats (layouts from captures,
tests/data/nvidia-smi/SOURCES.md) for each GPU profile."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import DATA
from tests.testbed import gpus

SMI = DATA / "nvidia-smi"


def smi(tmp_path, profile: str, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / profile
    if not (bin_dir / "nvidia-smi").exists():
        gpus.install(gpus.parse_profile(profile), bin_dir, f"unit/{profile}")
    return subprocess.run([str(bin_dir / "nvidia-smi"), *args], capture_output=True, text=True, timeout=30)


def layout(line: str) -> tuple[int, list[int]]:
    return len(line), [i for i, c in enumerate(line) if c in "|+"]


def test_default_table_has_the_layout_of_the_driver_550_capture(tmp_path):
    ref = (SMI / "h100-8x-table-550.txt").read_text().splitlines()
    out = smi(tmp_path, "8xH100-80GB").stdout.splitlines()
    header, gpu_block, footer = ref[1:8], ref[8:12], ref[-8:]
    assert [layout(x) for x in out[1:8]] == [layout(x) for x in header]
    assert out[2].split() == header[1].split()  # same driver/CUDA versions as the capture
    assert out[3:8] == header[2:]  # column titles are fixed text
    for g in range(8):
        block = out[8 + 4 * g: 12 + 4 * g]
        assert [layout(x) for x in block] == [layout(x) for x in gpu_block]
        assert block[0].split()[1:6] == [str(g), "NVIDIA", "H100", "80GB", "HBM3"]
    assert out[-8:] == footer


@pytest.mark.parametrize("profile,count,name,mem", [
    ("8xH100-80GB", 8, "NVIDIA H100 80GB HBM3", "81559"),
    ("4xA100-40GB", 4, "NVIDIA A100-PCIE-40GB", "40960"),
    ("2xA100-80GB", 2, "NVIDIA A100-SXM4-80GB", "81920"),
    ("mig", 1, "NVIDIA A100-PCIE-40GB", "40960"),
])
def test_query_gpu_csv_rows_match_the_profile(tmp_path, profile, count, name, mem):
    fields = "index,name,uuid,memory.total,memory.used,memory.free,driver_version,pci.bus_id,mig.mode.current,compute_cap"
    res = smi(tmp_path, profile, f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert res.returncode == 0
    rows = [r.split(", ") for r in res.stdout.splitlines()]
    assert len(rows) == count and all(len(r) == 10 for r in rows)
    assert [r[0] for r in rows] == [str(i) for i in range(count)]
    assert {r[1] for r in rows} == {name} and {r[3] for r in rows} == {mem}
    assert len({r[2] for r in rows}) == count and all(r[2].startswith("GPU-") for r in rows)
    assert all(int(r[4]) + int(r[5]) < int(r[3]) for r in rows)  # some memory is reserved
    assert {r[8] for r in rows} == {"Enabled" if profile == "mig" else "Disabled"}


def test_query_header_and_units_like_the_real_tool(tmp_path):
    ref = (SMI / "query-gpu-h100.csv").read_text().splitlines()
    res = smi(tmp_path, "8xH100-80GB", "--query-gpu=index,name,memory.total,memory.used,driver_version", "--format=csv")
    assert res.stdout.splitlines()[:2] == ref
    res = smi(tmp_path, "8xH100-80GB", "--query-gpu=index", "--format=csv,noheader", "-i", "3")
    assert res.stdout == "3\n"


def test_invalid_query_field_is_refused_like_the_real_tool(tmp_path):
    res = smi(tmp_path, "8xH100-80GB", "--query-gpu=index,bogus", "--format=csv")
    assert res.returncode == 2 and 'Field "bogus" is not a valid field to query.' in res.stdout


def test_topo_matrix_nvlink_on_hgx_and_pcie_elsewhere(tmp_path):
    ref = (SMI / "h100-8x-topo.txt").read_text()
    assert smi(tmp_path, "8xH100-80GB", "topo", "-m").stdout == ref
    pcie = smi(tmp_path, "4xA100-40GB", "topo", "-m").stdout.splitlines()
    assert pcie[0].split("\t")[1:5] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    cells = {c for row in pcie[1:5] for c in row.split("\t")[1:5]}
    assert cells <= {" X ", "PIX", "NODE", "SYS"} and "SYS" in cells


def test_mig_listing_and_table(tmp_path):
    listing = smi(tmp_path, "mig", "-L").stdout.splitlines()
    assert listing[0].startswith("GPU 0: NVIDIA A100-PCIE-40GB (UUID: GPU-")
    assert [x.split()[:2] for x in listing[1:]] == [["MIG", "3g.20gb"]] * 2
    table = smi(tmp_path, "mig").stdout
    assert "| MIG devices:" in table and "Enabled |" in table


def test_none_profile_has_no_tool_and_broken_driver_fails_like_the_real_one(tmp_path):
    gpus.install(gpus.parse_profile("none"), tmp_path / "none", "unit/none")
    assert not (tmp_path / "none" / "nvidia-smi").exists()
    res = smi(tmp_path, "broken", "--query-gpu=index", "--format=csv")
    assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout


def test_version_and_q(tmp_path):
    assert "CUDA Version        : 12.4" in smi(tmp_path, "8xH100-80GB", "--version").stdout
    q = smi(tmp_path, "4xA100-40GB", "-q").stdout
    assert "Attached GPUs                             : 4" in q and "Driver Version" in q


@pytest.mark.parametrize("bad", ["9xH100-80GB", "8xH200", "gpu", ""])
def test_unknown_profiles_are_refused(bad):
    with pytest.raises(ValueError, match="unknown GPU profile"):
        gpus.parse_profile(bad)
