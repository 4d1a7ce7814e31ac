"""nvidia-smi: the argv orch runs and pure parsers of what real drivers print, 450 to 610.

No I/O. Tested on captures of real drivers (``tests/data/probes/SOURCES.md``). What varies:
- ``topo -m``: tabs or spaces (pastes), the header row wrapped in ANSI underline escapes
  (``ESC[4m ... ESC[0m``, printed even into pipes), NIC columns named ``NIC#`` or ``mlx5_#``,
  empty affinity cells, header tokens glued together by a paste (``NIC11NIC12``).
- the banner: ``Driver Version:`` / ``CUDA Version:``, or ``KMD Version:`` / ``CUDA UMD
  Version:`` from driver 610; ``CUDA Version: N/A`` (a container without the CUDA user library)
  still names the driver; ``-q`` and ``--version`` spell the same labels with `` : ``.
- ``--query-gpu``: a driver refuses the whole query (exit 2, ``Field "compute_cap" is not a
  valid field to query.``) when one field is newer than it; ``--help-query-gpu`` lists the
  fields it knows.
A parser that cannot read its input raises ``ProbeParseError`` naming the line and what it
expected there.
"""

from __future__ import annotations

import re

from orchestrator.nodes.facts import GpuInfo, TopologyInfo
from orchestrator.nodes.parse_error import ProbeParseError

# Fields orch asks for, in this order. compute_cap is newer than driver 470 (see smi_fields).
GPU_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "memory.total",
    "driver_version",
    "uuid",
    "pci.bus_id",
    "mig.mode.current",
    "compute_cap",
)

# nvidia-smi writes these where a value does not exist on this GPU or driver.
_NA = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", ""}

