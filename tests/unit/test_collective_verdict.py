"""Judging the collective check: which node is named, with which line, and the figures. Inputs are
the job's real output captured on this machine and real NCCL logs from public issues
(tests/data/collective/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.collective.figures import GroupFigures, NodeRun, SizeFigure, slow_findings, split_output
from orchestrator.collective.nccl_log import parse_nccl_tests
from orchestrator.collective.plan import CollectivePlan
from orchestrator.collective.verdict import judge, recorded_summary, summary_line
from orchestrator.nodes.facts import IbPort, NodeFacts

DATA = Path(__file__).resolve().parent.parent / "data" / "collective"
RANKS = ("h", "a", "b")


def plan(backend: str = "gloo", interface: str | None = "lo") -> CollectivePlan:
    """The plan of those captures: the job's all-reduce only (test_collective_mesh.py: the all-to-all)."""
    addrs = {"h": "10.0.0.1", "a": "10.0.0.2", "b": "10.0.0.3"}
    return CollectivePlan(backend, RANKS, "127.0.0.1", {n: interface for n in RANKS}, addrs, alltoall=False)


def runs(case: str) -> dict[str, NodeRun]:
    out = {}
    for rank, name in enumerate(RANKS):
        text = (DATA / f"job-{case}-rank{rank}.out").read_text()
        report, _ = split_output(text)
        out[name] = NodeRun(name, 4 if report and report.get("error") else 0, text, "")
    return out


def test_passing_run_has_figures_and_no_findings():
    report = judge(plan(), runs("pass"), {}, 41737)
    assert report.ok and report.findings == ()
    assert [p.name for p in report.pairs] == ["h<->a", "h<->b"] and all(p.ok for p in report.pairs)
    assert report.all is not None and report.all.ok and [s.bytes for s in report.all.sizes] == [8192, 1 << 20, 16 << 20]
    raw = json.loads((DATA / "job-pass-rank0.out").read_text().split(" ", 1)[1])["all"]["results"][-1]
    assert report.all.busbw == raw["bytes"] / raw["seconds"] / 1e9 * 2 * 2 / 3  # nccl-tests' 2(n-1)/n for n=3
    assert report.all.link_gbps is None  # loopback has no speed: no COLLECTIVE_SLOW verdict
    assert "all 3 nodes" in summary_line(report) and "pairs with h: a " in summary_line(report)
    assert recorded_summary(report.to_dict()).startswith("last collective check (gloo): ok, all 3 nodes")


def test_wrong_interface_names_every_worker_with_glooss_line():
    report = judge(plan(), runs("bad-iface"), {}, 47223)
    fails = [f for f in report.findings if f.severity == "fail"]
    assert [(f.code, f.node) for f in fails] == [("COLLECTIVE_INIT_FAILED", "a"), ("COLLECTIVE_INIT_FAILED", "b")]
    for f in fails:
        assert f.message.startswith(f"h <-> {f.node} (gloo over lo): RuntimeError: [enforce fail at ")
        assert f.message.endswith("Unable to find address for: eth99")
        assert f.hint.endswith("see `orch runbook COLLECTIVE_INIT_FAILED` or runbooks/COLLECTIVE_INIT_FAILED.md")
    assert report.all is not None and report.all.skipped


def test_worker_that_cannot_reach_the_rendezvous_is_named_alone():
    report = judge(plan(), runs("no-rendezvous"), {}, 38823)
    fails = [f for f in report.findings if f.severity == "fail"]
    assert [(f.code, f.node) for f in fails] == [("COLLECTIVE_INIT_FAILED", "b")]
    assert fails[0].message.startswith("b: could not join the rendezvous on h (127.0.0.1:38823): DistNetworkError: "
                                       "The client socket has timed out after 5000ms while trying to connect to (127.0.0.1, ")
    assert [p.ok for p in report.pairs] == [True, False]


def test_a_node_orch_could_not_run_the_job_on_is_named():
    r = runs("pass")
    r["a"] = NodeRun("a", error="a: `python -c ...` did not finish within 85s on root@10.0.0.2; it was stopped")
    report = judge(plan(), r, {}, 1)
    assert ("COLLECTIVE_INIT_FAILED", "a") in [(f.code, f.node) for f in report.findings]
    assert "did not finish within 85s" in next(f.message for f in report.findings if f.node == "a")


