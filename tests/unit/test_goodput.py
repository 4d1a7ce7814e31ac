"""bench/goodput.py: the load one replica sustains with the objective met, from recorded load levels.

The levels are a real `orch bench` sweep (tests/data/bench/sweep-tiny-vllm-cpu.json, see
tests/data/bench/SOURCES.md); every expected value is worked by hand from that file's figures in
the comments, never from the code under test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.bench.goodput import Goodput, LoadLevel, goodput, misses, replicas_for
from orchestrator.manifest.sections import Slo, Targets
from orchestrator.workflows.load_record import levels_of

SWEEP = json.loads((Path(__file__).resolve().parents[1] / "data" / "bench" / "sweep-tiny-vllm-cpu.json").read_text())


def test_the_captured_levels_are_read_as_recorded():
    levels = levels_of(SWEEP)
    assert [lv.label for lv in levels] == [lv["label"] for lv in SWEEP["levels"]]
    first = levels[0]
    raw = SWEEP["levels"][0]
    assert (first.concurrency, first.requests, first.succeeded, first.req_per_s) == (raw["concurrency"], raw["requests"], raw["succeeded"], raw["req_per_s"])
    assert (first.ttft_p95_ms, first.tpot_p95_ms, first.prompt_tokens, first.output_tokens) == (raw["ttft_ms"]["p95"], raw["tpot_ms"]["p95"], 64, 32)


def test_a_level_after_the_first_miss_does_not_count_even_when_it_passes():
    # 4 in flight missed (TTFT 900 > 500); 8 in flight happened to pass with more req/s: the line
    # was found at 4, so the goodput is 2 in flight, 3.0 req/s.
    levels = [
        LoadLevel("concurrency=2", 2, None, 16, 16, 0.0, 3.0, 200.0, 10.0, 600.0),
        LoadLevel("concurrency=4", 4, None, 16, 16, 0.0, 5.0, 900.0, 10.0, 800.0),
        LoadLevel("concurrency=8", 8, None, 16, 16, 0.0, 7.0, 450.0, 10.0, 900.0),
    ]
    found = goodput(levels, Slo(ttft_p95_ms=500.0), replicas=1)
    assert (found.level.label, found.req_per_s, found.missed_at, found.why) == ("concurrency=2", 3.0, "concurrency=4", ("TTFT p95 900 ms > 500 ms",))
    # the walk goes by load, not by the order the levels were given in
    assert goodput(list(reversed(levels)), Slo(ttft_p95_ms=500.0), replicas=1) == found
    # even the lightest level missing: no goodput
    assert goodput(levels, Slo(ttft_p95_ms=100.0), replicas=1) is None


def test_errors_past_the_budget_are_a_miss_and_a_level_without_answers_is_one():
    failing = LoadLevel("concurrency=2", 2, None, 32, 31, 1 / 32, 3.0, 100.0, 5.0, 300.0)
    assert misses(failing, Targets(max_error_rate=0.01)) == ["error rate 3.1% > 1.0%"]  # 1 of 32
    assert misses(failing, Targets(max_error_rate=0.05)) == []
    dead = LoadLevel("concurrency=2", 2, None, 32, 0, 1.0, 0.0, None, None, None)
    assert misses(dead, Targets()) == ["no request succeeded"]


def test_per_replica_figures_and_replicas_for_a_target():
    level = LoadLevel("concurrency=8", 8, None, 32, 32, 0.0, 6.0, 300.0, 20.0, 1200.0)
    found = Goodput(level, replicas=2, crossed=True)
    assert (found.per_replica_req_per_s, found.per_replica_concurrency) == (3.0, 4.0)  # 6 / 2, 8 / 2
    by_rate = LoadLevel("rate=4/s", None, 4.0, 32, 32, 0.0, 3.9, 300.0, 20.0, 1500.0)
    assert Goodput(by_rate, 1, False).per_replica_concurrency == pytest.approx(5.85)  # Little: 3.9/s x 1.5 s
    assert replicas_for(10.0, 3.0) == 4  # 3.33 -> 4
    assert replicas_for(9.0, 3.0) == 3
    assert Goodput.from_dict(found.to_dict()) == found


def _level(label: str) -> dict:
    return next(lv for lv in SWEEP["levels"] if lv["label"] == label)


def test_the_captured_sweeps_goodput_stops_at_the_first_miss_not_at_a_later_lucky_level():
    # TTFT p95 by level (ms): 1: 201.9, 2: 578.7, 4: 386.3, 8: 239.8, 16: 842.4, 32: 263.2.
    # Within 600 ms every level up to 8 passes and 16 misses; 32 passes again (with 57.7 req/s),
    # but after the first miss it does not count. The best of 1..8 by req/s is 8 in flight.
    found = goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=1)
    assert found.level.label == "concurrency=8" and found.req_per_s == _level("concurrency=8")["req_per_s"]
    assert (found.crossed, found.missed_at, found.why) == (True, "concurrency=16", ("TTFT p95 842 ms > 600 ms",))
    assert found.per_replica_concurrency == 8.0
    # Had it been two replicas serving: half the rate, 4 in flight each.
    two = goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=2)
    assert (two.per_replica_req_per_s, two.per_replica_concurrency) == (_level("concurrency=8")["req_per_s"] / 2, 4.0)
    # 40 req/s at 14.57 req/s per replica: 2.74 -> 3 replicas.
    assert replicas_for(40.0, found.per_replica_req_per_s) == 3


@pytest.mark.parametrize(("objective", "label", "missed_at", "why"), [
    (Slo(ttft_p95_ms=500.0), "concurrency=1", "concurrency=2", ("TTFT p95 579 ms > 500 ms",)),  # 578.7 at 2
    (Slo(tpot_p95_ms=20.0), "concurrency=4", "concurrency=8", ("TPOT p95 24.8 ms > 20 ms",)),  # TPOT p95 24.79 at 8
    (Slo(ttft_p95_ms=1000.0, tpot_p95_ms=30.0), "concurrency=32", None, ()),  # nothing missed: the most req/s, a lower bound
])  # fmt: skip
def test_the_captured_sweep_under_other_objectives(objective, label, missed_at, why):
    found = goodput(levels_of(SWEEP), objective, replicas=1)
    assert (found.level.label, found.missed_at, found.why, found.crossed) == (label, missed_at, why, missed_at is not None)
    assert found.req_per_s == _level(label)["req_per_s"]


def test_the_captured_sweep_misses_from_the_lightest_level_on():
    assert goodput(levels_of(SWEEP), Slo(ttft_p95_ms=150.0), replicas=1) is None  # 201.9 ms at 1 in flight
