"""NCCL's own words about its network and nccl-tests' tables, parsed. Every input is a real log or
output from a public issue (tests/data/collective/SOURCES.md); expected values are read off those
lines by hand, and the bandwidth formula is checked against nccl-tests' own columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.collective.figures import SLOW_FRACTION, addresses, error_line
from orchestrator.collective.nccl_log import (
    alg_bandwidth,
    bus_bandwidth,
    parse_nccl_log,
    parse_nccl_tests,
    transport_kind,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "collective"


def log(name: str) -> str:
    return (DATA / name).read_text()


def test_infiniband_with_sharp_plugin():
    net = parse_nccl_log(log("nccl-ib-sharp-nccl1357.log"))
    assert net.transport == "rdma" and net.networks == ("IBext",)
    assert [(d.index, d.device, d.port, d.link_layer, d.sharp) for d in net.ib_devices] == [
        (0, "mlx5_0", 1, "IB", True), (1, "mlx5_1", 1, "IB", True), (2, "mlx5_4", 1, "IB", True), (3, "mlx5_5", 1, "IB", True),
    ]  # fmt: skip
    assert not net.no_ib_device and net.socket_devices == ()


def test_roce_devices_and_network():
    net = parse_nccl_log(log("nccl-roce-nccltests185.log"))
    assert net.transport == "rdma" and net.networks == ("IB",) and net.version == "2.19.3"
    assert [(d.device, d.port, d.link_layer) for d in net.ib_devices] == [("mlx5_10", 1, "RoCE"), ("mlx5_11", 1, "RoCE")]


def test_roce_channels_name_the_devices_used():
    net = parse_nccl_log(log("nccl-roce-channels-nccl-mesh-plugin56.log"))
    assert net.channels == (("IB", 4), ("IB", 5)) and net.transport == "rdma"


def test_plugin_transport_names_count_as_rdma():
    net = parse_nccl_log(log("nccl-ibext-v8-channels-nccl1814.log"))
    assert net.transport == "rdma" and {i for _, i in net.channels} == {6, 0, 7}
    assert transport_kind("IBext_v8") == "rdma" and transport_kind("Socket") == "socket"


@pytest.mark.parametrize("name", ["nccl-socket-fallback-nccl952.log", "nccl-socket-channels-nccltests284.log"])
def test_socket_channels(name):
    net = parse_nccl_log(log(name))
    assert net.transport == "socket" and net.channels == (("Socket", 0),)


def test_socket_fallback_keeps_nccls_warning():
    net = parse_nccl_log(log("nccl-socket-fallback-nccl952.log"))
    assert net.warnings[-1] == "socketProgress: Connection closed by remote peer <cluster_name>.ibnet<53735>"


def test_no_ib_device_then_sockets():
    net = parse_nccl_log(log("nccl-socket-nccltests217.log"))
    assert net.no_ib_device and net.networks == ("Socket",) and net.transport == "socket"
    assert [(d.interface, d.address) for d in net.socket_devices] == [("lo", "127.0.0.1")]
    assert net.version == "2.21.5"


def test_old_nccl_without_using_network_line():
    # NCCL 2.4.8 printed no "Using network": "No device found" plus the socket device says it.
    net = parse_nccl_log(log("nccl-socket-aws-nccl398.log"))
    assert net.networks == () and net.channels == ()
    assert net.transport == "socket" and [(d.interface, d.address) for d in net.socket_devices] == [("ens5", "172.31.0.112")]


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("nccl-tests-*.txt")))
def test_algbw_is_size_over_time_as_nccl_tests_prints_it(name):
    rows = parse_nccl_tests(log(name))
    assert rows
    for r in rows:  # columns rounded to 0.01 GB/s by nccl-tests
        assert alg_bandwidth(r.size, r.time_us * 1e-6) == pytest.approx(r.algbw, abs=0.006, rel=0.002)


def test_busbw_of_two_ranks_matches_nccl_tests():
    rows = parse_nccl_tests(log("nccl-tests-allreduce-2x1-h100-nccltests232.txt"))  # -np 2
    assert [r.size for r in rows] == [2097152, 4194304, 8388608, 16777216, 33554432]
    assert rows[-1].busbw == 41.31 and rows[-1].in_place_busbw == 41.52
    for r in rows:
        assert bus_bandwidth(r.size, r.time_us * 1e-6, 2) == pytest.approx(r.busbw, abs=0.006, rel=0.002)


def test_slow_thresholds_against_reported_runs():
    # nccl-tests#182: one HDR (200 Gb/s = 25 GB/s) port per VM, 4.86 GB/s: flagged.
    hdr = max(r.busbw for r in parse_nccl_tests(log("nccl-tests-allreduce-hdr-vm-nccltests182.txt")))
    assert hdr < SLOW_FRACTION["rdma"] * 25.0
    # nccl-tests#232: one H100 per node on 400G (50 GB/s): 41.31 GB/s at 32 MB, healthy.
    ndr = parse_nccl_tests(log("nccl-tests-allreduce-2x1-h100-nccltests232.txt"))[-1].busbw
    assert ndr >= SLOW_FRACTION["rdma"] * 50.0
    # nccl-tests#119: the maintainer's target 96 GB/s for 4 x 200G (100 GB/s), reached.
    a100 = parse_nccl_tests(log("nccl-tests-allreduce-2x8-a100-nccltests119.txt"))[0].busbw
    assert a100 >= SLOW_FRACTION["rdma"] * 100.0


def test_error_line_takes_nccls_last_error_line():
    line = error_line(log("torch-nccl-error-hkproj1.txt"))
    assert line == ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                    "ProcessGroupNCCL.cpp:1333: socketStartConnect: Connect to 192.168.19.14<52822> failed : No route to host")
    assert addresses(line) == ["192.168.19.14"]