# SGR escapes (ESC[4m underline, ESC[0m reset); a paste often loses the ESC byte and keeps "[4m".
_ANSI = re.compile(r"\x1b?\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --------------------------------------------------------------------------------------------
# --query-gpu, and finding the fields a driver knows
# --------------------------------------------------------------------------------------------


def gpu_query_argv(fields: tuple[str, ...] = GPU_FIELDS) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def help_query_gpu_argv() -> list[str]:
    return ["nvidia-smi", "--help-query-gpu"]


def parse_help_query_gpu(text: str) -> frozenset[str]:
    """Every field name (aliases included) that ``nvidia-smi --help-query-gpu`` lists: lines such
    as ``"name" or "gpu_name"`` that start with a quoted name."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([^"]+)"', line))
    if not names:
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        raise ProbeParseError("nvidia-smi --help-query-gpu", 'lines that start with a quoted field name such as "name"', 1, first)
    return frozenset(names)


def supported_fields(wanted: tuple[str, ...], known: frozenset[str]) -> tuple[str, ...]:
    """``wanted`` without the fields this driver does not know, in the same order."""
    return tuple(f for f in wanted if f in known)


def invalid_query_field(output: str) -> str | None:
    """The field nvidia-smi refused (``Field "compute_cap" is not a valid field to query.``)."""
    m = re.search(r'Field "([^"]+)" is not a valid field to query', output)
    return m.group(1) if m else None


def _value(raw: str) -> str | None:
    v = raw.strip()
    return None if v.lower() in _NA else v


def _int_or_none(raw: str | None) -> int | None:
    if raw is None:
        return None
    m = re.match(r"^\s*(\d+)", raw)  # tolerate " MiB" when someone forgot nounits
    return int(m.group(1)) if m else None


def parse_gpu_query(text: str, fields: tuple[str, ...] = GPU_FIELDS) -> list[GpuInfo]:
    """Parse ``--format=csv,noheader,nounits`` output of ``--query-gpu=<fields>``.

    Values are comma-separated (GPU names hold no commas); ``[N/A]`` and ``[Not Supported]``
    become None. A header line (``--format=csv`` without noheader) is recognised and skipped.
    """
    gpus: list[GpuInfo] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if cells and cells[0].split(" [")[0] == fields[0]:
            continue  # header line
        if len(cells) != len(fields):
            raise ProbeParseError(
                "nvidia-smi --query-gpu", f"{len(fields)} comma-separated values ({', '.join(fields)})", lineno, line,
                found=f"{len(cells)} values",
            )
        row = {f: _value(c) for f, c in zip(fields, cells)}
        index = _int_or_none(row.get("index"))
        gpus.append(
            GpuInfo(
                index=index if index is not None else len(gpus),
                name=row.get("name") or row.get("gpu_name") or "unknown",
                memory_total_mib=_int_or_none(row.get("memory.total")),
                driver_version=row.get("driver_version"),
                uuid=row.get("uuid") or row.get("gpu_uuid"),
                pci_bus_id=row.get("pci.bus_id") or row.get("gpu_bus_id"),
                mig_mode=row.get("mig.mode.current"),
                compute_cap=row.get("compute_cap"),
            )
        )
    return gpus


# --------------------------------------------------------------------------------------------
# The banner: driver and CUDA version
# --------------------------------------------------------------------------------------------


def smi_banner_argv() -> list[str]:
    return ["nvidia-smi"]


_VERSION = r"\s*:\s*\**\s*(\d+(?:\.\d+)+)"
_KMD = re.compile(r"\bKMD Version" + _VERSION, re.I)
_DRIVER = re.compile(r"\bDriver Version" + _VERSION, re.I)
_CUDA = re.compile(r"\bCUDA (?:UMD )?Version" + r"\s*:\s*(\d+(?:\.\d+)*)\b", re.I)


def parse_smi_banner(text: str) -> tuple[str | None, str | None]:
    """(driver_version, cuda_version) from the header box of plain ``nvidia-smi``, the head of
    ``nvidia-smi -q`` or ``nvidia-smi --version``. The driver is the kernel module's version
    (``KMD Version`` from driver 610 on, else ``Driver Version``; never the ``NVIDIA-SMI``
    tool's own version). CUDA is the highest version the driver supports; ``N/A`` (no CUDA user
    library in a container), ``Not Found`` and absence give None without losing the driver."""
    clean = strip_ansi(text).replace("**", "")
    kmd = _KMD.search(clean)
    driver = kmd or _DRIVER.search(clean)
    cuda = _CUDA.search(clean)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


# --------------------------------------------------------------------------------------------
# topo -m
# --------------------------------------------------------------------------------------------


def topo_argv() -> list[str]:
    return ["nvidia-smi", "topo", "-m"]


_LINK = re.compile(r"^(X|NV\d+|NODE|SYS|PHB|PXB|PIX|SOC|MPB|SPB)$")
# Device columns of the header: GPU#, NIC#, or a NIC named directly (mlx5_0, mlx5_bond_0).
_DEVICE = re.compile(r"GPU\d+|NIC\d+|[A-Za-z][A-Za-z0-9]*_\w+")
_AFTER_DEVICES = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")
_TOPO = "nvidia-smi topo -m"


def parse_topo(text: str) -> TopologyInfo:
    """Parse ``nvidia-smi topo -m``: the GPU x GPU link matrix, NIC columns and the NIC legend.

    Works with tab or space separation, ANSI escapes around the header, trailing ``CPU
    Affinity``/``NUMA Affinity``/``GPU NUMA ID`` columns (empty or ``N/A``), NIC rows, and the
    legend (``NIC0: mlx5_0``). Raises ProbeParseError naming the line and what was expected.
    """
    lines = [strip_ansi(ln) for ln in text.splitlines()]  # splitlines() ends lines at \r and \r\n too
    header_idx = next((i for i, ln in enumerate(lines) if re.match(r"^\s*GPU0(?!\d)", ln)), None)
    if header_idx is None:
        first = next(((i, ln) for i, ln in enumerate(lines, 1) if ln.strip()), (1, ""))
        raise ProbeParseError(_TOPO, "a header row of device columns starting with GPU0 (no such line in the output)", *first)
    header_no = header_idx + 1
    devices = _DEVICE.findall(_AFTER_DEVICES.split(lines[header_idx])[0])
    gpu_cols = [d for d in devices if re.fullmatch(r"GPU\d+", d)]
    nic_cols = [d for d in devices if d not in gpu_cols]
    if gpu_cols != [f"GPU{i}" for i in range(len(gpu_cols))]:
        raise ProbeParseError(_TOPO, "GPU columns numbered GPU0, GPU1, ... in order", header_no, lines[header_idx])
    rows: dict[str, tuple[int, list[str]]] = {}
    last_no = header_no
    for no, ln in enumerate(lines[header_idx + 1 :], header_no + 1):
        if not ln.strip() or ln.strip().startswith("Legend"):
            break
        last_no = no
        toks = ln.split()
        if toks[0] in devices:
            rows[toks[0]] = (no, toks[1:])
    missing = [g for g in gpu_cols if g not in rows]
    if missing:
        raise ProbeParseError(
            _TOPO, f"one row per GPU column; no row for {', '.join(missing)} (the matrix ends at line {last_no})",
            last_no, lines[last_no - 1],
        )  # fmt: skip
    links: list[tuple[str, ...]] = []
    n = len(gpu_cols)
    for i, g in enumerate(gpu_cols):
        no, cells = rows[g]
        if len(cells) < n:
            raise ProbeParseError(_TOPO, f"{n} link cells (one per GPU)", no, lines[no - 1], found=f"row {g} has {len(cells)} cells")
        row = tuple(cells[:n])
        for j, c in enumerate(row):
            if not _LINK.match(c) or (c == "X") != (i == j):
                want = "X (the GPU itself)" if i == j else "a link kind (NV#, PIX, PXB, PHB, NODE, SYS)"
                raise ProbeParseError(_TOPO, f"{want} in column {gpu_cols[j]}", no, lines[no - 1], found=f"row {g} has {c!r}")
        links.append(row)
    nic_names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", "\n".join(lines), re.M))
    nvlink: bool | None = None
    if n >= 2:
        nvlink = all(links[i][j].startswith("NV") for i in range(n) for j in range(n) if i != j)
    return TopologyInfo(gpus=tuple(gpu_cols), links=tuple(links), nics=tuple(nic_cols), nic_names=nic_names, nvlink=nvlink)
