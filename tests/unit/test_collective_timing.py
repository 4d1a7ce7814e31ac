"""How the collective job times one size of one group (orchestrator/remote/node_programs/collective_job.py,
``Job.time_op``): run for real, two ranks of a Gloo group over loopback in this process (threads),
observed through a wrapper that only counts the calls it passes on. No time is asserted: the
budget is set so that every size is either far over it (0 s) or far under it (1e9 s).

What the captures from the test bed show for the same code is in test_collective_mesh.py
(``mesh-slow-pair``: sizes over the budget timed by the probe alone)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.collective.plan import SIZES
from orchestrator.remote.node_programs.collective_job import WARMUP, Job

GLOO_SIZES = [s for s, _ in SIZES["gloo"]]
GLOO_ITERS = [i for _, i in SIZES["gloo"]]


class Counting:
    """The real process group; counts the calls of each kind per rank."""

    def __init__(self, pg: Any) -> None:
        self.pg = pg
        self.calls = {"allreduce": 0, "alltoall_base": 0}

    def allreduce(self, tensors):
        self.calls["allreduce"] += 1
        return self.pg.allreduce(tensors)

    def alltoall_base(self, out, inp, out_split, in_split):
        self.calls["alltoall_base"] += 1
        return self.pg.alltoall_base(out, inp, out_split, in_split)


def time_both(op: str, budget: float, name: str) -> tuple[dict[int, list[dict]], dict[int, Counting]]:
    # torch is imported by the job itself (Job.backend), here as on a node: not at collection
    store = None
    ready = threading.Barrier(2)
    results: dict[int, list[dict]] = {}
    groups: dict[int, Counting] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            job = Job({"rank": r, "world": 2, "backend": "gloo", "timeout_s": 20, "deadline_s": 30,
                       "size_budget_s": budget})  # fmt: skip
            job.backend()
            nonlocal store
            if r == 0:
                store = job.dist.HashStore()
            ready.wait(60)
            groups[r] = Counting(job.make_pg(job.dist.PrefixStore(name, store), r, 2))
            results[r] = job.time_op(groups[r], op, 2, GLOO_SIZES, GLOO_ITERS)
        except BaseException as exc:  # the test asserts there were none
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return results, groups


@pytest.fixture(autouse=True)
def loopback(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")


@pytest.mark.parametrize("op,call", [("alltoall", "alltoall_base"), ("allreduce", "allreduce")])
def test_sizes_within_the_budget_are_timed_over_the_plans_calls_after_a_warm_up_and_a_probe(op, call):
    results, groups = time_both(op, 1e9, f"wide-{op}")
    for r in range(2):
        assert [(x["bytes"], x["iters"]) for x in results[r]] == list(zip(GLOO_SIZES, GLOO_ITERS))
        assert all(x["seconds"] > 0 for x in results[r])
        # per size: one warm-up call, the probe, the plan's calls; and one all-reduce agreeing on the probe
        calls = sum(GLOO_ITERS) + WARMUP * len(GLOO_SIZES)
        agreed = len(GLOO_SIZES)
        if op == "alltoall":
            assert groups[r].calls == {"alltoall_base": calls, "allreduce": agreed}
        else:
            assert groups[r].calls == {call: calls + agreed, "alltoall_base": 0}


def test_a_size_over_the_budget_is_the_probe_alone_and_every_rank_reports_the_same_time():
    """The probe is the second call (the first may pay for connections, or ride a shaper's burst:
    the test bed's 8 MB/s pair took 1 s per call after a first call of under 0.5 s, the two
    ranks' mean).
    Both ranks take the agreed (mean) probe time, so they make the same choice and say the same."""
    results, groups = time_both("alltoall", 0.0, "narrow")
    assert [(x["bytes"], x["iters"]) for x in results[0]] == [(s, 1) for s in GLOO_SIZES]
    assert results[0] == results[1]
    for r in range(2):
        assert groups[r].calls == {"alltoall_base": WARMUP * len(GLOO_SIZES), "allreduce": len(GLOO_SIZES)}
