"""The all-to-all between every pair of nodes (orchestrator/collective/mesh.py, the mesh stage of
remote/node_programs/collective_job.py): judged on the job's real output captured on the 3-host test bed
(scripts/capture_collective_jobs.py), the all-to-all bus bandwidth against nccl-tests' own
alltoall_perf tables, NCCL's all-to-all errors from public issues (tests/data/collective/SOURCES.md)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from orchestrator.collective.figures import NodeRun, addresses, error_line, split_output
from orchestrator.collective.nccl_log import alg_bandwidth, alltoall_bus_bandwidth, bus_bandwidth, parse_nccl_tests
from orchestrator.collective.plan import CollectivePlan
from orchestrator.collective.verdict import judge, recorded_summary, summary_line
from orchestrator.remote.node_programs.collective_job import rounds

DATA = Path(__file__).resolve().parent.parent / "data" / "collective"
RANKS = ("c0", "c1", "c2")
VETH_GBPS = 10000 / 8000  # /sys/class/net/eth0/speed of a test host, in the captured reports


def plan(backend: str = "gloo") -> CollectivePlan:
    addrs = {"c0": "10.0.0.10", "c1": "10.0.0.11", "c2": "10.0.0.12"}
    return CollectivePlan(backend, RANKS, "10.0.0.10", {n: "eth0" for n in RANKS}, addrs, alltoall=True)


def raw(case: str, rank: int) -> dict:
    report, _ = split_output((DATA / f"job-{case}-rank{rank}.out").read_text())
    assert report is not None
    return report


def runs(case: str, logs: dict[str, str] | None = None, backend: str = "gloo") -> dict[str, NodeRun]:
    out = {}
    for rank, name in enumerate(RANKS):
        text = (DATA / f"job-{case}-rank{rank}.out").read_text().replace('"backend": "gloo"', f'"backend": "{backend}"')
        if logs and name in logs:
            text = (DATA / logs[name]).read_text() + "\n" + text
        out[name] = NodeRun(name, 0, text, "")
    return out


def pair_seconds(case: str, a: int, b: int) -> float:
    """The pair's time at the largest size: the slower of its two ends."""
    ends = [raw(case, a)["mesh"][str(b)]["results"][-1], raw(case, b)["mesh"][str(a)]["results"][-1]]
    return max(e["seconds"] for e in ends)


def test_every_pair_and_the_group_of_all_pass_with_figures():
    report = judge(plan(), runs("mesh-pass"), {}, 29611)
    assert not [f for f in report.findings if f.severity == "fail"], report.findings
    mesh = report.mesh
    assert mesh is not None and mesh.skipped is None
    assert [(p.name, p.ok, p.op) for p in mesh.pairs] == [
        ("c0<->c1", True, "all-to-all"), ("c0<->c2", True, "all-to-all"), ("c1<->c2", True, "all-to-all")]
    for (a, b), p in zip(itertools.combinations(range(3), 2), mesh.pairs):
        size = raw("mesh-pass", a)["mesh"][str(b)]["results"][-1]["bytes"]
        assert [s.bytes for s in p.sizes] == [8 << 10, size] and size == 16 << 20
        # nccl-tests' all-to-all busbw for 2 ranks: half the buffer crosses the link each way
        assert p.busbw == size / pair_seconds("mesh-pass", a, b) / 1e9 / 2
        assert p.link_gbps == VETH_GBPS
    hub_a2a = raw("mesh-pass", 0)["all"]["a2a_results"]
    assert mesh.all is not None and [s.bytes for s in mesh.all.sizes] == [r["bytes"] for r in hub_a2a]
    assert mesh.all.busbw == hub_a2a[-1]["bytes"] / hub_a2a[-1]["seconds"] / 1e9 * 2 / 3
    assert report.all is not None and report.all.ok  # the all-reduce over all nodes ran as well
    line = summary_line(report)
    assert "; all-to-all: all 3 nodes" in line and "slowest pair c" in line
    assert "all-to-all: all 3 nodes" in recorded_summary(json.loads(json.dumps(report.to_dict())))


