"""Judge a collective check: the nodes' outputs -> figures (latency, bus bandwidth per pair and for
all nodes, the NCCL transport) and findings. Pure: no I/O.

The all-to-all between every pair of nodes (when the plan asks for it) is judged by
``collective.mesh``; its findings join these.

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.collective.figures import (
    GroupFigures,
    Link,
    NodeRun,
    addresses,
    best_error,
    error_line,
    link_of,
    sizes,
    slow_findings,
    slowest,
    split_output,
)
from orchestrator.collective.mesh import MeshFigures, judge_mesh
from orchestrator.collective.nccl_log import NcclNetwork, parse_nccl_log
from orchestrator.collective.plan import CollectivePlan
from orchestrator.nodes.facts import NodeFacts
from orchestrator.preflight.findings import (
    COLLECTIVE_INIT_FAILED,
    COLLECTIVE_SOCKET_FALLBACK,
    FAIL,
    WARN,
    Finding,
    finding,
)


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
    mesh: MeshFigures | None = None  # the all-to-all between every pair (None: not asked for)

    @property
    def ok(self) -> bool:
        return not any(f.severity == FAIL for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "ranks": list(self.ranks), "hub": self.ranks[0], "ok": self.ok,
            "interfaces": dict(self.interfaces), "seconds": round(self.seconds, 2), "port": self.port,
            "pairs": [p.to_dict() for p in self.pairs], "all": self.all.to_dict() if self.all else None,
            "mesh": self.mesh.to_dict() if self.mesh else None,
            "transports": dict(self.transports), "findings": [f.to_dict() for f in self.findings],
        }  # fmt: skip


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
    links = {n: link_of(reports[n], nccl[n], facts.get(n) if isinstance(facts.get(n), NodeFacts) else None,
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
        err = best_error(errors) if errors else None
        source = theirs.get("results") if theirs.get("ok") else mine.get("results")
        link = slowest([links[plan.hub], links[w]])
        pairs.append(GroupFigures(f"{plan.hub}<->{w}", (plan.hub, w), ok, sizes(source, 2) if ok else (),
                                  link[0], link[1], err, skipped=not (mine or theirs)))  # fmt: skip
        if not ok and w not in early and plan.hub not in early:
            found.append(finding(
                FAIL, COLLECTIVE_INIT_FAILED, w,
                f"{plan.hub} <-> {w} ({where}): {err or 'the pair did not form'}",
                f"the backend could not connect {w} and {plan.hub} on their interfaces: check routes and firewalls "
                f"between them on every port (not only Ray's), as runbooks/COLLECTIVE_CONNECT_FAILED.md explains",
            ))  # fmt: skip

    hub_pairs_ok = not early and all(p.ok for p in pairs)
    mesh, mesh_found = judge_mesh(plan, reports, nccl, links, where, hub_pairs_ok, frozenset(early))
    found.extend(mesh_found)
    skip = None
    if not hub_pairs_ok:
        skip = "not run: a pair with the hub failed"
    elif mesh is not None and mesh.failed:
        skip = "not run: a pair of nodes could not exchange an all-to-all"
    group = _all_group(plan, reports, nccl, links, where, found, early, skip)
    found.extend(slow_findings([*pairs, group]))
    transports = {n: v.to_dict() for n, v in nccl.items() if v is not None}
    found.extend(_fallback(plan, nccl, facts))
    return CollectiveReport(plan.backend, plan.ranks, tuple(pairs), group, transports, tuple(found), seconds,
                            dict(plan.interfaces), port, mesh)  # fmt: skip


def _all_group(plan: CollectivePlan, reports: Mapping[str, dict[str, Any] | None], nccl: Mapping[str, Any],
               links: Mapping[str, Link], where: str, found: list[Finding], early: set[str],
               skip: str | None) -> GroupFigures:  # fmt: skip
    name = f"all {len(plan.ranks)} nodes"
    if skip:  # a pair failed (or a job did not start): the jobs did not start this group
        return GroupFigures(name, plan.ranks, False, skipped=True, error=skip)
    alls = {n: (reports.get(n) or {}).get("all") for n in plan.ranks}
    if all(v is not None and v.get("ok") for v in alls.values()):
        hub = alls[plan.hub] or {}
        link = slowest([links[n] for n in plan.ranks])
        return GroupFigures(name, plan.ranks, True, sizes(hub.get("results"), len(plan.ranks)), link[0], link[1])
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
    return GroupFigures(name, plan.ranks, False, error=best_error(list(lines.values())) if lines else None)


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
    head += f"; pairs with {report.ranks[0]}: " + ", ".join(pairs) if pairs else ""
    return head + mesh_summary(report.mesh.to_dict() if report.mesh else None)


def mesh_summary(mesh: Mapping[str, Any] | None) -> str:
    """The all-to-all part of the summary lines (from ``MeshFigures.to_dict()``): the group of all
    nodes, and the slowest pair or the pairs that failed."""
    if not mesh:
        return ""
    if mesh.get("skipped"):
        return "; all-to-all " + str(mesh["skipped"])
    pairs = mesh.get("pairs") or []
    failed = [p["name"] for p in pairs if not p.get("ok") and not p.get("skipped")]
    if failed:
        return "; all-to-all FAILED between " + ", ".join(failed)
    line = "; all-to-all"
    group = mesh.get("all") or {}
    if group.get("ok") and group.get("busbw_gbps") is not None:
        line += f": all {len(group.get('nodes') or [])} nodes {group['busbw_gbps']:.2f} GB/s bus bandwidth"
    timed = [p for p in pairs if p.get("busbw_gbps") is not None]
    if timed:
        low = min(timed, key=lambda p: p["busbw_gbps"])
        line += f"{',' if line.endswith('bandwidth') else ':'} slowest pair {low['name']} {low['busbw_gbps']:.2f} GB/s"
    return line


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
    line += mesh_summary(data.get("mesh"))
    transports = {n: t.get("transport") for n, t in (data.get("transports") or {}).items()}
    if transports:
        line += "; NCCL transport " + ", ".join(f"{n} {t or '?'}" for n, t in transports.items())
    return line
