"""Probes: the argv orch runs on a node to learn its facts, and pure parsers of their output.

No I/O here: functions build argv lists (never shell strings) and parse text that a runner
brought back. Machine-readable output where the tool has it (``nvidia-smi --query-gpu`` CSV,
``ip -j addr``, JSON printed by small ``python -c`` scripts); where it has not (``nvidia-smi
topo -m``, the ``nvidia-smi`` banner, ``ibstat``) the parsers are tested on real captured output
(``tests/data/probes/SOURCES.md``). The ``python -c`` programs are modules of
``orchestrator.remote.node_programs``. Parsers raise ``ProbeParseError`` on output they cannot read.
nvidia-smi's own argv and parsers are in ``orchestrator.nodes.smi`` and re-exported here.
"""

from __future__ import annotations

import json
import re

from orchestrator.nodes.facts import IbPort, ModelPathInfo, NicAddress, NicInfo, Versions
from orchestrator.nodes.parse_error import ProbeParseError
from orchestrator.nodes.smi import (
    GPU_FIELDS,
    gpu_query_argv,
    help_query_gpu_argv,
    invalid_query_field,
    parse_gpu_query,
    parse_help_query_gpu,
    parse_smi_banner,
    parse_topo,
    smi_banner_argv,
    strip_ansi,
    supported_fields,
    topo_argv,
)
from orchestrator.remote.node_programs import python_argv

# Re-exported: nvidia-smi's argv and parsers (orchestrator.nodes.smi) are part of this module's API.
__all__ = [
    "GPU_FIELDS", "ProbeParseError", "gpu_query_argv", "help_query_gpu_argv", "invalid_query_field", "parse_gpu_query",
    "parse_help_query_gpu", "parse_smi_banner", "parse_topo", "smi_banner_argv", "strip_ansi", "supported_fields", "topo_argv",
]  # fmt: skip

# Exit status of a shell (and of orch's runners) when the command does not exist.
COMMAND_NOT_FOUND = 127


# --------------------------------------------------------------------------------------------
# Network interfaces: ip -j addr
# --------------------------------------------------------------------------------------------


def ip_addr_argv() -> list[str]:
    return ["ip", "-j", "addr"]


_KINDS = {"ether": "ethernet", "infiniband": "infiniband", "loopback": "loopback"}


