"""Judge a collective check: the nodes' outputs -> figures (latency, bus bandwidth per pair and for
all nodes, the NCCL transport) and findings. Pure: no I/O.

Findings (codes in ``orchestrator.preflight.findings``, runbooks under runbooks/):
- COLLECTIVE_INIT_FAILED (fail): a node's job could not start, join the rendezvous, or form its
  group with the hub; names the node and carries the backend's own error line. When all pairs
  worked but the group of all nodes did not, the nodes whose address the errors name.
- COLLECTIVE_SLOW (warn): bus bandwidth at the largest size below ``SLOW_FRACTION`` of the link
  (the slower end of a pair): the IB port rate (probed) when NCCL used RDMA, else the speed of
  the interface the job used (/sys/class/net/<if>/speed, read by the job on the node).
- COLLECTIVE_SOCKET_FALLBACK (warn): NCCL used sockets on a node with an active IB/RoCE port.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.collective.nccl_log import NcclNetwork, alg_bandwidth, bus_bandwidth, parse_nccl_log
from orchestrator.collective.plan import CollectivePlan
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.findings import (
    COLLECTIVE_INIT_FAILED,
    COLLECTIVE_SLOW,
    COLLECTIVE_SOCKET_FALLBACK,
    FAIL,
    WARN,
    Finding,
    finding,
)

REPORT_MARK = "ORCH-COLLECTIVE-REPORT "
# Bus bandwidth under this fraction of the link is COLLECTIVE_SLOW (docs/preflight.md). RDMA:
# NVIDIA expects 92-98% of the line rate (12 GB/s per 100G NIC, 24 per 200G, 46-48 per 400G), so
# under half is broken (wrong NIC, no GPUDirect, PCIe or ACS trouble). TCP (NCCL sockets, Gloo):
# a single stream is CPU-bound and reaches far less; only an order of magnitude below the link
# is flagged (traffic through a slower path, a congested or shaped link).
SLOW_FRACTION = {"rdma": 0.5, "tcp": 0.1}
_GENERIC = re.compile(r"timed out|timeout|Timed out|closed by remote|Connection reset|Connection closed", re.I)
_SPECIFIC = re.compile(r"No route to host|Connection refused|Unable to find address|remote=|Connect to|"
                       r"Network is unreachable|No such device|rendezvous|NCCL WARN|sees no CUDA|No module")  # fmt: skip
_REMOTE = re.compile(r"remote=\[?(?P<a>[0-9a-fA-F.:]+?)\]?:\d+|Connect to (?P<b>[0-9a-fA-F.:]+?)<\d+>|"
                     r"connect to \((?P<c>[0-9a-fA-F.:]+), \d+\)")  # fmt: skip


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
    """One group (a worker with the hub, or all nodes): ok, its timings and the link it ran on."""

    name: str
    nodes: tuple[str, ...]
    ok: bool
    sizes: tuple[SizeFigure, ...] = ()
    link_gbps: float | None = None  # GB/s of the slowest end's link, when known
    link_kind: str | None = None  # "rdma" | "tcp"
    error: str | None = None
    skipped: bool = False

    @property
    def latency_us(self) -> float | None:
        return self.sizes[0].seconds * 1e6 if self.sizes else None

    @property
    def busbw(self) -> float | None:
        return self.sizes[-1].busbw if self.sizes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": list(self.nodes), "ok": self.ok, "skipped": self.skipped, "error": self.error,
            "latency_us": round(self.latency_us, 1) if self.latency_us is not None else None,
            "busbw_gbps": round(self.busbw, 3) if self.busbw is not None else None,
            "link_gbps": round(self.link_gbps, 3) if self.link_gbps is not None else None, "link_kind": self.link_kind,
            "sizes": [s.to_dict() for s in self.sizes],
        }  # fmt: skip


@dataclass(frozen=True)
class CollectiveReport:
    backend: str
    ranks: tuple[str, ...]
    pairs: tuple[GroupFigures, ...]
    all: GroupFigures | None
    transports: Mapping[str, Any] = field(default_factory=dict)  # node -> NcclNetwork.to_dict() (NCCL)
    findings: tuple[Finding, ...] = ()
    seconds: float = 0.0
    interfaces: Mapping[str, str | None] = field(default_factory=dict)
    port: int = 0  # the hub's rendezvous port (free again once the check is over)

    @property
    def ok(self) -> bool:
        return not any(f.severity == FAIL for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "ranks": list(self.ranks), "hub": self.ranks[0], "ok": self.ok,
            "interfaces": dict(self.interfaces), "seconds": round(self.seconds, 2), "port": self.port,
            "pairs": [p.to_dict() for p in self.pairs], "all": self.all.to_dict() if self.all else None,
            "transports": dict(self.transports), "findings": [f.to_dict() for f in self.findings],
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


def _best(messages: list[str]) -> str:
    """The most telling of several error lines (a named cause beats a bare timeout)."""
    def score(m: str) -> int:
        return 2 if _SPECIFIC.search(m) else (0 if _GENERIC.search(m) else 1)

    return max(messages, key=score)


def _sizes(results: list[dict[str, Any]] | None, ranks: int) -> tuple[SizeFigure, ...]:
    out = []
    for r in results or []:
        b, s = int(r["bytes"]), float(r["seconds"])
        if s > 0:
            out.append(SizeFigure(b, s, alg_bandwidth(b, s), bus_bandwidth(b, s, ranks)))
    return tuple(out)


def _link(node: str, report: dict[str, Any] | None, nccl: NcclNetwork | None, facts: NodeFacts | None,
          interface: str | None) -> tuple[float | None, str | None]:  # fmt: skip
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


def _slowest(links: list[tuple[float | None, str | None]]) -> tuple[float | None, str | None]:
    known = [(g, k) for g, k in links if g is not None]
    if not known or len(known) < len(links):
        return None, links[0][1] if links else None
    return min(known)


def judge(plan: CollectivePlan, runs: Mapping[str, NodeRun], facts: Mapping[str, Any], port: int,
          seconds: float = 0.0) -> CollectiveReport:  # fmt: skip
    """Figures and findings of one check (see the module doc)."""
    found: list[Finding] = []
    reports: dict[str, dict[str, Any] | None] = {}
    nccl: dict[str, NcclNetwork | None] = {}
    early: set[str] = set()  # nodes whose job failed before the pairs (their own finding)
    where = f"{plan.backend} over " + ("/".join(sorted({i or "the default route" for i in plan.interfaces.values()})))

    for name in plan.ranks:
        run = runs.get(name) or NodeRun(name, error="not run")
        report, log = split_output(run.stdout)
        reports[name] = report
        nccl[name] = parse_nccl_log(log) if plan.backend == "nccl" else None
        why = None
        if run.error is not None:
            why = f"{name}: the check's job did not finish: {run.error}"
        elif report is None:
            tail = [ln for ln in (run.stderr or run.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
            why = f"{name}: the check's job exited {run.exit_code} without a report: {tail[0][:300]}"
        elif report.get("error") and report["error"].get("stage") in ("import", "rendezvous"):
            err = error_line(report["error"].get("message"), nccl[name])
            if report["error"]["stage"] == "import":
                why = f"{name}: {plan.backend} could not be used by the node's python: {err}"
            elif name == plan.hub:
                why = f"{name}: could not host the rendezvous on {plan.store_host}:{port}: {err}"
            else:
                why = f"{name}: could not join the rendezvous on {plan.hub} ({plan.store_host}:{port}): {err}"
        if why:
            early.add(name)
            found.append(finding(FAIL, COLLECTIVE_INIT_FAILED, name, why,
                                 f"fix {name}'s path to {plan.hub} on its interface, then re-run `orch up`"))  # fmt: skip

    hub = reports.get(plan.hub) or {}
    pairs: list[GroupFigures] = []
    links = {n: _link(n, reports[n], nccl[n], facts.get(n) if isinstance(facts.get(n), NodeFacts) else None,
                      plan.interfaces.get(n)) for n in plan.ranks}  # fmt: skip
    for rank, w in enumerate(plan.workers, start=1):
        mine = (reports.get(w) or {}).get("pair") or {}
        theirs = (hub.get("pairs") or {}).get(str(rank)) or {}
        ok = bool(mine.get("ok")) and bool(theirs.get("ok"))
        errors = [error_line(m.get("error"), nccl[n]) for m, n in ((mine, w), (theirs, plan.hub)) if m.get("error")]
        for n in (w, plan.hub):  # a job that stopped mid-way (its watchdog) says where
            late = (reports.get(n) or {}).get("error")
            if late and not ok and (n == w or not theirs):
                errors.append(error_line(late.get("message"), nccl[n]))
        err = _best(errors) if errors else None
        source = theirs.get("results") if theirs.get("ok") else mine.get("results")
        link = _slowest([links[plan.hub], links[w]])
        pairs.append(GroupFigures(f"{plan.hub}<->{w}", (plan.hub, w), ok, _sizes(source, 2) if ok else (),
                                  link[0], link[1], err, skipped=not (mine or theirs)))  # fmt: skip
        if not ok and w not in early and plan.hub not in early:
            found.append(finding(
                FAIL, COLLECTIVE_INIT_FAILED, w,
                f"{plan.hub} <-> {w} ({where}): {err or 'the pair did not form'}",
                f"the backend could not connect {w} and {plan.hub} on their interfaces: check routes and firewalls "
                f"between them on every port (not only Ray's), as runbooks/COLLECTIVE_CONNECT_FAILED.md explains",
            ))  # fmt: skip

    group = _all_group(plan, reports, nccl, links, where, found, early | ({"-"} if not all(p.ok for p in pairs) else set()))
    found.extend(slow_findings([*pairs, group]))
    transports = {n: v.to_dict() for n, v in nccl.items() if v is not None}
    found.extend(_fallback(plan, nccl, facts))
    return CollectiveReport(plan.backend, plan.ranks, tuple(pairs), group, transports, tuple(found), seconds,
                            dict(plan.interfaces), port)  # fmt: skip


def _all_group(plan: CollectivePlan, reports: Mapping[str, dict[str, Any] | None], nccl: Mapping[str, Any],
               links: Mapping[str, tuple[float | None, str | None]], where: str, found: list[Finding],
               early: set[str]) -> GroupFigures:  # fmt: skip
    name = f"all {len(plan.ranks)} nodes"
    if early:  # a pair with the hub failed (or a job did not start): the hub did not start this group
        return GroupFigures(name, plan.ranks, False, skipped=True, error="not run: a pair with the hub failed")
    alls = {n: (reports.get(n) or {}).get("all") for n in plan.ranks}
    if all(v is not None and v.get("ok") for v in alls.values()):
        hub = alls[plan.hub] or {}
        link = _slowest([links[n] for n in plan.ranks])
        return GroupFigures(name, plan.ranks, True, _sizes(hub.get("results"), len(plan.ranks)), link[0], link[1])
    lines = {n: error_line(v.get("error"), nccl[n]) for n, v in alls.items() if v and v.get("error")}
    for n, v in alls.items():  # no result: the job stopped in this group (its watchdog) and says so
        err = (reports.get(n) or {}).get("error")
        if v is None and err:
            lines[n] = error_line(err.get("message"), nccl[n])
    by_addr = {a: n for n, a in plan.addresses.items()}
    named = sorted({by_addr[a] for line in lines.values() for a in addresses(line) if a in by_addr},
                   key=plan.ranks.index)  # fmt: skip
    detail = "; ".join(f"{n}: {line}" for n, line in lines.items())
    for node in named or [None]:
        if node in early:
            continue
        who = f"{node} is not reachable from its peers" if node else "the nodes could not form one group"
        found.append(finding(
            FAIL, COLLECTIVE_INIT_FAILED, node,
            f"every node paired with {plan.hub}, but {who} ({where}): {detail}",
            "workers must reach each other too, not only the head: open TCP between all nodes on their interfaces "
            "(runbooks/COLLECTIVE_CONNECT_FAILED.md)",
        ))  # fmt: skip
    return GroupFigures(name, plan.ranks, False, error=_best(list(lines.values())) if lines else None)


def addresses(line: str) -> list[str]:
    """Peer addresses an error line names (Gloo's ``remote=[A]:P``, NCCL's ``Connect to A<P>``,
    torch's store ``connect to (A, P)``)."""
    return [next(g for g in m.groups() if g) for m in _REMOTE.finditer(line)]


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
                f"{g.name}: all-reduce bus bandwidth {g.busbw:.2f} GB/s at {size >> 20} MiB is under "
                f"{fraction:.0%} of the link ({g.link_gbps:.2f} GB/s, {g.link_kind})",
                "find the slow hop (the pairs name the node); check the link speed, MTU and the NIC the traffic took",
            ))  # fmt: skip
    return out


