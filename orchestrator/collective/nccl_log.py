"""What NCCL says about its network (``NCCL_DEBUG=INFO`` lines) and nccl-tests' result tables,
and the bus-bandwidth formula both use. Pure: text in, values out.

The lines read (each test in tests/unit/test_collective_parse.py holds real ones, see
tests/data/collective/SOURCES.md):
- ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>``: the RDMA devices
  NCCL found (device, port, link layer IB or RoCE, SHARP);
- ``NET/IB : No device found.``: no usable RDMA device, so NCCL falls back to sockets;
- ``NET/Socket : Using [0]eth0:10.0.0.1<0>``: the socket devices;
- ``Using network IB|IBext|IBext_v8|Socket|...``: the transport NCCL picked (NCCL 2.6 and later);
- ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0``: a channel between nodes and the device
  index it uses (``NET/<transport>/<index>``, with plugin names such as ``IBext_v8``);
- ``NCCL WARN ...``: NCCL's own error lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# "NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>"
_NET_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(?P<devs>.*?)(?:\s*;\s*OOB\s+(?P<oob>\S*))?\s*$")
_IB_DEV = re.compile(r"\[(?P<i>\d+)\](?P<dev>[\w.\-]+):(?P<port>\d+)/(?P<layer>IB|RoCE)(?P<sharp>/SHARP)?")
# "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]virbr0:<0>" (old NCCL: "[0]enp41s0f1:<0>")
_NET_SOCKET_USING = re.compile(r"NET/Socket\s*:\s*Using\s+(?P<devs>.*)$")
_SOCKET_DEV = re.compile(r"\[(?P<i>\d+)\](?P<ifname>[^\s:\[\]]+):(?P<addr>[^<\s]*)<")
_NO_IB = re.compile(r"NET/IB\s*:\s*No device found")
_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\S+)")
_CHANNEL_NET = re.compile(r"via NET/(?P<net>[^/\s]+(?: [^/\s]+)?)/(?P<dev>\d+)")
_WARN = re.compile(r"NCCL WARN (?P<text>.+?)\s*$")
_VERSION = re.compile(r"NCCL version (?P<v>[\d.]+)")


def transport_kind(net: str) -> str:
    """"rdma" for NCCL's IB transport (InfiniBand and RoCE, also through the IBext plugins),
    "socket" for TCP sockets, "other" for anything else (e.g. AWS Libfabric)."""
    if net.startswith("IB"):
        return "rdma"
    if net == "Socket":
        return "socket"
    return "other"


@dataclass(frozen=True)
class IbDevice:
    index: int
    device: str
    port: int
    link_layer: str  # "IB" or "RoCE"
    sharp: bool = False


@dataclass(frozen=True)
class SocketDevice:
    index: int
    interface: str
    address: str | None


@dataclass(frozen=True)
class NcclNetwork:
    """What one node's NCCL log says about its network."""

    version: str | None = None
    ib_devices: tuple[IbDevice, ...] = ()
    socket_devices: tuple[SocketDevice, ...] = ()
    no_ib_device: bool = False
    networks: tuple[str, ...] = ()  # "Using network X", in order, deduplicated
    channels: tuple[tuple[str, int], ...] = ()  # (transport, device index) of NET channels, deduplicated
    warnings: tuple[str, ...] = field(default_factory=tuple)
    evidence: tuple[str, ...] = ()  # the lines the transport was read from

    @property
    def transport(self) -> str | None:
        """The transport between nodes: from the channels when there are any (what was really
        used), else from "Using network", else None (NCCL said nothing about it)."""
        if self.channels:
            kinds = {transport_kind(net) for net, _ in self.channels}
            return "socket" if "socket" in kinds else sorted(kinds)[0]
        if self.networks:
            return transport_kind(self.networks[-1])
        if self.ib_devices:  # NCCL before 2.6 printed no "Using network": the devices it took
            return "rdma"
        if self.no_ib_device and self.socket_devices:
            return "socket"
        return None

    def used_ib_devices(self) -> list[IbDevice]:
        """The RDMA devices the channels went through (all listed ones when no channel line)."""
        used = {i for net, i in self.channels if transport_kind(net) == "rdma"}
        return [d for d in self.ib_devices if not used or d.index in used]

    def used_socket_devices(self) -> list[SocketDevice]:
        used = {i for net, i in self.channels if transport_kind(net) == "socket"}
        return [d for d in self.socket_devices if not used or d.index in used]

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "transport": self.transport,
            "networks": list(self.networks),
            "ib_devices": [f"{d.device}:{d.port}/{d.link_layer}" for d in self.ib_devices],
            "socket_devices": [f"{d.interface}:{d.address or ''}" for d in self.socket_devices],
            "no_ib_device": self.no_ib_device,
            "evidence": list(self.evidence[:4]),
        }


