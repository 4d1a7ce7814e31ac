"""The load generator against scripted HTTP transports: timing from an injected clock, token
counting, error kinds, load shapes. No network, no real time."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from orchestrator.bench.loadgen import (
    ClientPool,
    Prompt,
    RequestSpec,
    run_concurrency,
    run_levels,
    run_rate,
    send_request,
)


class FakeClock:
    """Advances by ``step`` each time it is read: request times become deterministic."""

    def __init__(self, step: float = 0.01) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def sse(*payloads: str) -> bytes:
    return "".join(f"data: {p}\n\n" for p in payloads).encode()


def token(i: int) -> str:
    return json.dumps({"choices": [{"index": 0, "text": f"t{i}", "token_ids": [i], "finish_reason": None}]})


USAGE = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}})
GOOD = sse(token(1), token(2), token(3), token(4), USAGE, "[DONE]")
SPEC = RequestSpec(base_url="http://bench.test", model="m", output_tokens=4, api_key="sekrit")


def transport_of(handler) -> httpx.MockTransport:
    return httpx.MockTransport(handler)


async def one(handler, clock=None) -> object:
    async with ClientPool(SPEC, transport_of(handler)) as pool:
        client = pool.acquire()
        return await send_request(client, SPEC, Prompt("hi"), clock or FakeClock())


def test_request_body_and_headers_ask_for_a_measurable_stream():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(request.content)
        seen["auth"] = request.headers.get("authorization")
        seen["path"] = request.url.path
        return httpx.Response(200, content=GOOD)

    rec = asyncio.run(one(handler))
    body = seen["body"]
    assert seen["path"] == "/v1/completions" and seen["auth"] == "Bearer sekrit"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 4 and body["prompt"] == "hi"
    assert rec.ok and rec.output_tokens == 4 and rec.prompt_tokens == 7
    assert "sekrit" not in repr(SPEC)


def test_times_come_from_the_injected_clock():
    rec = asyncio.run(one(lambda r: httpx.Response(200, content=GOOD), FakeClock(0.01)))
    # sent at 0.01, headers at 0.02, the whole body in one read stamped 0.03: one time for all 4 tokens
    assert rec.headers_at == pytest.approx(0.01)
    assert rec.token_times == pytest.approx((0.02,) * 4)
    assert rec.ttft == pytest.approx(0.02)
    assert rec.output_tokens == 4
    assert rec.tpot == pytest.approx(0.0)


def test_streamed_chunks_get_their_own_arrival_times():
    async def body():
        for part in (sse(token(1)), sse(token(2)), sse(token(3)), sse(token(4), USAGE, "[DONE]")):
            yield part

    rec = asyncio.run(one(lambda r: httpx.Response(200, content=body()), FakeClock(0.01)))
    assert rec.ok
    assert len(rec.token_times) == 4
    assert rec.token_times[0] < rec.token_times[1] < rec.token_times[2]
    assert rec.tpot == pytest.approx((rec.token_times[-1] - rec.token_times[0]) / 3)


def test_tokens_whose_text_is_held_back_still_time_the_first_token():
    """Without token ids (a server that does not return them): vLLM streams a choice per new token
    with an empty text while the detokenizer holds back an incomplete UTF-8 sequence (byte tokens
    of CJK text, emoji, a random model's output). Each is a token: the first times TTFT."""

    def held(i: int) -> str:
        return json.dumps({"choices": [{"index": 0, "text": "" if i < 4 else "字", "finish_reason": None}]})

    async def body():
        for part in (sse(held(1)), sse(held(2)), sse(held(3)), sse(held(4), USAGE, "[DONE]")):
            yield part

    rec = asyncio.run(one(lambda r: httpx.Response(200, content=body()), FakeClock(0.01)))
    assert rec.ok and rec.output_tokens == 4 and len(rec.token_times) == 4
    assert rec.ttft == pytest.approx(rec.token_times[0]) and rec.token_times[0] < rec.token_times[3]


@pytest.mark.parametrize(
    "handler, kind",
    [
        (lambda r: httpx.Response(503, content=b'{"error":"busy"}'), "http"),
        (lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused")), "connection"),
        (lambda r: (_ for _ in ()).throw(httpx.ReadTimeout("slow")), "timeout"),
        (lambda r: httpx.Response(200, content=sse("not json")), "protocol"),
        (lambda r: httpx.Response(200, content=sse(USAGE, "[DONE]")), "protocol"),  # no token at all
        (lambda r: httpx.Response(200, content=sse(token(1), token(2))), "incomplete"),  # no [DONE]
        (lambda r: httpx.Response(200, content=sse(token(1), '{"error":{"message":"engine died"}}')), "server_error"),
    ],
)
def test_failures_are_records_with_a_kind_never_exceptions(handler, kind):
    rec = asyncio.run(one(handler))
    assert not rec.ok and rec.error_kind == kind and rec.ttft is None and rec.tpot is None


def test_concurrency_level_sends_exactly_n_and_never_more_than_c_at_once():
    state = {"in_flight": 0, "max": 0, "n": 0}

    async def body():
        state["in_flight"] += 1
        state["max"] = max(state["max"], state["in_flight"])
        await asyncio.sleep(0)
        yield sse(token(1), token(2), token(3), token(4), USAGE)
        state["in_flight"] -= 1
        yield sse("[DONE]")

    def handler(request):
        state["n"] += 1
        return httpx.Response(200, content=body())

    async def go():
        async with ClientPool(SPEC, transport_of(handler)) as pool:
            return await run_concurrency(pool, SPEC, [Prompt("a"), Prompt("b")], 3, 10, FakeClock())

    records, duration = asyncio.run(go())
    assert len(records) == 10 and state["n"] == 10 and all(r.ok for r in records)
    assert 1 < state["max"] <= 3
    assert duration > 0


def test_rate_level_sleeps_until_each_seeded_poisson_arrival():
    clock = FakeClock(0.0)
    slept = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)
        clock.t += s

    async def go():
        async with ClientPool(SPEC, transport_of(lambda r: httpx.Response(200, content=GOOD))) as pool:
            return await run_rate(pool, SPEC, [Prompt("a")], 5.0, 20, clock, fake_sleep, random.Random(3))

    records, _ = asyncio.run(go())
    from orchestrator.bench.latency import poisson_arrivals

    expected = poisson_arrivals(5.0, 20, random.Random(3))
    assert len(records) == 20
    assert sum(slept) == pytest.approx(expected[-1])


def test_run_levels_scrapes_around_each_level_and_waits_for_lagging_metrics():
    pages = iter(["pre-warmup", "warm", "before-1", "stale", "after-1", "before-2", "after-2"])
    settles = []

    async def scrape():
        return next(pages)

    def settle(before, after, n):
        settles.append((before, after, n))
        return after != "stale"

    async def no_sleep(s):
        return None

    runs = asyncio.run(
        run_levels(
            SPEC, [Prompt("a")], concurrency=(1, 2), requests=3, warmup=1, clock=FakeClock(), sleep=no_sleep,
            scrape=scrape, settle=settle, transport=transport_of(lambda r: httpx.Response(200, content=GOOD)),
        )
    )
    assert [(r.metrics_before, r.metrics_after) for r in runs] == [("before-1", "after-1"), ("before-2", "after-2")]
    assert [r.stats.requests for r in runs] == [3, 3]  # the warmup request is not counted
    # the warmup must show in the page before the first level starts (Ray exports late)
    assert settles[0] == ("pre-warmup", "warm", 1)
    assert settles[1] == ("before-1", "stale", 3)


def test_run_levels_sends_each_prompt_once_so_the_prefix_cache_cannot_answer_a_level():
    sent = []

    def handler(request):
        sent.append(json.loads(request.content)["prompt"])
        return httpx.Response(200, content=GOOD)

    prompts = [Prompt(f"p{i}") for i in range(2 + 3 * 4)]
    runs = asyncio.run(
        run_levels(SPEC, prompts, concurrency=(1, 2, 4), requests=4, warmup=2, clock=FakeClock(), transport=transport_of(handler))
    )
    assert [r.stats.requests for r in runs] == [4, 4, 4]
    assert sorted(sent) == sorted(p.text for p in prompts)  # warmup 2 + 3 levels x 4, no repeats
    assert sent[:2] == ["p0", "p1"] and set(sent[2:6]) == {"p2", "p3", "p4", "p5"}  # warmup, then level 1's slice


def test_run_levels_reuses_prompts_only_when_the_list_runs_out():
    sent = []

    def handler(request):
        sent.append(json.loads(request.content)["prompt"])
        return httpx.Response(200, content=GOOD)

    asyncio.run(run_levels(SPEC, [Prompt("a"), Prompt("b"), Prompt("c")], concurrency=(1, 1), requests=2, warmup=0,
                           clock=FakeClock(), transport=transport_of(handler)))  # fmt: skip
    assert sent == ["a", "b", "c", "a"]


def test_a_shared_prefix_prompt_names_its_system_prompt_in_serves_session_header():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.headers.get("x-session-id"), request.headers.get("authorization")))
        return httpx.Response(200, content=GOOD)

    async def both():
        async with ClientPool(SPEC, transport_of(handler)) as pool:
            client = pool.acquire()
            await send_request(client, SPEC, Prompt("system\nturn", prefix=3), FakeClock())
            await send_request(client, SPEC, Prompt("hi"), FakeClock())

    asyncio.run(both())
    assert seen == [("prefix-3", "Bearer sekrit"), (None, "Bearer sekrit")]  # the client's own headers stay