def _fallback(plan: CollectivePlan, nccl: Mapping[str, NcclNetwork | None], facts: Mapping[str, Any]) -> list[Finding]:
    out = []
    for n in plan.ranks:
        net, f = nccl.get(n), facts.get(n)
        if net is None or net.transport != "socket" or not isinstance(f, NodeFacts):
            continue
        active = [f"{p.device}:{p.port}" for p in f.ib_devices if p.active]
        if active:
            line = next((e for e in net.evidence if "No device found" in e or "Socket" in e), net.evidence[0] if net.evidence else "")
            out.append(finding(
                WARN, COLLECTIVE_SOCKET_FALLBACK, n,
                f"{n}: NCCL used TCP sockets although RDMA port(s) {', '.join(active)} are active: {line[-200:]}",
                "NCCL could not open the RDMA devices (libibverbs, container devices, NCCL_IB_HCA or NCCL_IB_DISABLE "
                "in the manifest env)",
            ))  # fmt: skip
    return out


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def summary_line(report: CollectiveReport) -> str:
    """One line for progress and `orch status`: the all-nodes figures, then each pair's."""
    head = f"collective check ({report.backend}, {report.seconds:.1f} s)"
    if report.all is not None and report.all.ok and report.all.sizes:
        first, last = report.all.sizes[0], report.all.sizes[-1]
        head += (f": all {len(report.ranks)} nodes {last.busbw:.2f} GB/s bus bandwidth at {_size(last.bytes)}, "
                 f"{first.seconds * 1e6:.0f} us at {_size(first.bytes)}")  # fmt: skip
    else:
        head += ": FAILED" if not report.ok else ": all-nodes group not run"
    pairs = [f"{p.nodes[1]} {p.busbw:.2f} GB/s" if p.ok and p.busbw is not None else f"{p.nodes[1]} failed"
             for p in report.pairs]  # fmt: skip
    return head + (f"; pairs with {report.ranks[0]}: " + ", ".join(pairs) if pairs else "")


def recorded_summary(data: Mapping[str, Any]) -> str:
    """`orch status`'s line for the recorded check (``CollectiveReport.to_dict()`` plus
    ``checked_at``, as the state keeps it)."""
    group = data.get("all") or {}
    line = f"last collective check ({data.get('backend')}): " + ("ok" if data.get("ok") else "FAILED")
    if group.get("ok") and group.get("busbw_gbps") is not None:
        line += (f", all {len(data.get('ranks') or [])} nodes {group['busbw_gbps']:.2f} GB/s bus bandwidth, "
                 f"latency {group.get('latency_us') or 0:.0f} us")  # fmt: skip
    pairs = [f"{p['nodes'][1]} {p['busbw_gbps']:.2f} GB/s" if p.get("ok") and p.get("busbw_gbps") is not None
             else f"{p['nodes'][1]} failed" for p in data.get("pairs") or []]  # fmt: skip
    if pairs:
        line += f"; pairs with {data.get('hub')}: " + ", ".join(pairs)
    transports = {n: t.get("transport") for n, t in (data.get("transports") or {}).items()}
    if transports:
        line += "; NCCL transport " + ", ".join(f"{n} {t or '?'}" for n, t in transports.items())
    return line