def test_two_workers_that_cannot_reach_each_other_are_named_as_a_pair():
    # c1 dropped its TCP to c2 (nft on the test bed); both still reach the head.
    report = judge(plan(), runs("mesh-blocked-pair"), {}, 29612)
    fails = [f for f in report.findings if f.severity == "fail"]
    assert [(f.code, f.node) for f in fails] == [("COLLECTIVE_INIT_FAILED", "c2")]
    assert fails[0].message.startswith("c1 <-> c2 (gloo over eth0): no all-to-all between them: TimeoutError: ")
    assert "between every pair of nodes" in fails[0].hint and fails[0].hint.endswith("COLLECTIVE_INIT_FAILED.md")
    assert [p.ok for p in report.pairs] == [True, True]
    assert report.mesh is not None and [p.ok for p in report.mesh.pairs] == [True, True, False]
    assert report.mesh.pairs[2].sizes == () and report.mesh.all is None
    assert report.all is not None and report.all.skipped
    assert report.all.error == "not run: a pair of nodes could not exchange an all-to-all"
    assert "; all-to-all FAILED between c1<->c2" in summary_line(report)


def test_a_node_whose_job_died_is_named_once_and_its_pairs_are_not_ok():
    # c0 and c1 connected to c2 and timed with it, then orch lost c2's job (the runner gave up):
    # c2 is named for that, its pairs are not ok, and they are not named again.
    r = runs("mesh-pass")
    r["c2"] = NodeRun("c2", error="c2: `python -c ...` did not finish within 105s on root@10.0.0.12; it was stopped")
    report = judge(plan(), r, {}, 1)
    assert [(f.code, f.node) for f in report.findings if f.severity == "fail"] == [("COLLECTIVE_INIT_FAILED", "c2")]
    assert [(p.name, p.ok) for p in report.mesh.pairs] == [("c0<->c1", True), ("c0<->c2", False), ("c1<->c2", False)]


def test_a_slow_pair_is_named_against_its_link():
    # c1 and c2 police what they send each other to 8000 kbytes/s (nft on the test bed).
    report = judge(plan(), runs("mesh-slow-pair"), {}, 29613)
    assert not [f for f in report.findings if f.severity == "fail"]
    pair = report.mesh.pairs[2]
    assert pair.name == "c1<->c2" and pair.ok and pair.busbw == (16 << 20) / pair_seconds("mesh-slow-pair", 1, 2) / 2e9
    # a 2-rank all-to-all's bus bandwidth is what crossed the link one way per second: under the
    # policer's rate (nft's kbyte is 1024 bytes)
    assert pair.busbw < 8000 * 1024 / 1e9
    slow = [f for f in report.findings if f.code == "COLLECTIVE_SLOW" and f.message.startswith("c1<->c2: all-to-all")]
    assert [f.node for f in slow] == ["c2"]
    # 16 MiB over the slower end's 1.688 s (rank 1's capture), half of it across: 0.00497 GB/s
    assert "all-to-all bus bandwidth 0.005 GB/s at 16 MiB is under 10% of the link (1.25 GB/s, tcp)" in slow[0].message
    assert "slowest pair c1<->c2" in summary_line(report)


def test_a_size_timed_by_its_probe_alone_is_judged_like_the_others():
    # The group of all's 16 MiB all-reduce crosses the policed pair: over the job's size budget,
    # it was timed by its probe alone, whose time the ranks agreed on (the same on all three).
    rows = [raw("mesh-slow-pair", r)["all"]["results"][-1] for r in range(3)]
    assert {(x["bytes"], x["iters"], x["seconds"]) for x in rows} == {(16 << 20, 1, 2.8373421613323444)}
    report = judge(plan(), runs("mesh-slow-pair"), {}, 29613)
    assert report.all is not None and report.all.ok and report.all.sizes[-1].seconds == 2.8373421613323444
    assert report.all.busbw == (16 << 20) / 2.8373421613323444 / 1e9 * 2 * 2 / 3  # nccl-tests: 2(n-1)/n


