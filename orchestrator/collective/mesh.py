"""The all-to-all part of the collective check: every pair of nodes in its own group, and the
all-to-all over all nodes. Pure: no I/O.

Expert parallelism (vLLM's ``enable_expert_parallel`` over a DP x TP group) sends all-to-all
traffic between every pair of GPUs of the group in every MoE layer, not only between neighbours of
a ring as tensor parallelism's all-reduce does; one pair that cannot connect, or is much slower
than the others, stalls the whole group. The job (``remote/node_programs/collective_job.py``, mesh stage) forms every pair's
group, checks one all-to-all in it and times it; this module reads both ends of each pair.

Findings (codes in ``orchestrator.preflight.findings``):
- COLLECTIVE_INIT_FAILED (fail) for a pair that could not exchange an all-to-all, naming both
  nodes (the finding's node is the pair's second one) with the backend's own line.
- COLLECTIVE_SLOW (warn) for a pair whose all-to-all bus bandwidth is under ``SLOW_FRACTION`` of
  its link, or under ``PAIR_SLOW_RATIO`` of the median pair (with three pairs or more: the others
  show what the network gives).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.collective.figures import (
    GroupFigures,
    Link,
    best_error,
    error_line,
    sizes,
    slow_findings,
    slowest,
)
from orchestrator.collective.nccl_log import NcclNetwork
from orchestrator.collective.plan import CollectivePlan
from orchestrator.preflight.findings import COLLECTIVE_INIT_FAILED, COLLECTIVE_SLOW, FAIL, WARN, Finding, finding

# A pair this far under the median pair is slow whatever its link says (docs/preflight.md: the
# pairs of a healthy test bed spread within a factor of two of their median).
PAIR_SLOW_RATIO = 0.25


@dataclass(frozen=True)
class MeshFigures:
    """The all-to-all figures: every pair of nodes (plan order), and the group of all nodes."""

    pairs: tuple[GroupFigures, ...]
    all: GroupFigures | None = None  # None: the group of all nodes did not run (a pair failed)
    skipped: str | None = None  # why no pair ran

    @property
    def failed(self) -> tuple[GroupFigures, ...]:
        return tuple(p for p in self.pairs if not p.ok and not p.skipped)

    @property
    def slowest(self) -> GroupFigures | None:
        timed = [p for p in self.pairs if p.ok and p.busbw is not None]
        return min(timed, key=lambda p: p.busbw or 0.0) if timed else None

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": [p.to_dict() for p in self.pairs], "all": self.all.to_dict() if self.all else None,
                "skipped": self.skipped}  # fmt: skip


def _merge(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Both ends timed the same exchanges: the slower end's time is when the exchange was done."""
    if not a or not b:
        return list(a or b or [])
    theirs = {int(r["bytes"]): float(r["seconds"]) for r in b}
    return [{**r, "seconds": max(float(r["seconds"]), theirs.get(int(r["bytes"]), 0.0))} for r in a]


