"""The collective check's values and how they are read from the jobs' output: a node's run, the
figures of one group (a pair of nodes or all of them; an all-reduce or an all-to-all), the
backend's own error line and the peer addresses it names, and the slow-link rule. Pure: no I/O.

``collective.verdict`` judges the all-reduce groups, ``collective.mesh`` the all-to-all between
every pair; both build on these.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.collective.nccl_log import NcclNetwork, alg_bandwidth, alltoall_bus_bandwidth, bus_bandwidth
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.findings import COLLECTIVE_SLOW, WARN, Finding, finding

Op = Literal["all-reduce", "all-to-all"]

REPORT_MARK = "ORCH-COLLECTIVE-REPORT "
# Bus bandwidth under this fraction of the link is COLLECTIVE_SLOW (docs/preflight.md). RDMA:
# NVIDIA expects 92-98% of the line rate (12 GB/s per 100G NIC, 24 per 200G, 46-48 per 400G), so
# under half is broken (wrong NIC, no GPUDirect, PCIe or ACS trouble). TCP (NCCL sockets, Gloo):
# a single stream is CPU-bound and reaches far less; only an order of magnitude below the link
# is flagged (traffic through a slower path, a congested or shaped link).
SLOW_FRACTION = {"rdma": 0.5, "tcp": 0.1}
_GENERIC = re.compile(r"timed out|timeout|Timed out|closed by remote|Connection reset|Connection closed", re.I)
_SPECIFIC = re.compile(r"No route to host|Connection refused|Unable to find address|remote=|Connect to|"
                       r"Network is unreachable|No such device|rendezvous|NCCL WARN|sees no CUDA|No module|"
                       r"completion from peer")  # fmt: skip
# Gloo's "remote=[A]:P", NCCL's "Connect to A<P>", torch's store "connect to (A, P)", NCCL's IB
# "Got completion from peer A<P>" and "Connection closed by remote peer A<P>".
_REMOTE = re.compile(r"remote=\[?(?P<a>[0-9a-fA-F.:]+?)\]?:\d+|Connect to (?P<b>[0-9a-fA-F.:]+?)<\d+>|"
                     r"connect to \((?P<c>[0-9a-fA-F.:]+), \d+\)|"
                     r"(?:completion from|closed by remote) peer (?P<d>[0-9a-fA-F.:]+?)<\d+>")  # fmt: skip


@dataclass(frozen=True)
class NodeRun:
    """What the job did on one node: its output, or the transport error that stopped orch."""

    node: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # orch could not run it there (unreachable, timed out)


@dataclass(frozen=True)
class SizeFigure:
    bytes: int
    seconds: float
    algbw: float  # GB/s
    busbw: float  # GB/s

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "time_us": round(self.seconds * 1e6, 1),
                "algbw_gbps": round(self.algbw, 3), "busbw_gbps": round(self.busbw, 3)}  # fmt: skip


@dataclass(frozen=True)
class GroupFigures:
    """One group (a pair of nodes, or all nodes) running one collective: ok, its timings and the
    link it ran on."""

    name: str
    nodes: tuple[str, ...]
    ok: bool
    sizes: tuple[SizeFigure, ...] = ()
    link_gbps: float | None = None  # GB/s of the slowest end's link, when known
    link_kind: str | None = None  # "rdma" | "tcp"
    error: str | None = None
    skipped: bool = False
    op: Op = "all-reduce"

    @property
    def latency_us(self) -> float | None:
        return self.sizes[0].seconds * 1e6 if self.sizes else None

    @property
    def busbw(self) -> float | None:
        return self.sizes[-1].busbw if self.sizes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": list(self.nodes), "op": self.op, "ok": self.ok, "skipped": self.skipped,
            "error": self.error, "latency_us": round(self.latency_us, 1) if self.latency_us is not None else None,
            "busbw_gbps": round(self.busbw, 3) if self.busbw is not None else None,
            "link_gbps": round(self.link_gbps, 3) if self.link_gbps is not None else None, "link_kind": self.link_kind,
            "sizes": [s.to_dict() for s in self.sizes],
        }  # fmt: skip


def split_output(stdout: str) -> tuple[dict[str, Any] | None, str]:
    """The job's report (None when it printed none) and the rest of stdout (NCCL's log)."""
    report = None
    rest = []
    for line in stdout.splitlines():
        if line.startswith(REPORT_MARK):
            try:
                report = json.loads(line[len(REPORT_MARK):])
            except ValueError:
                rest.append(line)
        else:
            rest.append(line)
    return report, "\n".join(rest)


def error_line(message: str | None, nccl: NcclNetwork | None = None) -> str:
    """The backend's own words in one line: NCCL's "Last error:" line when there is one, else the
    first line of the message (C++ frames dropped), with NCCL's first WARN line when the message
    itself says nothing specific."""
    text = (message or "").strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else "no error text"
    for i, ln in enumerate(lines):
        if ln.startswith("Last error:") and i + 1 < len(lines):
            line = f"{line.split(',')[0]}: {lines[i + 1]}"
            break
    if nccl is not None and nccl.warnings and not _SPECIFIC.search(line):
        line += f" (NCCL WARN {nccl.warnings[0]})"
    return line[:400]


def best_error(messages: list[str]) -> str:
    """The most telling of several error lines (a named cause beats a bare timeout)."""

    def score(m: str) -> int:
        return 2 if _SPECIFIC.search(m) else (0 if _GENERIC.search(m) else 1)

    return max(messages, key=score)


def addresses(line: str) -> list[str]:
    """Peer addresses an error line names (Gloo's ``remote=[A]:P``, NCCL's ``Connect to A<P>`` and
    IB ``completion from peer A<P>``, torch's store ``connect to (A, P)``)."""
    return [next(g for g in m.groups() if g) for m in _REMOTE.finditer(line)]


def sizes(results: list[dict[str, Any]] | None, ranks: int, op: Op = "all-reduce") -> tuple[SizeFigure, ...]:
    """The job's timings as figures, with nccl-tests' bus bandwidth of ``op`` over ``ranks``."""
    out = []
    for r in results or []:
        b, s = int(r["bytes"]), float(r["seconds"])
        if s > 0:
            bus = bus_bandwidth(b, s, ranks) if op == "all-reduce" else alltoall_bus_bandwidth(b, s, ranks)
            out.append(SizeFigure(b, s, alg_bandwidth(b, s), bus))
    return tuple(out)


Link = tuple[float | None, str | None]


def link_of(report: dict[str, Any] | None, nccl: NcclNetwork | None, facts: NodeFacts | None,
            interface: str | None) -> Link:  # fmt: skip
    """(GB/s, "rdma"|"tcp") of the link the node's traffic took, when known."""
    if nccl is not None and nccl.transport == "rdma" and facts is not None:
        rates = [p.rate_gbps for d in nccl.used_ib_devices() for p in facts.ib_devices
                 if p.device == d.device and p.port == d.port and p.rate_gbps]  # fmt: skip
        return (max(rates) / 8, "rdma") if rates else (None, "rdma")
    links = (report or {}).get("links") or {}
    ifname = interface
    if nccl is not None and nccl.transport == "socket" and nccl.used_socket_devices():
        ifname = nccl.used_socket_devices()[0].interface
    speed = links.get(ifname) if ifname else None
    return (speed / 8000, "tcp") if isinstance(speed, (int, float)) and speed > 0 else (None, "tcp")


def slowest(links: list[Link]) -> Link:
    known = [(g, k) for g, k in links if g is not None]
    if not known or len(known) < len(links):
        return None, links[0][1] if links else None
    return min(known)


def gbps(value: float) -> str:
    """A bandwidth in GB/s as a message shows it: two decimals, two significant digits under
    0.1 GB/s (a shaped or broken path runs at a few MB/s, which two decimals would show as 0.00)."""
    return f"{value:.2f}" if value >= 0.1 else f"{value:.2g}"


def slow_findings(groups: list[GroupFigures]) -> list[Finding]:
    """COLLECTIVE_SLOW for each group that ran and whose link is known (see SLOW_FRACTION)."""
    out = []
    for g in groups:
        if not g.ok or g.busbw is None or g.link_gbps is None or g.link_kind is None:
            continue
        fraction = SLOW_FRACTION[g.link_kind]
        if g.busbw < fraction * g.link_gbps:
            node = g.nodes[1] if len(g.nodes) == 2 else None
            size = g.sizes[-1].bytes
            out.append(finding(
                WARN, COLLECTIVE_SLOW, node,
                f"{g.name}: {g.op} bus bandwidth {gbps(g.busbw)} GB/s at {size >> 20} MiB is under "
                f"{fraction:.0%} of the link ({g.link_gbps:.2f} GB/s, {g.link_kind})",
                "find the slow hop (the pairs name the node); check the link speed, MTU and the NIC the traffic took",
            ))  # fmt: skip
    return out