def parse_ip_addr(text: str) -> list[NicInfo]:
    """Parse ``ip -j addr``: name, operstate, MTU, addresses with prefix, link type."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeParseError(f"ip -j addr: not JSON ({exc})") from exc
    if not isinstance(data, list):
        raise ProbeParseError("ip -j addr: expected a JSON list")
    nics = []
    for link in data:
        if not isinstance(link, dict) or "ifname" not in link:
            continue  # iproute2 prints {} for links it only half-knows
        addrs = tuple(
            NicAddress(family=a["family"], address=a["local"], prefixlen=int(a.get("prefixlen", 32)), scope=a.get("scope"))
            for a in link.get("addr_info", [])
            if a.get("family") in ("inet", "inet6") and "local" in a
        )
        nics.append(
            NicInfo(
                name=link["ifname"],
                state=str(link.get("operstate", "UNKNOWN")).lower(),
                mtu=link.get("mtu"),
                addresses=addrs,
                kind=_KINDS.get(link.get("link_type", ""), link.get("link_type", "unknown")),
                flags=tuple(link.get("flags", [])),
            )
        )
    return nics


# --------------------------------------------------------------------------------------------
# InfiniBand / RoCE: ibstat text, or /sys/class/infiniband read by a small script
# --------------------------------------------------------------------------------------------


def ibstat_argv() -> list[str]:
    return ["ibstat"]


def parse_ibstat(text: str) -> list[IbPort]:
    """Parse ``ibstat``: one IbPort per ``CA 'mlx5_0'`` / ``Port N:`` block."""
    ports: list[IbPort] = []
    device: str | None = None
    cur: dict[str, str] | None = None
    port_no = 0

    def flush() -> None:
        if device is not None and cur is not None:
            rate = cur.get("Rate")
            ports.append(
                IbPort(
                    device=device,
                    port=port_no,
                    state=cur.get("State", "unknown"),
                    physical_state=cur.get("Physical state"),
                    rate_gbps=float(rate) if rate and re.fullmatch(r"\d+(\.\d+)?", rate) else None,
                    link_layer=cur.get("Link layer"),
                )
            )

    for ln in text.splitlines():
        m = re.match(r"^CA '([^']+)'", ln.strip())
        if m:
            flush()
            device, cur = m.group(1), None
            continue
        m = re.match(r"^Port (\d+):\s*$", ln.strip())
        if m and device is not None:
            flush()
            port_no, cur = int(m.group(1)), {}
            continue
        if cur is not None and ":" in ln:
            key, _, val = ln.strip().partition(":")
            cur[key.strip()] = val.strip()
    flush()
    return ports


def ib_sysfs_argv(python: str, root: str = "/sys/class/infiniband") -> list[str]:
    return python_argv(python, "ib_sysfs", root)


def _strip_code(v: str | None) -> str | None:
    # sysfs writes "4: ACTIVE", "5: LinkUp"
    if v is None:
        return None
    return v.split(":", 1)[1].strip() if re.match(r"^\d+:", v) else v.strip()


def parse_ib_sysfs(text: str) -> list[IbPort]:
    """Parse the JSON of remote/node_programs/ib_sysfs.py ({device: {port: {state, phys_state, rate, link_layer}}})."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProbeParseError(f"infiniband sysfs: not JSON ({exc})") from exc
    ports = []
    for dev, dports in sorted(data.items()):
        for port, attrs in sorted(dports.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            state = _strip_code(attrs.get("state")) or "unknown"
            rate = attrs.get("rate") or ""
            m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate)
            ports.append(
                IbPort(
                    device=dev,
                    port=int(port) if port.isdigit() else 0,
                    state=state.capitalize() if state.isupper() else state,
                    physical_state=_strip_code(attrs.get("phys_state")),
                    rate_gbps=float(m.group(1)) if m else None,
                    link_layer=attrs.get("link_layer"),
                )
            )
    return ports


# --------------------------------------------------------------------------------------------
# Versions: one python -c printing JSON (importlib.metadata; torch imported only for NCCL)
# --------------------------------------------------------------------------------------------


def versions_argv(python: str) -> list[str]:
    return python_argv(python, "versions")


def parse_versions(text: str) -> Versions:
    data = _last_json_line(text, "versions")
    return Versions(
        python=data.get("python"),
        ray=data.get("ray"),
        vllm=data.get("vllm"),
        torch=data.get("torch"),
        nccl=data.get("nccl"),
        vllm_dist=data.get("vllm_dist"),
        transformers=data.get("transformers"),
        flashinfer=data.get("flashinfer"),
    )


def _last_json_line(text: str, what: str) -> dict:
    """The JSON object our scripts print last (anything a sitecustomize printed before is ignored)."""
    for ln in reversed(text.strip().splitlines()):
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                data = json.loads(ln)
            except json.JSONDecodeError as exc:
                raise ProbeParseError(f"{what}: bad JSON ({exc})") from exc
            if isinstance(data, dict):
                return data
    raise ProbeParseError(f"{what}: no JSON object in output")


# --------------------------------------------------------------------------------------------
# Storage: /dev/shm size and free bytes at the model store
# --------------------------------------------------------------------------------------------


def storage_argv(python: str, disk_path: str, shm_path: str = "/dev/shm") -> list[str]:
    """/dev/shm total size and free bytes (for an unprivileged user) at ``disk_path`` or its
    nearest existing parent."""
    return python_argv(python, "storage", shm_path, disk_path)