def judge_mesh(plan: CollectivePlan, reports: Mapping[str, dict[str, Any] | None],
               nccl: Mapping[str, NcclNetwork | None], links: Mapping[str, Link], where: str,
               hub_pairs_ok: bool, early: frozenset[str] = frozenset()) -> tuple[MeshFigures | None, list[Finding]]:  # fmt: skip
    """The pairs' figures and findings; None when the plan asked for no all-to-all. The jobs run
    it only once every worker paired with the hub (``hub_pairs_ok``). A pair with a node in
    ``early`` (its job failed on its own, named already) is not ok and not named again."""
    if not plan.alltoall:
        return None, []
    if not any("mesh" in (reports.get(n) or {}) for n in plan.ranks):
        why = "not reported by the nodes' jobs" if hub_pairs_ok else "not run: a pair with the hub failed"
        return MeshFigures((), skipped=why), []
    found: list[Finding] = []
    pairs: list[GroupFigures] = []
    for i, a in enumerate(plan.ranks):
        for j in range(i + 1, len(plan.ranks)):
            b = plan.ranks[j]
            ends = (((reports.get(a) or {}).get("mesh") or {}).get(str(j)), a), \
                   (((reports.get(b) or {}).get("mesh") or {}).get(str(i)), b)  # fmt: skip
            ok = all(m is not None and m.get("ok") for m, _ in ends)
            errors = [error_line(m.get("error"), nccl.get(n)) for m, n in ends if m is not None and m.get("error")]
            for m, n in ends:  # an end with no word on the pair: its job stopped (its own error says where)
                late = (reports.get(n) or {}).get("error")
                if m is None and late:
                    errors.append(error_line(late.get("message"), nccl.get(n)))
            skipped = all(m is None for m, _ in ends)
            figs = sizes(_merge(ends[0][0] and ends[0][0].get("results"), ends[1][0] and ends[1][0].get("results")),
                         2, "all-to-all") if ok else ()  # fmt: skip
            link = slowest([links[a], links[b]])
            err = best_error(errors) if errors else None
            pairs.append(GroupFigures(f"{a}<->{b}", (a, b), ok, figs, link[0], link[1], err, skipped, "all-to-all"))
            if not ok and not skipped and a not in early and b not in early:
                found.append(finding(
                    FAIL, COLLECTIVE_INIT_FAILED, b,
                    f"{a} <-> {b} ({where}): no all-to-all between them: {err or 'the pair did not form'}",
                    f"expert parallel sends all-to-all traffic between every pair of nodes, not only with the head: "
                    f"open TCP between {a} and {b} on their interfaces on every port (and the RDMA path), as "
                    f"runbooks/COLLECTIVE_CONNECT_FAILED.md explains",
                ))  # fmt: skip
    group = _all(plan, reports, links)
    found.extend(slow_findings([*pairs, *([group] if group else [])]))
    found.extend(_outliers(pairs, {f.message.split(":", 1)[0] for f in found if f.code == COLLECTIVE_SLOW}))
    return MeshFigures(tuple(pairs), group), found


def _outliers(pairs: list[GroupFigures], named: set[str]) -> list[Finding]:
    """COLLECTIVE_SLOW for pairs under PAIR_SLOW_RATIO of the median pair (three pairs or more),
    but for those already ``named`` slow against their link."""
    timed = [p for p in pairs if p.ok and p.busbw is not None]
    if len(timed) < 3:
        return []
    median = statistics.median(p.busbw or 0.0 for p in timed)
    out = []
    for p in timed:
        if (p.busbw or 0.0) < PAIR_SLOW_RATIO * median and p.name not in named:
            out.append(finding(
                WARN, COLLECTIVE_SLOW, p.nodes[1],
                f"{p.name}: all-to-all bus bandwidth {p.busbw:.3f} GB/s at {p.sizes[-1].bytes >> 20} MiB is under "
                f"{PAIR_SLOW_RATIO:.0%} of the median pair's ({median:.3f} GB/s); expert parallel goes at the pace of "
                f"its slowest pair",
                f"find what is different on the path between {p.nodes[0]} and {p.nodes[1]}: link speed, MTU, a "
                f"firewall or shaper, the NIC the traffic took",
            ))  # fmt: skip
    return out


def _all(plan: CollectivePlan, reports: Mapping[str, dict[str, Any] | None], links: Mapping[str, Link]) -> GroupFigures | None:
    """The all-to-all over all nodes, timed in the group of all (the hub's figures)."""
    alls = [(reports.get(n) or {}).get("all") or {} for n in plan.ranks]
    if not all(a.get("ok") for a in alls) or not alls[0].get("a2a_results"):
        return None
    link = slowest([links[n] for n in plan.ranks])
    return GroupFigures(f"all {len(plan.ranks)} nodes", plan.ranks, True,
                        sizes(alls[0]["a2a_results"], len(plan.ranks), "all-to-all"), link[0], link[1], op="all-to-all")  # fmt: skip
