"""crosscheck: orch's client figures against vLLM's histograms of the same run."""

from __future__ import annotations

import pytest

from orchestrator import engine_metrics as prom
from orchestrator.bench.crosscheck import compare_figure

BOUNDS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1)


def page(observations: list[float], total: float | None = None) -> list[prom.Sample]:
    """A vLLM-style TTFT histogram holding ``observations`` (sum: theirs, or ``total``)."""
    lines = []
    for le in BOUNDS:
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="tiny"}} {sum(o <= le for o in observations)}')
    lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="tiny"}} {len(observations)}')
    lines.append(f'vllm:time_to_first_token_seconds_sum{{model_name="tiny"}} {sum(observations) if total is None else total}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{model_name="tiny"}} {len(observations)}')
    return prom.parse_text("\n".join(lines) + "\n")


SERVER = [0.041, 0.043, 0.045, 0.047, 0.049, 0.051, 0.053, 0.055]


def test_medians_through_the_same_buckets_give_the_verdict():
    client = [v + 0.002 for v in SERVER]  # orch's clock starts a little earlier
    c = compare_figure("ttft", client, page([]), page(SERVER), prom.TTFT)
    assert (c.server_count, c.client_count) == (8, 8)
    assert c.server_median == pytest.approx(0.05) and c.agrees is True
    assert c.mean_diff == pytest.approx(0.002 / 0.048) and not c.server_mean_estimated


def test_medians_apart_differ_even_when_means_are_close():
    client = [0.012] * 4 + [0.085] * 4  # mean 0.0485, as the server's; median in another bucket
    c = compare_figure("ttft", client, page([]), page(SERVER), prom.TTFT)
    assert abs(c.mean_diff) < 0.02 and c.agrees is False


def test_a_midpoint_sum_is_flagged_and_does_not_decide():
    # Ray's export: every observation at its bucket's midpoint (0.05 here): the server's "mean" is
    # an estimate; the medians still agree.
    c = compare_figure("ttft", [v + 0.001 for v in SERVER], page([]), page(SERVER, total=8 * 0.05), prom.TTFT)
    assert c.server_mean_estimated and c.server_mean == pytest.approx(0.05) and c.agrees is True


def test_no_server_data_is_no_verdict():
    c = compare_figure("ttft", SERVER, page(SERVER), page(SERVER), prom.TTFT)
    assert c.server_count == 0 and c.agrees is None


def _metrics(name: str) -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parent.parent / "data" / "metrics" / name).read_text()


def test_a_page_without_the_engines_figures_yet_is_not_settled():
    # Ray's metrics page of a fresh Serve LLM engine (captured) has no vLLM series until its first
    # export: a bench level that finished 4 requests must keep scraping, not read an empty page.
    from orchestrator.bench.crosscheck import settled

    idle = _metrics("ray-serve-llm-0.32-idle.txt")
    assert not settled(idle, idle, 4)
    assert settled(idle, idle, 0)


def test_settled_when_the_after_page_counts_the_levels_requests():
    # vLLM 0.32's own pages: request_time_per_output_token_seconds_count 2.0 before, 10.0 after.
    from orchestrator.bench.crosscheck import settled

    before, after = _metrics("vllm-0.32-before.txt"), _metrics("vllm-0.32-after.txt")
    assert settled(before, after, 8, "tiny")
    assert not settled(before, after, 9, "tiny")
