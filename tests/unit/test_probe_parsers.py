"""Probe parsers (nodes/probes.py) field by field on real captured output
(tests/data/probes/SOURCES.md), and the argv of each probe as its tool documents it, so that a
parser that drops or misreads one field fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.nodes import probes
from orchestrator.nodes.facts import IbPort, NicAddress, NicInfo
from orchestrator.nodes.probes import ProbeParseError

DATA = Path(__file__).resolve().parent.parent / "data" / "probes"


def read(name: str) -> str:
    return (DATA / name).read_text()


# ---- ip -j addr ----


def test_ip_addr_of_a_test_host_field_by_field():
    nics = probes.parse_ip_addr(read("ip_j_addr_testhost_eth0_ib0.json"))
    assert nics == [
        NicInfo(name="lo", state="unknown", mtu=65536, kind="loopback", flags=("LOOPBACK", "UP", "LOWER_UP"),
                addresses=(NicAddress("inet", "127.0.0.1", 8, "host"), NicAddress("inet6", "::1", 128, "host"))),
        NicInfo(name="eth0", state="up", mtu=1500, kind="ethernet", flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"),
                addresses=(NicAddress("inet", "10.144.250.11", 24, "global"),
                           NicAddress("inet6", "fe80::cce5:4cff:fe06:dfb8", 64, "link"))),
        NicInfo(name="ib0", state="up", mtu=1500, kind="ethernet", flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"),
                addresses=(NicAddress("inet", "10.144.251.11", 24, "global"),
                           NicAddress("inet6", "fe80::e4f8:5cff:fe7c:846", 64, "link"))),
    ]  # fmt: skip


def test_ip_addr_keeps_only_ip_addresses_and_skips_half_known_links():
    # iproute2 prints `{}` for a link it cannot describe and other address families (e.g.
    # "link" for a CAN/bridge address) in addr_info; neither is an IP address of a NIC.
    data = json.loads(read("ip_j_addr_testhost_eth0_ib0.json"))
    data[1]["addr_info"].append({"family": "link", "local": "ce:e5:4c:06:df:b8"})
    data[1]["addr_info"].append({"family": "inet", "prefixlen": 24})  # no address
    data.insert(1, {})
    del data[3]["addr_info"]  # ib0 listed without its addresses
    nics = probes.parse_ip_addr(json.dumps(data))
    assert [n.name for n in nics] == ["lo", "eth0", "ib0"]
    assert [a.cidr for a in nics[1].addresses] == ["10.144.250.11/24", "fe80::cce5:4cff:fe06:dfb8/64"]
    assert nics[2].addresses == ()


def test_ip_addr_link_types_are_named():
    data = json.loads(read("ip_j_addr_testhost_eth0_ib0.json"))
    data[2]["link_type"] = "infiniband"  # what IPoIB reports
    data[1]["link_type"] = "none"  # a tun device
    del data[0]["link_type"]
    del data[0]["operstate"]
    kinds = [(n.name, n.kind, n.state) for n in probes.parse_ip_addr(json.dumps(data))]
    assert kinds == [("lo", "unknown", "unknown"), ("eth0", "none", "up"), ("ib0", "infiniband", "up")]


@pytest.mark.parametrize(("text", "message"), [
    ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536", r"^ip -j addr: not JSON \(Extra data: line 1 column 2"),
    ('{"ifname": "eth0"}', r"^ip -j addr: expected a JSON list$"),
])  # fmt: skip
def test_ip_addr_that_is_not_the_json_list_says_so(text, message):
    with pytest.raises(ProbeParseError, match=message):
        probes.parse_ip_addr(text)


# ---- ibstat and /sys/class/infiniband ----


def test_ibstat_reads_every_port_of_every_ca_field_by_field():
    assert probes.parse_ibstat(read("ibstat_ib_two_ports_rdmacore_847.txt")) == [
        IbPort(
            device="mlx4_0", port=1, state="Down", physical_state="Disabled", rate_gbps=10.0, link_layer="InfiniBand"
        ),
        IbPort(device="mlx4_0", port=2, state="Active", physical_state="LinkUp", rate_gbps=56.0, link_layer=None),
    ]


def test_ibstat_without_a_ca_is_no_port():
    assert probes.parse_ibstat("") == []
    assert (
        probes.parse_ibstat("ibpanic: [12345] main: stat of IB device 'mlx5_9' failed: No such file or directory\n")
        == []
    )


def test_ib_sysfs_reads_codes_rates_and_link_layers():
    text = json.dumps({
        "mlx5_1": {"1": {"state": "1: DOWN", "phys_state": "3: Disabled", "rate": "10 Gb/sec (4X SDR)", "link_layer": "InfiniBand"}},
        "mlx5_0": {"2": {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "100 Gb/sec (4X EDR)", "link_layer": "Ethernet"},
                   "1": {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "25.78125 Gb/sec (1X EDR)"}},
    })  # fmt: skip
    assert probes.parse_ib_sysfs(text) == [
        IbPort(device="mlx5_0", port=1, state="Active", physical_state="LinkUp", rate_gbps=25.78125, link_layer=None),
        IbPort(
            device="mlx5_0", port=2, state="Active", physical_state="LinkUp", rate_gbps=100.0, link_layer="Ethernet"
        ),
        IbPort(
            device="mlx5_1", port=1, state="Down", physical_state="Disabled", rate_gbps=10.0, link_layer="InfiniBand"
        ),
    ]


def test_ib_sysfs_without_values_keeps_the_port_unknown():
    (port,) = probes.parse_ib_sysfs(json.dumps({"mlx5_0": {"1": {}}}))
    assert port == IbPort(
        device="mlx5_0", port=1, state="unknown", physical_state=None, rate_gbps=None, link_layer=None
    )


def test_ib_sysfs_that_is_not_json_says_so():
    with pytest.raises(ProbeParseError, match=r"^infiniband sysfs: not JSON \("):
        probes.parse_ib_sysfs("Traceback (most recent call last):")


# ---- the JSON the probe scripts print last ----


def test_the_last_json_object_wins_over_noise_and_earlier_objects():
    text = 'sitecustomize: hello\n{"python": "3.10.0"}\n[1, 2]\n  {"python": "3.11.2", "ray": "2.60.0"}  \nbye\n'
    v = probes.parse_versions(text)
    assert (v.python, v.ray) == ("3.11.2", "2.60.0")


def test_a_broken_json_line_says_which_probe():
    with pytest.raises(ProbeParseError, match=r"^storage: bad JSON \("):
        probes.parse_storage('{"shm_bytes": 1,\n')
    with pytest.raises(ProbeParseError, match=r"^connect: no JSON object in output$"):
        probes.parse_connect("[]\n")


def test_versions_every_field():
    v = probes.parse_versions(
        json.dumps(
            {
                "python": "3.11.2",
                "ray": "2.60.0",
                "vllm": "0.29.0",
                "torch": "2.8.0",
                "nccl": "2.27.3",
                "vllm_dist": "vllm",
                "transformers": "4.57.1",
            }
        )
    )
    assert (v.python, v.ray, v.vllm, v.torch, v.nccl, v.vllm_dist, v.transformers) == (
        "3.11.2", "2.60.0", "0.29.0", "2.8.0", "2.27.3", "vllm", "4.57.1")  # fmt: skip


def test_storage_fields_in_order():
    text = json.dumps(
        {"shm_bytes": 68719476736, "disk_free_bytes": 81289609216, "disk_path": "/models", "shm_error": None}
    )
    assert probes.parse_storage(text) == (68719476736, 81289609216, "/models", None)
    assert probes.parse_storage('{"shm_error": "FileNotFoundError: /dev/shm"}') == (
        None,
        None,
        None,
        "FileNotFoundError: /dev/shm",
    )


def test_model_fields():
    info = probes.parse_model(json.dumps({
        "path": "/models/llama", "exists": 1, "config_sha256": "a" * 64, "index_sha256": "b" * 64,
        "index_kind": "safetensors-index", "total_bytes": 16, "file_count": 3, "content_sha256": "c" * 64,
    }))  # fmt: skip
    assert (info.path, info.exists, info.config_sha256, info.index_sha256, info.index_kind, info.total_bytes,
            info.file_count, info.content_sha256) == (
        "/models/llama", True, "a" * 64, "b" * 64, "safetensors-index", 16, 3, "c" * 64)  # fmt: skip
    missing = probes.parse_model('{"path": "/models/none"}')
    assert (missing.exists, missing.content_sha256, missing.total_bytes) == (False, None, None)


# ---- df, date, TCP reachability ----


def test_df_takes_the_last_number_under_the_header():
    assert probes.parse_df_avail("      Avail\n81289609216\n") == 81289609216
    assert probes.parse_df_avail("Avail\n12\n  34  \n") == 34
    with pytest.raises(ProbeParseError, match=r"^df: no number in 'df: /nope: No such file or directory\\n'$"):
        probes.parse_df_avail("df: /nope: No such file or directory\n")


def test_clock_reading_and_offset():
    assert probes.parse_clock("1764612345.123456789\n") == pytest.approx(1764612345.123456789)
    assert probes.parse_clock("1764612345") == 1764612345.0
    with pytest.raises(ProbeParseError, match=r"^date \+%s\.%N: unexpected '1764612345\.%N'$"):
        probes.parse_clock("1764612345.%N\n")  # busybox date has no %N
    # the node answered 1000.5 while the round trip ran from 990.0 to 992.0: its clock is 9.5 s ahead
    assert probes.clock_offset(1000.5, 990.0, 992.0) == 9.5


def test_connect_report():
    assert probes.parse_connect('{"ok": true, "error": null}') == (True, None)
    assert probes.parse_connect('{"ok": false, "error": "timeout"}') == (False, "timeout")
    assert probes.parse_connect("{}") == (False, None)


@pytest.mark.parametrize(("connect", "listener", "verdict"), [
    ((True, None), None, True),
    ((False, "timeout"), {"bound": True}, False),  # a DROP rule
    ((False, "no route"), None, False),
    ((False, "refused"), {"bound": True, "in_use": False}, False),  # a REJECT rule: our listener held the port
    ((False, "refused"), {"bound": False, "in_use": True}, False),  # something else listened there
    ((False, "refused"), {"bound": False, "in_use": False}, None),  # nothing listened: proves nothing
    ((False, "refused"), {}, None),
    ((False, "refused"), None, None),
])  # fmt: skip
def test_reach_verdict(connect, listener, verdict):
    assert probes.reach_verdict(connect, listener) is verdict


def test_argv_of_each_probe():
    assert probes.ibstat_argv() == ["ibstat"]
    assert probes.df_argv("/models") == ["df", "-B1", "--output=avail", "/models"]  # df(1): bytes, the avail column
    assert probes.clock_argv() == ["date", "+%s.%N"]  # date(1): seconds and nanoseconds since the epoch
    py = "/opt/venv/bin/python"
    assert probes.ib_sysfs_argv(py)[:2] == [py, "-c"] and probes.ib_sysfs_argv(py)[3:] == ["/sys/class/infiniband"]
    assert probes.storage_argv(py, "/models")[3:] == ["/dev/shm", "/models"]
    assert probes.versions_argv(py)[:2] == [py, "-c"] and len(probes.versions_argv(py)) == 3
    assert probes.model_argv(py, "/models/x")[3:] == ["fingerprint", "/models/x"]
    assert probes.connect_argv(py, "10.0.0.1", 6379, 6.0, 2.0)[3:] == ["10.0.0.1", "6379", "6.0", "2.0"]
    assert probes.listen_argv(py, "10.0.0.1", 6379, 30.0, 2)[3:] == ["10.0.0.1", "6379", "30.0", "2"]


def test_ip_addr_without_flags_or_prefix():
    # older iproute2 JSON may omit "flags"; an address without a prefix length is a host address (/32)
    data = json.loads(read("ip_j_addr_testhost_eth0_ib0.json"))
    del data[1]["flags"]
    del data[1]["addr_info"][0]["prefixlen"]
    eth0 = probes.parse_ip_addr(json.dumps(data))[1]
    assert eth0.flags == () and eth0.addresses[0].cidr == "10.144.250.11/32"


def test_ib_sysfs_ports_sort_by_number_and_keep_a_state_without_code():
    text = json.dumps({"mlx5_0": {"10": {"state": "Active"}, "2": {"state": "4: ACTIVE"}, "x": {"state": "DOWN"}}})
    assert [(p.port, p.state) for p in probes.parse_ib_sysfs(text)] == [(0, "Down"), (2, "Active"), (10, "Active")]


@pytest.mark.parametrize(("parse", "label"), [
    (probes.parse_versions, "versions"),
    (probes.parse_storage, "storage"),
    (probes.parse_model, "model path"),
    (probes.parse_connect, "connect"),
    (probes.parse_listen, "listen"),
])  # fmt: skip
def test_each_script_parser_names_its_probe_when_there_is_no_json(parse, label):
    with pytest.raises(ProbeParseError, match=rf"^{label}: no JSON object in output$"):
        parse("Traceback (most recent call last):\n")


def test_ibstat_port_lines_before_any_ca_are_ignored_and_a_port_without_state_is_unknown():
    # the tail of a paste that lost its `CA '...'` line, then a CA cut right after its port header
    text = "Port 1:\n\t\tState: Active\n\t\tRate: 100\nCA 'mlx5_3'\n\tPort 1:\n\t\tRate: 200\n"
    assert probes.parse_ibstat(text) == [IbPort(device="mlx5_3", port=1, state="unknown", rate_gbps=200.0)]


def test_ib_sysfs_port_names_that_are_not_numbers_sort_first():
    text = json.dumps({"mlx5_0": {"1": {"state": "4: ACTIVE"}, "p": {"state": "1: DOWN"}}})
    assert [(p.port, p.state) for p in probes.parse_ib_sysfs(text)] == [(0, "Down"), (1, "Active")]
