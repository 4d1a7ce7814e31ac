"""bench/goodput.py: the load one replica sustains with the objective met, from recorded load levels.

The levels are a real `orch bench` sweep (tests/data/bench/sweep-tiny-vllm-cpu.json, see
tests/data/bench/SOURCES.md); every expected value is worked by hand from that file's figures in
the comments, never from the code under test."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator import engine_metrics as prom
from orchestrator.bench.goodput import (
    Goodput,
    LoadLevel,
    gate_concurrency,
    goodput,
    misses,
    replicas_for,
    replicas_that_served,
)
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


# ---- boundaries and defaults (expected values from the captured sweep and Ray's metrics pages) ----

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"


def test_a_level_on_a_bound_meets_it():
    """"Within" the objective: a level exactly at a latency bound or at the error budget meets it."""
    first = levels_of(SWEEP)[0]  # concurrency=1: TTFT p95 201.86 ms, TPOT p95 8.67 ms, no errors
    on_bounds = Slo(ttft_p95_ms=_level("concurrency=1")["ttft_ms"]["p95"], tpot_p95_ms=_level("concurrency=1")["tpot_ms"]["p95"])
    assert misses(first, on_bounds) == []
    # 1 failure in 100 requests with the default 1% budget (manifest Targets.max_error_rate)
    one_in_100 = LoadLevel("concurrency=2", 2, None, 100, 99, 0.01, 3.0, 100.0, 5.0, 300.0)
    assert Targets().max_error_rate == 0.01 and misses(one_in_100, Targets()) == []
    # one request answered of 32 is not "no request succeeded": only its error rate counts
    one = LoadLevel("concurrency=2", 2, None, 32, 1, 31 / 32, 0.1, 100.0, 5.0, 300.0)
    assert misses(one, Targets(max_error_rate=1.0)) == []


def test_a_bound_the_objective_leaves_out_is_not_checked_and_a_level_without_a_figure_is_not_judged_on_it():
    # TTFT p95 842 ms at 16 in flight; only TPOT bounded at 30 ms (16's TPOT p95 is 22.5 ms)
    sixteen = levels_of(SWEEP)[4]
    assert sixteen.label == "concurrency=16"
    assert misses(sixteen, Slo(tpot_p95_ms=30.0)) == []
    assert misses(sixteen, Slo(ttft_p95_ms=800.0)) == ["TTFT p95 842 ms > 800 ms"]
    assert misses(sixteen, Slo(ttft_p95_ms=800.0, tpot_p95_ms=20.0)) == ["TTFT p95 842 ms > 800 ms", "TPOT p95 22.5 ms > 20 ms"]
    no_stream = replace(sixteen, ttft_p95_ms=None, tpot_p95_ms=None)
    assert misses(no_stream, Slo(ttft_p95_ms=1.0, tpot_p95_ms=1.0)) == []


def test_a_level_dict_gives_its_mean_latency_and_rate():
    raw = _level("concurrency=8")
    level = LoadLevel.from_level(raw)
    assert (level.e2e_mean_ms, level.req_per_s, level.rate, level.error_rate) == (raw["e2e_ms"]["mean"], raw["req_per_s"], None, 0.0)
    assert (level.prompt_tokens, level.output_tokens) == (None, None)
    # Little's law: 14.57 req/s x 0.5456 s mean end to end
    assert level.load == 8.0 and level.in_flight == 8.0
    by_rate = replace(level, concurrency=None, rate=16.0)
    assert by_rate.load == 16.0 and by_rate.in_flight == pytest.approx(raw["req_per_s"] * raw["e2e_ms"]["mean"] / 1000)
    # a level where nothing succeeded: bench.report.level_dict writes 0 req/s and empty statistics
    dead = {**raw, "succeeded": 0, "error_rate": 1.0, "req_per_s": 0.0, "e2e_ms": {"count": 0, "mean": None, "p95": None}}
    assert LoadLevel.from_level(dead).req_per_s == 0.0
    assert replace(LoadLevel.from_level(dead), concurrency=None, rate=16.0).in_flight is None


def test_goodput_of_a_rate_level_without_latencies_has_no_concurrency():
    by_rate = LoadLevel("rate=4/s", None, 4.0, 32, 32, 0.0, 3.9, None, None, None)
    found = goodput([by_rate], Slo(ttft_p95_ms=500.0), replicas=1)
    assert found.per_replica_concurrency is None and not found.crossed
    assert found.describe() == "3.90 req/s per replica (3.90 req/s over 1 replica(s), rate=4/s) (every level met the objective: a lower bound)"
    # the SLO gate then sends one request in flight per recorded replica's worth
    assert gate_concurrency(by_rate, 1, 3) == 3


def test_the_described_goodput_names_the_missed_level():
    found = goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=2)
    rps = _level("concurrency=8")["req_per_s"]  # 14.574
    assert found.describe() == (
        f"{rps / 2:.2f} req/s at 4 in flight per replica ({rps:.2f} req/s over 2 replica(s), concurrency=8) "
        "(missed at concurrency=16: TTFT p95 842 ms > 600 ms)"
    )
    data = found.to_dict()
    assert (data["req_per_s"], data["per_replica_req_per_s"], data["per_replica_concurrency"]) == (rps, rps / 2, 4.0)
    assert (data["replicas"], data["crossed"], data["missed_at"], data["missed_because"]) == (2, True, "concurrency=16", ["TTFT p95 842 ms > 600 ms"])
    assert data["level"]["label"] == "concurrency=8"
    assert Goodput.from_dict({**data, "missed_because": None}).why == ()


def test_replicas_for_a_target_below_one_replica_and_on_float_noise():
    assert replicas_for(1.0, 3.0) == 1  # a third of one replica's goodput: still one replica
    assert replicas_for(1.1, 0.1) == 11  # 1.1 / 0.1 = 11.000000000000002 in floats
    for bad in ((0.0, 3.0), (10.0, 0.0), (-1.0, 3.0)):
        with pytest.raises(ValueError):
            replicas_for(*bad)
    with pytest.raises(ValueError):
        goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=0)
    assert goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=1).replicas == 1


def test_the_gate_scales_the_recorded_concurrency_by_replicas():
    eight = levels_of(SWEEP)[3]  # 8 in flight recorded over 2 replicas: 4 each
    assert gate_concurrency(eight, 2, 2) == 8
    assert gate_concurrency(eight, 2, 3) == 12
    assert gate_concurrency(eight, 1, 1) == 8
    assert gate_concurrency(eight, 2, 1) == 4


def _page(name: str):
    return prom.parse_text((METRICS / name).read_text())


def test_replicas_that_served_from_rays_metrics_pages():
    """Ray Serve LLM 2.60 pages of one replica (ReplicaId 75z13c9r) serving the tiny model: 33
    requests done after the first run, 49 after the second; the idle page labels the replica but
    has no success counter yet (tests/data/metrics)."""
    idle, after, after2 = _page("ray-serve-llm-0.32-idle.txt"), _page("ray-serve-llm-0.32-after.txt"), _page("ray-serve-llm-0.32-after2.txt")
    assert replicas_that_served(after, after2) == 1
    assert replicas_that_served(idle, after) == 1
    assert replicas_that_served(after, after2, model="tiny") == 1
    assert replicas_that_served(after, after2, model="another") is None
    assert replicas_that_served(after2, after2) is None  # nothing finished in between
    assert replicas_that_served(after, idle) is None
    assert replicas_that_served(_page("vllm-0.32-before.txt"), _page("vllm-0.32-after.txt")) is None  # bare vLLM: no ReplicaId


def test_a_recorded_goodput_reads_back_with_its_miss():
    # what a revision stores (revisions/<n>.json "goodput") comes back with the level that missed and why
    found = goodput(levels_of(SWEEP), Slo(ttft_p95_ms=600.0), replicas=2)
    again = Goodput.from_dict(json.loads(json.dumps(found.to_dict())))
    assert again == found
    assert (again.missed_at, again.why) == ("concurrency=16", ("TTFT p95 842 ms > 600 ms",))


def test_a_level_missing_both_bounds_gives_both_reasons():
    # concurrency=2: TTFT p95 578.7 ms and TPOT p95 9.04 ms, both past these bounds; concurrency=1 (201.9 / 8.67) meets them
    found = goodput(levels_of(SWEEP), Slo(ttft_p95_ms=500.0, tpot_p95_ms=9.0), replicas=1)
    assert found.why == ("TTFT p95 579 ms > 500 ms", "TPOT p95 9.0 ms > 9 ms")
    assert found.describe().endswith("(missed at concurrency=2: TTFT p95 579 ms > 500 ms, TPOT p95 9.0 ms > 9 ms)")


def test_on_equal_rates_the_lighter_level_is_the_goodput():
    # two levels that served the same rate: the lighter one reached it with fewer requests in flight
    levels = [
        LoadLevel("concurrency=4", 4, None, 16, 16, 0.0, 5.0, 200.0, 10.0, 800.0),
        LoadLevel("concurrency=8", 8, None, 16, 16, 0.0, 5.0, 300.0, 10.0, 1600.0),
    ]
    found = goodput(levels, Slo(ttft_p95_ms=500.0), replicas=1)
    assert (found.level.label, found.per_replica_concurrency) == ("concurrency=4", 4.0)


def test_no_levels_no_goodput_and_bad_arguments_say_what_is_wrong():
    assert goodput([], Slo(ttft_p95_ms=500.0), replicas=1) is None
    with pytest.raises(ValueError, match="^replicas must be at least 1, got 0$"):
        goodput(levels_of(SWEEP), Slo(ttft_p95_ms=500.0), replicas=0)
    with pytest.raises(ValueError, match="^the target rate and the per-replica goodput must be positive$"):
        replicas_for(0.0, 3.0)


def test_the_gate_sends_at_least_one_request():
    one = levels_of(SWEEP)[0]  # 1 in flight recorded over 2 replicas: half a request per replica
    assert gate_concurrency(one, 2, 1) == 1
    assert gate_concurrency(one, 1, 1) == 1


def test_a_rate_level_dict_gives_its_rate():
    # `orch bench --rate 16` writes the offered rate and no concurrency (bench.report.level_dict)
    raw = {**_level("concurrency=8"), "label": "rate=16/s", "concurrency": None, "rate": 16.0}
    level = LoadLevel.from_level(raw)
    assert (level.concurrency, level.rate, level.load) == (None, 16.0, 16.0)


def _two_replicas(page: str, first: float, second: float | None) -> list:
    """A Ray page of two engine replicas: the captured replica's success counter set to ``first``
    and, when ``second`` is given, the same series of a second replica (another ReplicaId)."""
    line = next(ln for ln in page.splitlines() if ln.startswith("ray_vllm_request_success_total{"))
    series, _ = line.rsplit(" ", 1)
    lines = [f"{series} {first}"] + ([f"{series.replace('75z13c9r', 'k2p81qzd')} {second}"] if second is not None else [])
    return prom.parse_text(page.replace(line, "\n".join(lines)))


def test_replicas_that_served_counts_each_replica_by_its_own_counter():
    page = (METRICS / "ray-serve-llm-0.32-after.txt").read_text()
    assert replicas_that_served(_two_replicas(page, 33.0, 20.0), _two_replicas(page, 49.0, 21.0)) == 2
    assert replicas_that_served(_two_replicas(page, 33.0, 20.0), _two_replicas(page, 49.0, 20.0)) == 1
    # a replica that started after the first scrape and finished one request
    assert replicas_that_served(_two_replicas(page, 33.0, None), _two_replicas(page, 49.0, 1.0)) == 2
