"""Prometheus text parsing and histogram deltas on /metrics pages captured from a real vLLM 0.32
server (tests/data/metrics: `before` then 8 completions of 16 tokens, then `after`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from orchestrator import engine_metrics as prom

DATA = Path(__file__).resolve().parents[1] / "data" / "metrics"


@pytest.fixture(scope="module")
def pages():
    before = prom.parse_text((DATA / "vllm-0.32-before.txt").read_text())
    after = prom.parse_text((DATA / "vllm-0.32-after.txt").read_text())
    return before, after


def test_parse_real_page_reads_labels_and_values(pages):
    _, after = pages
    gen = [s for s in after if s.name == "vllm:generation_tokens_total"]
    assert len(gen) == 1
    assert gen[0].label("model_name") == "tiny" and gen[0].label("engine") == "0"
    assert gen[0].value == 136.0


def test_histogram_delta_counts_exactly_the_run(pages):
    before, after = pages
    for name in (prom.TTFT, prom.TPOT):
        delta = prom.histogram(after, name, {"model_name": "tiny"}).minus(prom.histogram(before, name, {"model_name": "tiny"}))
        assert delta.count == 8  # the 8 requests sent between the two scrapes
        assert delta.buckets[-1] == (math.inf, 8.0)
        assert all(a[1] <= b[1] for a, b in zip(delta.buckets, delta.buckets[1:]))  # cumulative
        assert 0 < delta.mean < 1.0
    assert prom.counter(after, "vllm:generation_tokens") - prom.counter(before, "vllm:generation_tokens") == 128


def test_histogram_quantile_interpolates_inside_the_bucket():
    h = prom.Histogram("x", ((0.1, 2.0), (0.2, 6.0), (math.inf, 8.0)), 1.0, 8.0)
    assert h.quantile(0.5) == pytest.approx(0.1 + 0.1 * (4 - 2) / 4)  # rank 4 inside (0.1, 0.2]
    assert h.quantile(0.1) == pytest.approx(0.1 * 0.8 / 2)  # first bucket interpolates from 0
    assert h.quantile(1.0) == 0.2  # the +Inf bucket answers the last finite bound
    assert prom.Histogram("x", (), 0.0, 0.0).quantile(0.5) is None and prom.Histogram("x", (), 0.0, 0.0).mean is None


def test_counter_reset_between_scrapes_keeps_the_later_page():
    later = prom.Histogram("x", ((1.0, 1.0), (math.inf, 1.0)), 0.5, 1.0)
    earlier = prom.Histogram("x", ((1.0, 5.0), (math.inf, 5.0)), 2.0, 5.0)
    assert later.minus(earlier) is later


def test_ray_spelling_of_the_same_metric_is_found():
    # Ray Serve LLM: vLLM's RayPrometheusMetric sanitises ':' to '_' and Ray prefixes 'ray_'.
    page = "\n".join(
        [
            "# HELP ray_vllm_time_to_first_token_seconds Histogram of time to first token in seconds.",
            "# TYPE ray_vllm_time_to_first_token_seconds histogram",
            'ray_vllm_time_to_first_token_seconds_bucket{Component="core_worker",ReplicaId="abc",engine="0",le="0.1",model_name="tiny"} 3.0',
            'ray_vllm_time_to_first_token_seconds_bucket{Component="core_worker",ReplicaId="abc",engine="0",le="+Inf",model_name="tiny"} 4.0',
            'ray_vllm_time_to_first_token_seconds_sum{Component="core_worker",ReplicaId="abc",engine="0",model_name="tiny"} 0.5',
            'ray_vllm_time_to_first_token_seconds_count{Component="core_worker",ReplicaId="abc",engine="0",model_name="tiny"} 4.0',
        ]
    )
    h = prom.histogram(prom.parse_text(page), prom.TTFT, {"model_name": "tiny"})
    assert h.name == "ray_vllm_time_to_first_token_seconds"
    assert h.count == 4 and h.mean == 0.125
    assert prom.histogram(prom.parse_text(page), prom.TTFT, {"model_name": "other"}) is None


def test_series_of_several_replicas_are_summed():
    page = "\n".join(
        f'vllm:time_to_first_token_seconds_{suffix}{{engine="{e}",model_name="m"{le}}} {v}'
        for e in ("0", "1")
        for suffix, le, v in (("bucket", ',le="0.5"', 1), ("bucket", ',le="+Inf"', 2), ("sum", "", 0.7), ("count", "", 2))
    )
    h = prom.histogram(prom.parse_text(page), prom.TTFT)
    assert h.count == 4 and h.buckets == ((0.5, 2.0), (math.inf, 4.0)) and h.sum == pytest.approx(1.4)


def test_label_escapes_timestamps_and_special_values():
    s = prom.parse_text('m{a="x\\"y",b="1\\\\2"} +Inf 1700000000000\nn NaN\nk -Inf')
    assert s[0].label("a") == 'x"y' and s[0].label("b") == "1\\2" and s[0].value == math.inf
    assert math.isnan(s[1].value) and s[2].value == -math.inf


@pytest.mark.parametrize("bad", ['m{a="x} 1', "m", 'm{a=1} 2', "m abc"])
def test_malformed_lines_raise(bad):
    with pytest.raises(prom.MetricsFormatError):
        prom.parse_text(bad)


def test_bin_samples_uses_the_server_buckets():
    h = prom.bin_samples([0.05, 0.15, 0.15, 3.0], [0.1, 0.2, 1.0])
    assert h.buckets == ((0.1, 1.0), (0.2, 3.0), (1.0, 3.0), (math.inf, 4.0))
    assert h.count == 4 and h.sum == pytest.approx(3.35)


def test_real_ray_serve_llm_export_is_read_under_its_ray_name():
    # Captured from a Ray node's metrics export port while Ray Serve LLM (vLLM 0.32) served the
    # tiny model: vLLM's histograms appear as ray_vllm_* with Ray's own labels added.
    after = prom.parse_text((DATA / "ray-serve-llm-0.32-after.txt").read_text())
    after2 = prom.parse_text((DATA / "ray-serve-llm-0.32-after2.txt").read_text())
    for name in (prom.TTFT, prom.TPOT):
        h1 = prom.histogram(after, name, {"model_name": "tiny"})
        h2 = prom.histogram(after2, name, {"model_name": "tiny"})
        assert h1.name.startswith("ray_vllm_") and (h1.count, h2.count) == (33, 49)
        assert h1.buckets[-1] == (math.inf, 33.0)
        delta = h2.minus(h1)
        assert delta.count == 16 and 0 < delta.mean < 5 and delta.quantile(0.5) is not None
    idle = prom.parse_text((DATA / "ray-serve-llm-0.32-idle.txt").read_text())
    assert prom.histogram(idle, prom.TTFT, {"model_name": "tiny"}) is None  # no request yet: no series


def test_ray_export_sum_is_the_bucket_midpoint_estimate_and_vllm_own_is_not(pages):
    # Ray rebuilds exported histograms from bucket counts at the midpoints
    # (open_telemetry_metric_recorder.record_histogram_aggregated_batch), so under Ray Serve LLM
    # sum/count is not a measured mean; vLLM's own /metrics has the real sum.
    after = prom.parse_text((DATA / "ray-serve-llm-0.32-after.txt").read_text())
    after2 = prom.parse_text((DATA / "ray-serve-llm-0.32-after2.txt").read_text())
    for name in (prom.TTFT, prom.TPOT):
        delta = prom.histogram(after2, name, {"model_name": "tiny"}).minus(prom.histogram(after, name, {"model_name": "tiny"}))
        assert delta.sum_from_midpoints, (name, delta.mean, delta.midpoint_mean())
    before, bare_after = pages
    for name in (prom.TTFT, prom.TPOT):
        delta = prom.histogram(bare_after, name, {"model_name": "tiny"}).minus(prom.histogram(before, name, {"model_name": "tiny"}))
        assert not delta.sum_from_midpoints and delta.midpoint_mean() is not None


def test_midpoint_mean():
    h = prom.Histogram("x", ((0.1, 2.0), (0.2, 6.0), (math.inf, 6.0)), 2 * 0.05 + 4 * 0.15, 6.0)
    assert h.midpoint_mean() == pytest.approx((2 * 0.05 + 4 * 0.15) / 6) and h.sum_from_midpoints
    assert not prom.Histogram("x", ((0.1, 2.0), (0.2, 6.0), (math.inf, 6.0)), 0.5, 6.0).sum_from_midpoints
    assert prom.Histogram("x", ((0.1, 2.0), (math.inf, 3.0)), 1.0, 3.0).midpoint_mean() is None  # one beyond the last bound


# ---- behaviour the mutation run (issue 17) showed untested; values worked by hand from the
# ---- Prometheus definitions (histogram_quantile in promql/quantile.go, `le` is inclusive)


def test_ray_spelling_replaces_every_non_identifier_character():
    # vLLM's RayPrometheusMetric: ':' -> '_' (the captured ray_vllm_* pages), Ray adds 'ray_'
    assert prom.name_variants(prom.TTFT) == (
        "vllm:time_to_first_token_seconds",
        "vllm_time_to_first_token_seconds",
        "ray_vllm_time_to_first_token_seconds",
    )


def test_a_malformed_page_says_it_is_not_prometheus_text():
    with pytest.raises(prom.MetricsFormatError, match="not Prometheus text format"):
        prom.parse_text("m abc")


def test_delta_keeps_the_name_and_counts_a_bucket_the_earlier_scrape_lacked():
    earlier = prom.Histogram("h", ((0.1, 1.0), (math.inf, 1.0)), 0.05, 1.0)
    later = prom.Histogram("h", ((0.1, 1.0), (0.5, 3.0), (math.inf, 3.0)), 0.65, 3.0)
    delta = later.minus(earlier)
    assert delta.name == "h"
    assert delta.buckets == ((0.1, 0.0), (0.5, 3.0), (math.inf, 2.0))  # 0.5 absent before: counted from 0
    assert (delta.count, delta.sum) == (2.0, pytest.approx(0.6))


def test_no_request_between_two_scrapes_gives_an_empty_delta():
    after = prom.parse_text((DATA / "ray-serve-llm-0.32-after.txt").read_text())
    h = prom.histogram(after, prom.TTFT, {"model_name": "tiny"})
    delta = h.minus(h)  # equal counts are no counter reset
    assert delta.count == 0 and all(c == 0 for _, c in delta.buckets)
    assert delta.mean is None and delta.midpoint_mean() is None and delta.quantile(0.5) is None


def test_a_single_observation_has_a_mean_midpoint_and_quantile():
    h = prom.Histogram("x", ((0.1, 0.0), (0.2, 1.0), (math.inf, 1.0)), 0.15, 1.0)
    assert h.mean == 0.15
    assert h.midpoint_mean() == pytest.approx(0.15)  # midpoint of (0.1, 0.2]
    assert h.quantile(0.5) == pytest.approx(0.15)  # rank 0.5 halfway through (0.1, 0.2]


def test_quantile_accepts_exactly_0_and_1_and_refuses_beyond():
    h = prom.Histogram("x", ((0.1, 0.0), (0.2, 3.0), (math.inf, 3.0)), 0.45, 3.0)
    assert h.quantile(0) == pytest.approx(0.1)  # rank 0: the lower edge of the first non-empty bucket
    assert h.quantile(1) == pytest.approx(0.2)
    for q in (-0.01, 1.01, 1.5, 2):
        with pytest.raises(ValueError, match="quantile must be within 0..1"):
            h.quantile(q)


def test_quantile_of_a_rank_that_ends_a_bucket_is_that_bucket_bound():
    # cumulative 2, 2, 4: rank 2 (q 0.5) is reached at le=0.1 (Prometheus: the first bucket with
    # count >= rank), not in the later bucket after the empty one
    h = prom.Histogram("x", ((0.1, 2.0), (0.2, 2.0), (0.5, 4.0), (math.inf, 4.0)), 0.6, 4.0)
    assert h.quantile(0.5) == pytest.approx(0.1)
    assert h.quantile(0.75) == pytest.approx(0.2 + 0.3 * 1 / 2)


def test_quantile_past_the_buckets_answers_the_last_finite_bound():
    # _count larger than the +Inf bucket (a series that exports _count without buckets)
    h = prom.Histogram("x", ((0.1, 1.0), (math.inf, 1.0)), 0.05, 2.0)
    assert h.quantile(1.0) == 0.1


def test_histogram_skips_a_bucket_without_le_and_reads_one_with_only_buckets():
    samples = [
        prom.Sample("x_bucket", (), 7.0),  # no le: not a bucket
        prom.Sample("x_bucket", (("le", "0.1"),), 2.0),
        prom.Sample("x_bucket", (("le", "+Inf"),), 3.0),
    ]
    h = prom.histogram(samples, "x")
    assert h is not None and h.buckets == ((0.1, 2.0), (math.inf, 3.0))
    assert (h.sum, h.count) == (0.0, 0.0)  # no _sum/_count series on that page


def test_counter_is_summed_over_the_series_its_labels_select():
    page = "\n".join(
        [
            'vllm:generation_tokens_total{engine="0",model_name="a"} 10',
            'vllm:generation_tokens_total{engine="0",model_name="b"} 5',
        ]
    )
    samples = prom.parse_text(page)
    assert prom.counter(samples, "vllm:generation_tokens", {"model_name": "b"}) == 5
    assert prom.counter(samples, "vllm:generation_tokens") == 15
    assert prom.counter(samples, "vllm:generation_tokens", {"model_name": "c"}) is None


def test_bin_samples_bounds_are_inclusive_and_empty_buckets_stay_empty():
    h = prom.bin_samples([0.1, 0.5], [0.05, 0.1, 1.0])
    assert h.name == "client"
    assert h.buckets == ((0.05, 0.0), (0.1, 1.0), (1.0, 2.0), (math.inf, 2.0))  # 0.1 is in le="0.1"
    assert prom.bin_samples([0.3], [0.1], name="orch").name == "orch"