def test_a_pair_far_under_the_others_is_named_even_when_its_link_is_unknown():
    # The same capture with no link speed known (a NIC that reports none): the other pairs show
    # what the network gives, and c1<->c2 is far under their median.
    r = runs("mesh-slow-pair")
    for name in RANKS:
        report, _ = split_output(r[name].stdout)
        report["links"] = {}
        r[name] = NodeRun(name, 0, "ORCH-COLLECTIVE-REPORT " + json.dumps(report) + "\n", "")
    report = judge(plan(), r, {}, 1)
    slow = [f for f in report.findings if f.code == "COLLECTIVE_SLOW"]
    assert [f.node for f in slow] == ["c2"] and "under 25% of the median pair's" in slow[0].message


def test_nccl_mesh_errors_carry_nccls_own_warning():
    """The NCCL path is the same code: the blocked pair's capture with a real NCCL log beside c1's
    report (NVIDIA/nccl#952, whose first WARN is the failed connect)."""
    report = judge(plan("nccl"), runs("mesh-blocked-pair", {"c1": "nccl-socket-fallback-nccl952.log"}, "nccl"), {}, 1)
    fails = [f for f in report.findings if f.severity == "fail"]
    assert [(f.code, f.node) for f in fails] == [("COLLECTIVE_INIT_FAILED", "c2")]
    assert fails[0].message.endswith("within 20 s (NCCL WARN [Service thread] Error encountered progressing "
                                     "operation=Connect, res=2, closing connection)")


def test_the_plan_without_the_all_to_all_and_the_jobs_that_did_not_run_it():
    no = CollectivePlan("gloo", RANKS, "10.0.0.10", {n: "eth0" for n in RANKS}, plan().addresses, alltoall=False)
    assert judge(no, runs("mesh-pass"), {}, 1).mesh is None
    report = judge(plan(), runs("pass"), {}, 1)  # jobs of the all-reduce-only check: nothing to judge, no finding
    assert report.mesh is not None and report.mesh.skipped == "not reported by the nodes' jobs" and report.findings == ()


@pytest.mark.parametrize("world", range(2, 10))
def test_rounds_meet_every_pair_once_and_each_rank_once_per_round(world):
    met = []
    for rnd in rounds(world):
        assert all(rnd[rnd[r]] == r for r in rnd)  # symmetric: r's partner has r as partner
        met += [(a, b) for a, b in rnd.items() if a < b]
    assert sorted(met) == list(itertools.combinations(range(world), 2))
    assert len(rounds(world)) == (world - 1 if world % 2 == 0 else world)


@pytest.mark.parametrize(
    "name,ranks",
    [("nccl-tests-alltoall-8x8-v100-nccltests78.txt", 64), ("nccl-tests-alltoall-8-h20-nccltests314.txt", 8)],
)
def test_alltoall_bus_bandwidth_is_nccl_tests_own(name, ranks):
    rows = parse_nccl_tests((DATA / name).read_text())
    assert len(rows) == 2
    for row in rows:
        t = row.time_us * 1e-6  # nccl-tests prints time and bandwidths rounded: compare within that
        assert alg_bandwidth(row.size, t) == pytest.approx(row.algbw, rel=0.002, abs=0.006)
        assert alltoall_bus_bandwidth(row.size, t, ranks) == pytest.approx(row.busbw, rel=0.002, abs=0.006)
        assert bus_bandwidth(row.size, t, ranks) != pytest.approx(row.busbw, rel=0.1)  # not the all-reduce factor


def test_nccl_all_to_all_errors_name_the_peer_and_keep_the_watchdog_line():
    ib = (DATA / "nccl-ib-completion-error-nccl1405.log").read_text().splitlines()[0]
    assert addresses(ib) == ["10.216.210.236"]
    watchdog = (DATA / "torch-nccl-alltoall-timeout-nccl1610.txt").read_text()
    line = error_line(watchdog)
    assert "OpType=ALLTOALL_BASE" in line and line.endswith("ran for 600045 milliseconds before timing out.")
