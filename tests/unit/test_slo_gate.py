"""The SLO gate's plan, its judgement and what it says (serve/slo_gate.py), on a load record as
`orch bench` stores it (workflows.load_record: levels of LoadLevel.to_dict, replicas, shape)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.bench.goodput import LoadLevel
from orchestrator.bench.latency import RequestRecord
from orchestrator.errors import UsageError
from orchestrator.serve.slo_gate import GatePlan, decided_miss, gate_figures, judge_gate, plan_gate


def level(c: int, ttft: float, tpot: float = 20.0, requests: int = 16, ok: int | None = None) -> LoadLevel:
    ok = requests if ok is None else ok
    return LoadLevel(f"concurrency={c}", c, None, requests, ok, (requests - ok) / requests, 2.0 * c, ttft, tpot, 300.0)


SLO = SimpleNamespace(ttft_p95_ms=500.0, tpot_p95_ms=50.0, max_error_rate=0.02)
SHAPE = {"prompt_tokens": 32, "output_tokens": 256, "workload": "random"}


def entry(*levels: LoadLevel, replicas: int | None = 2) -> dict:
    out: dict = {"levels": [lv.to_dict() for lv in levels], "shape": SHAPE}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def test_the_plan_is_the_heaviest_level_that_met_the_objective_scaled_to_the_candidates_replicas():
    # 8 met it (TTFT 400 <= 500), 16 missed it (900): 8 in flight on 2 recorded replicas is 4 per
    # replica, 12 on the candidate's 3; 16 recorded requests, the concurrency is more.
    plan = plan_gate(entry(level(4, 200.0), level(8, 400.0), level(16, 900.0)), SLO, 5, 3)
    assert (plan.recorded_revision, plan.recorded_replicas, plan.candidate_replicas) == (5, 2, 3)
    assert (plan.level.label, plan.concurrency, plan.requests) == ("concurrency=8", 12, 16)
    assert plan.shape == SHAPE
    assert plan.objective == {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0, "max_error_rate": 0.02}
    assert plan.describe() == ("concurrency 12, 16 requests of 32 prompt / 256 output tokens "
                               "(revision 5's concurrency=8 on 2 replica(s))")  # fmt: skip
    assert plan.to_dict() == {
        "recorded_revision": 5, "recorded_level": plan.level.to_dict(), "recorded_replicas": 2, "candidate_replicas": 3,
        "concurrency": 12, "requests": 16, "shape": SHAPE,
        "objective": {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0, "max_error_rate": 0.02},
    }  # fmt: skip


def test_a_record_without_replicas_counts_one_and_the_requests_are_at_least_the_concurrency():
    plan = plan_gate({"levels": [level(8, 100.0, requests=4).to_dict()]}, SLO, 1, 1)
    assert (plan.recorded_replicas, plan.concurrency, plan.requests, plan.shape) == (1, 8, 8, {})
    assert "? prompt / ? output tokens" in plan.describe()


BENCH_FIRST = "run `orch bench CLUSTER_YAML` (or `orch accept`) against the live revision first: it records the load levels the gate replays"


@pytest.mark.parametrize("record, objective, live, says, hint", [
    (entry(level(4, 100.0)), None, 1, "the manifest sets no slo:", "add an slo: section to the manifest (docs/manifest.md)"),
    (entry(level(4, 100.0)), SLO, None, "no revision is serving", "roll out without --slo-gate first, then measure it with `orch bench`"),
    (None, SLO, 3, "revision 3 has no recorded load levels", BENCH_FIRST),
    ({"levels": []}, SLO, 3, "revision 3 has no recorded load levels", BENCH_FIRST),
    (entry(level(2, 700.0, tpot=60.0), level(4, 900.0)), SLO, 3,
     "revision 3 met the objective at none of its recorded levels (concurrency=2: TTFT p95 700 ms > 500 ms, TPOT p95 60.0 ms > 50 ms)",
     "the live revision itself misses the slo: relax it, or record a lighter load with `orch bench --concurrency 1`"),
])  # fmt: skip
def test_a_gate_with_nothing_to_hold_the_candidate_to_is_refused_up_front(record, objective, live, says, hint):
    with pytest.raises(UsageError) as err:
        plan_gate(record, objective, live, 1)
    assert says in err.value.message and err.value.message.startswith("--slo-gate: ")
    assert err.value.hint == hint


def plan(requests: int = 16, objective: dict | None = None) -> GatePlan:
    objective = {"ttft_p95_ms": 500.0, "tpot_p95_ms": 50.0, "max_error_rate": 0.02} if objective is None else objective
    return GatePlan(recorded_revision=1, level=level(8, 400.0), recorded_replicas=1, candidate_replicas=1, concurrency=8,
                    requests=requests, objective=objective)  # fmt: skip


def test_the_judgement_uses_each_bound_of_the_plans_objective():
    assert judge_gate(plan(), level(8, 400.0, tpot=40.0)) == []
    assert judge_gate(plan(), level(8, 600.0, tpot=60.0)) == ["TTFT p95 600 ms > 500 ms", "TPOT p95 60.0 ms > 50 ms"]
    assert judge_gate(plan(), level(8, 400.0, ok=15)) == ["error rate 6.2% > 2.0%"]
    # without max_error_rate the default budget is 1%: 1 failure of 16 misses it
    assert judge_gate(plan(objective={"ttft_p95_ms": 500.0}), level(8, 400.0, tpot=99.0, ok=15)) == ["error rate 6.2% > 1.0%"]


def test_the_figures_say_what_was_measured_and_when_the_load_stopped_early():
    measured = LoadLevel("concurrency=8", 8, None, 3, 3, 0.0, 0.5, 4000.0, 12.0, None)
    assert gate_figures(plan(), measured) == ("TTFT p95 4000 ms, TPOT p95 12.0 ms, 3/3 ok, 0.50 req/s "
                                              "(stopped after 3 of 16 requests: the rest could not meet the objective)")  # fmt: skip
    empty = LoadLevel("concurrency=8", 8, None, 16, 0, 1.0, 0.0, None, None, None)
    assert gate_figures(plan(), empty) == "TTFT p95 0 ms, TPOT p95 0.0 ms, 0/16 ok, 0.00 req/s"


def answered(ttft_ms: float) -> RequestRecord:
    return RequestRecord(ok=True, token_times=(ttft_ms / 1000.0, ttft_ms / 1000.0 + 0.01), chunk_tokens=(1, 1), end=ttft_ms / 1000.0 + 0.01,
                         output_tokens=2)  # fmt: skip


FAILED = RequestRecord(ok=False, error_kind="http", error="HTTP 503", status=503)


def test_decided_misses_at_the_edges_of_the_count():
    # 21 planned: the p95 of 21 values is the 20th smallest (rank 19 exactly): 2 misses decide it
    assert decided_miss(plan(21), [answered(900.0)] * 2) is not None
    assert decided_miss(plan(21), [answered(900.0)]) is None
    # 1 planned: its one answer over the bound is the p95
    assert decided_miss(plan(1), [answered(900.0)]) is not None
    assert decided_miss(plan(1), [answered(100.0)]) is None
    # 1 planned, failed: 100% of one request, over a 60% budget
    assert decided_miss(plan(1, {"max_error_rate": 0.6}), [FAILED]) is not None
    # no max_error_rate: 1% by default, so 1 failure of 16 decides it
    assert "1 of 16 requests failed: over 1.0%" in decided_miss(plan(16, {"ttft_p95_ms": 500.0}), [FAILED])
