"""The SLO gate ends a candidate's load once the objective can no longer be met
(``slo_gate.decided_miss``), and the load generator stops a level when told (``stop``).

The oracle for "whatever the rest do" is numpy's percentile (linear interpolation, the method
``bench.latency.percentile`` documents), not the code under test: every decided miss is checked
against the completions of the remaining requests that give the lowest p95 and error rate."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import numpy
import pytest

from orchestrator.bench.goodput import LoadLevel
from orchestrator.bench.latency import RequestRecord
from orchestrator.bench.loadgen import ClientPool, Prompt, RequestSpec, run_concurrency
from orchestrator.serve.slo_gate import GatePlan, decided_miss, gate_figures

LEVEL = LoadLevel("concurrency=8", 8, None, 16, 16, 0.0, 4.0, 100.0, 10.0, None)


def plan(requests: int = 16, ttft: float | None = 500.0, tpot: float | None = None, max_error_rate: float = 0.01) -> GatePlan:
    return GatePlan(recorded_revision=1, level=LEVEL, recorded_replicas=1, candidate_replicas=1, concurrency=8, requests=requests,
                    objective={"ttft_p95_ms": ttft, "tpot_p95_ms": tpot, "max_error_rate": max_error_rate})  # fmt: skip


def answered(ttft_ms: float, tpot_ms: float = 10.0, tokens: int = 5) -> RequestRecord:
    first = ttft_ms / 1000.0
    times = tuple(first + i * tpot_ms / 1000.0 for i in range(tokens))
    return RequestRecord(ok=True, token_times=times, chunk_tokens=(1,) * tokens, end=times[-1], output_tokens=tokens)


FAILED = RequestRecord(ok=False, error_kind="http", error="HTTP 503", status=503)


def p95(values_ms: list[float]) -> float:
    return float(numpy.percentile(values_ms, 95))  # numpy's default method is "linear"


# 16 planned requests: the p95 of 16 values lies between the 15th and 16th smallest (rank 14.25),
# so two answers over the bound decide it; one does not (14 answers at 0 ms and the one miss at
# 1,000 ms give a p95 of 250 ms, under 500).
@pytest.mark.parametrize("over, decided", [(0, False), (1, False), (2, True), (5, True)])
def test_sixteen_requests_are_decided_by_the_second_ttft_over_the_bound(over, decided):
    records = [answered(1000.0)] * over + [answered(100.0)] * 3
    why = decided_miss(plan(), records)
    assert (why is not None) == decided, why
    if decided:
        assert "TTFT p95 over 500 ms" in why
    assert p95([1000.0] * 1 + [0.0] * 15) <= 500.0  # the one-miss case can still pass


def test_a_ttft_at_the_bound_is_not_a_miss():
    assert decided_miss(plan(), [answered(500.0)] * 10) is None
    assert decided_miss(plan(), [answered(500.001)] * 2) is not None


def test_failures_decide_once_their_share_of_the_planned_requests_is_over_the_budget():
    # 1 failure of 16 is 6.25%: over a 5% budget, within a 10% one; 2 of 16 (12.5%) is over 10%.
    assert decided_miss(plan(max_error_rate=0.05), [FAILED]) is not None
    assert decided_miss(plan(max_error_rate=0.10), [FAILED]) is None
    assert decided_miss(plan(max_error_rate=0.10), [FAILED, FAILED]) is not None
    # exactly at the budget is within it: 1 of 20 at 5%
    assert decided_miss(plan(requests=20, max_error_rate=0.05), [FAILED]) is None
    assert "1 of 16 requests failed" in decided_miss(plan(max_error_rate=0.05), [FAILED])


def test_failures_leave_fewer_answers_to_save_the_p95():
    # 20 planned: p95 at rank 18.05, two misses needed; with 15 failures only 5 answers can come,
    # p95 at rank 3.8: two misses are the top two of five, over the bound.
    assert decided_miss(plan(requests=20, max_error_rate=1.0), [answered(900.0)]) is None
    assert decided_miss(plan(requests=20, max_error_rate=1.0), [FAILED] * 15 + [answered(900.0)]) is None
    assert decided_miss(plan(requests=20, max_error_rate=1.0), [FAILED] * 15 + [answered(900.0)] * 2) is not None


def test_tpot_decides_like_ttft_and_unset_bounds_never_do():
    slow = [answered(10.0, tpot_ms=80.0)] * 2
    assert "TPOT p95 over 50 ms" in decided_miss(plan(ttft=None, tpot=50.0), slow)
    assert decided_miss(plan(ttft=None, tpot=None), slow * 8) is None
    one_token = [answered(10.0, tpot_ms=80.0, tokens=1)] * 4  # no TPOT for a 1-token answer
    assert decided_miss(plan(ttft=None, tpot=50.0), one_token) is None


@pytest.mark.parametrize("requests", [1, 2, 3, 5, 16, 20, 21, 40])
def test_every_decided_miss_is_a_miss_whatever_the_remaining_requests_do(requests):
    """Soundness against numpy: for each mix of answers so far (misses at 900 ms, passes at
    100 ms, failures), a decided miss must miss on the completion that helps the most (every
    remaining request answers at 0 ms) and on the one where the rest fail."""
    bound, budget = 500.0, 0.25
    for misses, passes, fails in itertools.product(range(min(requests, 6) + 1), repeat=3):
        if misses + passes + fails > requests:
            continue
        done = [answered(900.0)] * misses + [answered(100.0)] * passes + [FAILED] * fails
        if decided_miss(plan(requests, ttft=bound, max_error_rate=budget), done) is None:
            continue
        rest = requests - len(done)
        for rest_ok in (True, False):
            oks = [900.0] * misses + [100.0] * passes + ([0.0] * rest if rest_ok else [])
            failed = fails + (0 if rest_ok else rest)
            missed = not oks or failed / requests > budget or p95(oks) > bound
            assert missed, (requests, misses, passes, fails, rest_ok)


def test_gate_figures_say_when_the_load_stopped_early():
    measured = LoadLevel("concurrency=8", 8, None, 3, 3, 0.0, 0.5, 4000.0, 12.0, None)
    text = gate_figures(plan(), measured)
    assert "3/3 ok" in text and "stopped after 3 of 16 requests" in text
    assert "stopped" not in gate_figures(plan(requests=3), measured)


# --- the load generator's stop --------------------------------------------------------------

SPEC = RequestSpec(base_url="http://bench.test", model="m", output_tokens=2)
USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


def _sse(*payloads: str) -> bytes:
    return "".join(f"data: {p}\n\n" for p in payloads).encode()


def test_a_stop_ends_the_level_sends_nothing_more_and_cancels_what_is_in_flight():
    """Four in flight, twelve to send: prompts "fast" answer at once, the others hang until
    cancelled. The stop fires on the second answer: nothing more is sent and the hung requests
    are cancelled, so the level ends with the answered requests only (without the cancel it
    would wait out the hung requests: the 10 s bound fails it)."""
    sent: list[str] = []
    cancelled = []
    token = json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})

    async def handler(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        sent.append(prompt)
        if prompt != "fast":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.append(prompt)
                raise
        return httpx.Response(200, content=_sse(token, token, USAGE, "[DONE]"))

    prompts = [Prompt("fast"), Prompt("slow-a"), Prompt("fast"), Prompt("slow-b")] + [Prompt("later")] * 8

    async def go():
        async with ClientPool(SPEC, httpx.MockTransport(handler)) as pool:
            return await asyncio.wait_for(
                run_concurrency(pool, SPEC, prompts, 4, 12, lambda: 0.0, stop=lambda recs: len(recs) >= 2), timeout=10
            )

    records, _ = asyncio.run(go())
    assert len(records) == 2 and all(r.ok for r in records)
    # every hung request that went out was cancelled; nothing after the stop went out
    assert "later" not in sent and "slow-a" in sent and sorted(cancelled) == sorted(p for p in sent if p != "fast")


def test_without_a_stop_every_request_is_sent():
    count = []

    def handler(request: httpx.Request) -> httpx.Response:
        count.append(1)
        return httpx.Response(200, content=_sse(USAGE, "[DONE]"))

    async def go():
        async with ClientPool(SPEC, httpx.MockTransport(handler)) as pool:
            return await run_concurrency(pool, SPEC, [Prompt("p")], 3, 10, lambda: 0.0, stop=lambda recs: False)

    records, _ = asyncio.run(go())
    assert len(records) == 10 == len(count)