def test_slow_pair_is_named_with_the_reported_figure():
    # nccl-tests#182: 256 MB in 55225 us (4.86 GB/s) on one HDR port (200 Gb/s = 25 GB/s).
    row = [r for r in parse_nccl_tests((DATA / "nccl-tests-allreduce-hdr-vm-nccltests182.txt").read_text())][2]
    size = SizeFigure(row.size, row.time_us * 1e-6, row.algbw, row.busbw)
    slow = GroupFigures("h<->a", ("h", "a"), True, (size,), link_gbps=25.0, link_kind="rdma")
    found = slow_findings([slow])
    assert [(f.code, f.node, f.severity) for f in found] == [("COLLECTIVE_SLOW", "a", "warn")]
    assert "4.86 GB/s at 256 MiB is under 50% of the link (25.00 GB/s, rdma)" in found[0].message
    fine = GroupFigures("h<->a", ("h", "a"), True, (size,), link_gbps=25.0, link_kind="tcp")
    assert slow_findings([fine]) == []  # over TCP only under 10% is flagged


def nccl_runs(log_names: dict[str, str]) -> dict[str, NodeRun]:
    """The passing job's reports with a real NCCL log beside each (stdout carries both)."""
    out = {}
    for rank, name in enumerate(RANKS):
        text = (DATA / f"job-pass-rank{rank}.out").read_text().replace('"backend": "gloo"', '"backend": "nccl"')
        out[name] = NodeRun(name, 0, (DATA / log_names[name]).read_text() + "\n" + text, "")
    return out


def facts_with_port(name: str, device: str, active: bool, rate: float) -> NodeFacts:
    port = IbPort(device=device, port=1, state="Active" if active else "Down", rate_gbps=rate, link_layer="Ethernet")
    return NodeFacts(node=name, host=name, ib_devices=(port,))


def test_socket_fallback_where_rdma_ports_are_active():
    logs = {"h": "nccl-roce-nccltests185.log", "a": "nccl-socket-nccltests217.log", "b": "nccl-roce-nccltests185.log"}
    facts = {"h": facts_with_port("h", "mlx5_10", True, 400), "a": facts_with_port("a", "mlx5_0", True, 400),
             "b": facts_with_port("b", "mlx5_10", True, 400)}  # fmt: skip
    report = judge(plan("nccl", "eth0"), nccl_runs(logs), facts, 1)
    fallback = [f for f in report.findings if f.code == "COLLECTIVE_SOCKET_FALLBACK"]
    assert [(f.node, f.severity) for f in fallback] == [("a", "warn")]
    assert "mlx5_0:1" in fallback[0].message and "NET/IB : No device found." in fallback[0].message
    assert report.transports["h"]["transport"] == "rdma" and report.transports["a"]["transport"] == "socket"
    # The RDMA side's link is the probed port rate (400 Gb/s = 50 GB/s); a's socket side has none.
    assert report.pairs[1].link_gbps == 50.0 and report.pairs[1].link_kind == "rdma"


def test_no_fallback_finding_without_active_rdma_ports():
    logs = {n: "nccl-socket-nccltests217.log" for n in RANKS}
    facts = {n: facts_with_port(n, "mlx5_0", False, 400) for n in RANKS}
    report = judge(plan("nccl", "eth0"), nccl_runs(logs), facts, 1)
    assert not [f for f in report.findings if f.code == "COLLECTIVE_SOCKET_FALLBACK"]


def test_all_nodes_group_that_never_finishes_is_a_failure_not_a_skip():
    # Every pair worked; c's job was stopped by its watchdog inside the all-nodes group (seen on
    # the test bed when two workers cannot reach each other): the captured passing output with
    # b's "all" result replaced by the watchdog's report.
    r = runs("pass")
    report_b, _ = split_output(r["b"].stdout)
    del report_b["all"]
    report_b["error"] = {"stage": "all", "message": "TimeoutError: no progress in all within the check's deadline (55 s)"}
    r["b"] = NodeRun("b", 6, "ORCH-COLLECTIVE-REPORT " + json.dumps(report_b) + "\n", "")
    report = judge(plan(), r, {}, 1)
    fails = [f for f in report.findings if f.severity == "fail"]
    assert [(f.code, f.node) for f in fails] == [("COLLECTIVE_INIT_FAILED", None)]
    assert fails[0].message.startswith("every node paired with h, but the nodes could not form one group (gloo over lo): ")
    assert "b: TimeoutError: no progress in all" in fails[0].message
    assert report.all is not None and not report.all.ok and not report.all.skipped