def parse_storage(text: str) -> tuple[int | None, int | None, str | None, str | None]:
    """(shm_bytes, disk_free_bytes, disk_path, shm_error)."""
    d = _last_json_line(text, "storage")
    return d.get("shm_bytes"), d.get("disk_free_bytes"), d.get("disk_path"), d.get("shm_error")


def df_argv(path: str) -> list[str]:
    return ["df", "-B1", "--output=avail", path]


def parse_df_avail(text: str) -> int:
    """``df -B1 --output=avail PATH``: the number under the ``Avail`` header."""
    nums = [ln.strip() for ln in text.splitlines() if ln.strip().isdigit()]
    if not nums:
        raise ProbeParseError(f"df: no number in {text!r}")
    return int(nums[-1])


# --------------------------------------------------------------------------------------------
# Model path fingerprint
# --------------------------------------------------------------------------------------------


def agent_argv(python: str, *args: str) -> list[str]:
    """The model-sync agent (``orchestrator/remote/node_programs/sync_agent.py``, stdlib only) run on a node."""
    return python_argv(python, "sync_agent", *args)


def model_argv(python: str, path: str) -> list[str]:
    """The model fingerprint: the sync agent's ``fingerprint`` mode (size and sha256 of every
    file, cached by stat), the same fingerprint `orch model sync` compares."""
    return agent_argv(python, "fingerprint", path)


def parse_model(text: str) -> ModelPathInfo:
    d = _last_json_line(text, "model path")
    return ModelPathInfo(
        path=d["path"],
        exists=bool(d.get("exists")),
        config_sha256=d.get("config_sha256"),
        index_sha256=d.get("index_sha256"),
        index_kind=d.get("index_kind"),
        total_bytes=d.get("total_bytes"),
        file_count=d.get("file_count"),
        content_sha256=d.get("content_sha256"),
    )


# --------------------------------------------------------------------------------------------
# Clock offset
# --------------------------------------------------------------------------------------------


def clock_argv() -> list[str]:
    return ["date", "+%s.%N"]


def parse_clock(text: str) -> float:
    s = text.strip()
    if not re.fullmatch(r"\d+(\.\d+)?", s):
        raise ProbeParseError(f"date +%s.%N: unexpected {s!r}")
    return float(s)


def clock_offset(remote_epoch: float, local_sent: float, local_received: float) -> float:
    """Node clock minus local clock, taking the remote reading at the midpoint of the round trip
    (error at most half the round trip)."""
    return remote_epoch - (local_sent + local_received) / 2.0


# --------------------------------------------------------------------------------------------
# Head port reachability (TCP, from each worker)
# --------------------------------------------------------------------------------------------


def connect_argv(python: str, host: str, port: int, deadline_s: float, per_try_s: float) -> list[str]:
    return python_argv(python, "head_connect", host, str(port), str(deadline_s), str(per_try_s))


def listen_argv(python: str, host: str, port: int, seconds: float, expect: int) -> list[str]:
    return python_argv(python, "head_listen", host, str(port), str(seconds), str(expect))


def parse_connect(text: str) -> tuple[bool, str | None]:
    d = _last_json_line(text, "connect")
    return bool(d.get("ok")), d.get("error")


def parse_listen(text: str) -> dict:
    """{bound, in_use, accepted, error}."""
    return _last_json_line(text, "listen")


def reach_verdict(connect: tuple[bool, str | None], listener: dict | None) -> bool | None:
    """Was the head's port reachable from a worker? ``connect`` is (connected, error) of the
    connect script, ``listener`` the head listener's report (None: no listener was run).

    Connected: True. A timeout or a routing error: False (a DROP rule, no route). "refused"
    while the port was held on the head (our listener bound it, or something already listened):
    False (a REJECT rule). "refused" with nothing listening proves nothing: None."""
    ok, err = connect
    if ok:
        return True
    if err == "refused":
        held = bool(listener and (listener.get("bound") or listener.get("in_use")))
        return False if held else None
    return False
