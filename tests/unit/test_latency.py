"""Latency statistics: percentiles, the seed's TPOT formula, N = 1, empty and all-failed levels,
seeded Poisson arrivals."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.bench.latency import (
    Distribution,
    RequestRecord,
    parse_levels,
    percentile,
    poisson_arrivals,
    summarize,
    tpot,
)


def test_percentile_interpolates_between_closest_ranks():
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile(xs, 0) == 10.0
    assert percentile(xs, 100) == 40.0
    assert percentile(xs, 50) == 25.0  # halfway between ranks 1 and 2
    assert percentile(xs, 95) == pytest.approx(38.5)  # (n-1)*0.95 = 2.85 -> 30 + 0.85*10
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_percentile_ignores_input_order_and_rejects_bad_q():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    with pytest.raises(ValueError):
        percentile([1.0], 101)


@settings(deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200), st.floats(0, 100))
def test_percentile_matches_numpy_linear_method(xs, q):
    import numpy as np

    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q, method="linear")), rel=1e-9, abs=1e-9)


def test_tpot_is_the_seed_formula():
    # seed 000's example: TTFT 0.5 s, TPOT 40 ms, 201 tokens -> total 8.5 s
    assert tpot(8.5, 0.5, 201) == pytest.approx(0.04)


def test_tpot_undefined_for_a_single_token_not_a_division_by_zero():
    assert tpot(0.3, 0.3, 1) is None
    assert tpot(0.3, 0.3, 0) is None
    rec = RequestRecord(ok=True, token_times=(0.3,), chunk_tokens=(1,), end=0.31, output_tokens=1)
    assert rec.ttft == 0.3
    assert rec.tpot is None
    assert rec.itls == ()


def test_record_figures_from_token_arrival_times():
    rec = RequestRecord(ok=True, token_times=(0.1, 0.15, 0.25, 0.3), chunk_tokens=(1, 1, 1, 1), end=0.32, output_tokens=4)
    assert rec.ttft == 0.1
    assert rec.t_total == 0.3
    assert rec.tpot == pytest.approx((0.3 - 0.1) / 3)
    assert rec.itls == pytest.approx((0.05, 0.1, 0.05))


def test_tpot_uses_the_server_token_count_when_chunks_carry_several_tokens():
    # 2 chunks carrying 5 tokens each: N = 10, not 2
    rec = RequestRecord(ok=True, token_times=(0.1, 0.19), chunk_tokens=(5, 5), end=0.2, output_tokens=10)
    assert rec.tpot == pytest.approx(0.01)


def test_summarize_counts_errors_by_kind_and_rates():
    ok = [
        RequestRecord(ok=True, token_times=(0.1 * i, 0.1 * i + 0.09), chunk_tokens=(1, 1), end=0.1 * i + 0.1, output_tokens=10, prompt_tokens=5)
        for i in range(1, 9)
    ]
    bad = [
        RequestRecord(ok=False, error_kind="http", error="HTTP 503"),
        RequestRecord(ok=False, error_kind="http", error="HTTP 503"),
        RequestRecord(ok=False, error_kind="timeout", error="ReadTimeout"),
    ]
    s = summarize(ok + bad, duration_s=2.0, label="concurrency=4", concurrency=4)
    assert (s.label, s.concurrency, s.rate, s.requests, s.succeeded, s.failed) == ("concurrency=4", 4, None, 11, 8, 3)
    assert s.errors == {"http": 2, "timeout": 1}
    assert s.error_rate == pytest.approx(3 / 11)
    assert s.output_tokens == 80 and s.output_tok_per_s == 40.0
    assert s.req_per_s == 4.0
    assert s.ttft.count == 8
    assert s.ttft.p50 == pytest.approx(statistics.median([0.1 * i for i in range(1, 9)]))
    assert s.tpot.mean == pytest.approx(0.01)
    assert "http: HTTP 503" in s.error_samples


def test_summarize_empty_and_all_failed_levels():
    empty = summarize([], duration_s=0.0, label="x")
    assert empty.requests == 0 and empty.error_rate == 0.0 and empty.ttft.p95 is None and empty.output_tok_per_s == 0.0
    failed = summarize([RequestRecord(ok=False, error_kind="connection", error="refused")] * 3, 1.0, "y")
    assert failed.error_rate == 1.0 and failed.succeeded == 0
    assert failed.ttft == Distribution(0, None, None, None, None, None, None)
    assert failed.tpot.as_ms()["p95"] is None


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate():
    a = poisson_arrivals(50.0, 4000, random.Random(7))
    assert a == poisson_arrivals(50.0, 4000, random.Random(7))
    assert a != poisson_arrivals(50.0, 4000, random.Random(8))
    assert all(x < y for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip([0.0, *a], a)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50.0, rel=0.05)
    # exponential gaps: standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 50.0, rel=0.1)
    with pytest.raises(ValueError):
        poisson_arrivals(0, 3, random.Random(0))


def test_parse_levels():
    assert parse_levels("1,4, 16,64") == [1, 4, 16, 64]
    for bad in ("", "0", "a,2", "-1"):
        with pytest.raises(ValueError):
            parse_levels(bad)


def test_distribution_of_1_to_100_as_numpy_linear_gives_it():
    # numpy.percentile(np.arange(1, 101), [50, 95, 99]) -> 50.5, 95.05, 99.01 (method "linear").
    d = Distribution.of([*range(100, 0, -1), None])  # unsorted, and a request without the figure
    assert (d.count, d.mean, d.min, d.max) == (100, 50.5, 1, 100)
    assert (d.p50, d.p95, d.p99) == (pytest.approx(50.5), pytest.approx(95.05), pytest.approx(99.01))


def test_seed_tpot_edges():
    # Seed 000: TPOT = (t_total - TTFT) / (N - 1); undefined for N <= 1 or a missing time.
    assert tpot(1.5, 0.5, 2) == 1.0
    assert tpot(None, 0.5, 8) is None and tpot(1.5, None, 8) is None and tpot(1.5, 0.5, 1) is None


def test_input_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"^concurrency levels must be positive integers, got '0'$"):
        parse_levels("1,0")
    with pytest.raises(ValueError, match="^no concurrency level given$"):
        parse_levels(" , ")
    assert parse_levels("1,,4, 16") == [1, 4, 16]  # empty parts are skipped, not the end
    with pytest.raises(ValueError, match=r"^percentile q must be within 0\.\.100, got 101$"):
        percentile([1.0], 101)
    with pytest.raises(ValueError, match=r"^rate must be > 0, got 0$"):
        poisson_arrivals(0, 3, random.Random(1))
    assert len(poisson_arrivals(0.5, 3, random.Random(1))) == 3  # a rate below one per second is fine


def test_summarize_a_short_rate_level_with_diagnostics_and_many_errors():
    # Two successes within half a second: the rates are per second of the level (4 tokens / 0.5 s), prompt
    # tokens add up where the server reported them, and the header and server TTFT diagnostics summarise
    # like any other figure. Failures: counted by kind ("unknown" when none was found), and the first five
    # distinct "kind: error" lines kept in arrival order as samples.
    ok = [
        RequestRecord(ok=True, token_times=(0.2, 0.3), chunk_tokens=(1, 1), end=0.35, output_tokens=2,
                      prompt_tokens=128, headers_at=0.05, server_ttft=0.12),
        RequestRecord(ok=True, token_times=(0.4, 0.6), chunk_tokens=(1, 1), end=0.7, output_tokens=2,
                      prompt_tokens=None, headers_at=0.15, server_ttft=0.3),
    ]  # fmt: skip
    bad = [RequestRecord(ok=False, error_kind="http", error="HTTP 500")] * 2
    bad += [RequestRecord(ok=False, error_kind="http", error=f"HTTP 50{i}") for i in (2, 3, 4)]
    bad += [
        RequestRecord(ok=False, error="IncompleteRead"),
        RequestRecord(ok=False, error_kind="timeout", error="ReadTimeout"),
    ]
    s = summarize(ok + bad, duration_s=0.5, label="rate=2.0/s", rate=2.0)
    assert (s.label, s.concurrency, s.rate, s.duration_s) == ("rate=2.0/s", None, 2.0, 0.5)
    assert (s.requests, s.succeeded, s.failed, s.output_tokens, s.prompt_tokens) == (9, 2, 7, 4, 128)
    assert (s.output_tok_per_s, s.req_per_s) == (8.0, 4.0)
    assert s.errors == {"http": 5, "timeout": 1, "unknown": 1}
    assert s.error_samples == (
        "http: HTTP 500",
        "http: HTTP 502",
        "http: HTTP 503",
        "http: HTTP 504",
        "unknown: IncompleteRead",
    )
    assert (s.headers.count, s.headers.min, s.headers.max) == (2, 0.05, 0.15)
    assert s.headers.mean == pytest.approx(0.1)
    assert (s.server_ttft.count, s.server_ttft.min, s.server_ttft.max) == (2, 0.12, 0.3)
    assert s.server_ttft.p50 == pytest.approx(0.21)
    assert (s.e2e.min, s.e2e.max) == (0.35, 0.7) and s.ttft.p50 == pytest.approx(0.3)
    assert s.itl.count == 2 and (s.itl.min, s.itl.max) == (pytest.approx(0.1), pytest.approx(0.2))  # 0.3 - 0.2, 0.6 - 0.4