def parse_nccl_log(text: str) -> NcclNetwork:
    """Read the NET lines of one node's NCCL INFO log (other lines are ignored)."""
    ib: dict[int, IbDevice] = {}
    sock: dict[int, SocketDevice] = {}
    networks: list[str] = []
    channels: list[tuple[str, int]] = []
    warnings: list[str] = []
    evidence: list[str] = []
    no_ib = False
    version = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if version is None and (m := _VERSION.search(line)):
            version = m.group("v")
        if m := _NET_IB_USING.search(line):
            for d in _IB_DEV.finditer(m.group("devs")):
                i = int(d.group("i"))
                ib.setdefault(i, IbDevice(i, d.group("dev"), int(d.group("port")), d.group("layer"), bool(d.group("sharp"))))
            evidence.append(line)
        elif m := _NET_SOCKET_USING.search(line):
            for d in _SOCKET_DEV.finditer(m.group("devs")):
                i = int(d.group("i"))
                sock.setdefault(i, SocketDevice(i, d.group("ifname"), d.group("addr") or None))
            evidence.append(line)
        elif _NO_IB.search(line):
            no_ib = True
            evidence.append(line)
        elif m := _USING_NETWORK.search(line):
            if m.group("net") not in networks:
                networks.append(m.group("net"))
            evidence.append(line)
        elif m := _CHANNEL_NET.search(line):
            key = (m.group("net"), int(m.group("dev")))
            if key not in channels:
                channels.append(key)
                evidence.append(line)
        elif m := _WARN.search(line):
            warnings.append(m.group("text"))
    return NcclNetwork(
        version=version,
        ib_devices=tuple(ib[i] for i in sorted(ib)),
        socket_devices=tuple(sock[i] for i in sorted(sock)),
        no_ib_device=no_ib,
        networks=tuple(networks),
        channels=tuple(channels),
        warnings=tuple(warnings),
        evidence=tuple(evidence),
    )


# ------------------------------------------------------------------------------ bandwidth


def alg_bandwidth(size_bytes: int, seconds: float) -> float:
    """nccl-tests' algbw in GB/s (10^9 bytes): size / time (doc/PERFORMANCE.md)."""
    return size_bytes / seconds / 1e9


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' busbw of an all-reduce in GB/s: algbw * 2(n-1)/n (doc/PERFORMANCE.md). It can
    be compared with the bandwidth of each rank's link whatever the number of ranks."""
    return alg_bandwidth(size_bytes, seconds) * 2 * (ranks - 1) / ranks


def alltoall_bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' busbw of an all-to-all in GB/s: algbw * (n-1)/n, ``size_bytes`` being what one
    rank sends in all (its own chunk included): 1/n of it stays local, (n-1)/n crosses its link
    (nccl-tests#130, sjeaugey). For a pair that is half the buffer each way."""
    return alg_bandwidth(size_bytes, seconds) * (ranks - 1) / ranks


@dataclass(frozen=True)
class NcclTestsRow:
    size: int
    count: int
    dtype: str
    time_us: float  # out-of-place
    algbw: float
    busbw: float
    in_place_time_us: float | None = None
    in_place_algbw: float | None = None
    in_place_busbw: float | None = None


_F = r"\d+(?:\.\d+)?"
# size count type [redop] [root] time algbw busbw #wrong|error [time algbw busbw #wrong|error]
_ROW = re.compile(
    rf"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)(?:\s+(?P<redop>[a-z]+))?(?:\s+(?P<root>-?\d+))?"
    rf"\s+(?P<t>{_F})\s+(?P<alg>{_F})\s+(?P<bus>{_F})\s+\S+"
    rf"(?:\s+(?P<t2>{_F})\s+(?P<alg2>{_F})\s+(?P<bus2>{_F})\s+\S+)?\s*$"
)


def parse_nccl_tests(text: str) -> list[NcclTestsRow]:
    """The result rows of an nccl-tests run (all_reduce_perf and the like); comment and log lines
    are skipped."""
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = _ROW.match(line)
        if not m:
            continue
        rows.append(
            NcclTestsRow(
                size=int(m.group("size")),
                count=int(m.group("count")),
                dtype=m.group("type"),
                time_us=float(m.group("t")),
                algbw=float(m.group("alg")),
                busbw=float(m.group("bus")),
                in_place_time_us=float(m.group("t2")) if m.group("t2") else None,
                in_place_algbw=float(m.group("alg2")) if m.group("alg2") else None,
                in_place_busbw=float(m.group("bus2")) if m.group("bus2") else None,
            )
        )
    return rows
