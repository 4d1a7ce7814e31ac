"""The load generator of ``orch bench``: streaming requests over httpx, load shapes, per-request
timing. Does network I/O (httpx); the clock, the sleep and the random generator are injected.

One request: POST ``/v1/completions`` (or ``/v1/chat/completions``) with ``stream: true``,
``stream_options.include_usage``, ``ignore_eos`` (so the output length is what was asked) and
vLLM's ``return_token_ids`` (so tokens are counted exactly, even those whose text is empty).
TTFT, TPOT and ITL follow ``orchestrator.bench.latency``. Load shapes: a fixed number of requests at a
fixed concurrency (a sweep runs one level after another), or Poisson arrivals at a rate.
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from orchestrator.bench.latency import LevelStats, RequestRecord, poisson_arrivals, summarize
from orchestrator.bench.sse import SseDecoder, StreamProtocolError, read_chunk

# Ray Serve's session header (RAY_SERVE_SESSION_ID_HEADER_KEY's default, ray/serve/_private/constants.py);
# HAProxy forwards it to LLMRouter, which gives it to the request router as the session id.
SESSION_HEADER = "x-session-id"

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
OnRecord = Callable[[str, RequestRecord], None]
Stop = Callable[[Sequence[RequestRecord]], bool]  # asked after each answer: end the level now


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int | None = None  # exact length when built with the model's tokenizer
    prefix: int | None = None  # the shared-prefix workload: which system prompt it starts with


@dataclass(frozen=True)
class RequestSpec:
    """What every request of a run asks for."""

    base_url: str  # http://host:port (no /v1)
    model: str
    output_tokens: int
    endpoint: str = "completions"  # or "chat"
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 300.0
    token_ids: bool = True  # ask vLLM for token_ids per chunk
    stream_interval: int | None = None  # vLLM: tokens per streamed chunk (first and last sent at once)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def prompt_headers(self, prompt: Prompt) -> dict[str, str] | None:
        """Per-request headers: a shared-prefix prompt names its system prompt as the session
        (Serve's session header), which a session-affinity router pins to one replica."""
        return {SESSION_HEADER: f"prefix-{prompt.prefix}"} if prompt.prefix is not None else None

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def encoded_body(self, prompt: Prompt) -> bytes:
        return json.dumps(self.body(prompt), separators=(",", ":")).encode()

    def body(self, prompt: Prompt) -> dict:
        body: dict = {
            "model": self.model,
            "max_tokens": self.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self.token_ids:
            body["return_token_ids"] = True
        if self.stream_interval:
            body["stream_interval"] = self.stream_interval
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            body["prompt"] = prompt.text
        return body


def make_client(
    spec: RequestSpec,
    max_connections: int = 1,
    transport: httpx.AsyncBaseTransport | None = None,
    verify: ssl.SSLContext | bool = True,
) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=spec.base_url,
        verify=verify,
        headers=spec.headers(),
        timeout=httpx.Timeout(spec.timeout_s, connect=min(10.0, spec.timeout_s)),
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=transport,
    )


class ClientPool:
    """One-connection httpx clients, one per request in flight.

    httpcore's pool walks every connection on each request (idle and expiry checks), so one
    shared client with 64 connections spends more CPU choosing a connection than streaming; a
    client per in-flight request keeps that walk at one connection (measured by
    benchmarks/loadgen_capacity.py). Clients are reused (keep-alive) and closed together.
    """

    def __init__(self, spec: RequestSpec, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._spec = spec
        self._transport = transport
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        # one TLS context for all clients: building one per client loads the CA store each time
        self._verify: ssl.SSLContext | None = None

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        if self._verify is None:
            self._verify = ssl.create_default_context()
        client = make_client(self._spec, 1, self._transport, self._verify)
        self._all.append(client)
        return client

    def release(self, client: httpx.AsyncClient) -> None:
        self._free.append(client)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()
        self._all.clear()
        self._free.clear()

    async def __aenter__(self) -> ClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def send_pooled(pool: ClientPool, spec: RequestSpec, prompt: Prompt, clock: Clock) -> RequestRecord:
    client = pool.acquire()
    try:
        return await send_request(client, spec, prompt, clock)
    finally:
        pool.release(client)


def _failure(start: float, kind: str, error: str, status: int | None = None, elapsed: float | None = None) -> RequestRecord:
    return RequestRecord(ok=False, start=start, error_kind=kind, error=error, status=status, end=elapsed)


async def send_request(client: httpx.AsyncClient, spec: RequestSpec, prompt: Prompt, clock: Clock) -> RequestRecord:
    """Send one streaming request and time it. Never raises for a failed request: the failure kind
    is in the record (http, timeout, connection, protocol, server_error, incomplete)."""
    content = spec.encoded_body(prompt)
    t0 = clock()
    times: list[float] = []
    counts: list[int] = []
    usage_out = usage_in = server_ttft = None
    done = False
    try:
        async with client.stream("POST", spec.path, content=content, headers=spec.prompt_headers(prompt)) as resp:
            headers_at = clock() - t0
            if resp.status_code >= 400:
                text = (await resp.aread())[:200].decode("utf-8", "replace")
                return _failure(t0, "http", f"HTTP {resp.status_code}: {text}", resp.status_code, clock() - t0)
            decoder = SseDecoder()
            # Read to the end of the body (not just [DONE]) so the connection goes back to the pool
            # instead of being closed: reconnecting per request halves the client's capacity.
            async for data in resp.aiter_bytes():
                payloads = decoder.feed_bytes(data)
                if not payloads:
                    continue
                now = clock()
                for payload in payloads:
                    chunk = read_chunk(payload)
                    if chunk.done:
                        done = True
                        continue
                    if chunk.error:
                        return _failure(t0, "server_error", chunk.error, resp.status_code, now - t0)
                    if chunk.tokens:
                        times.append(now - t0)
                        counts.append(chunk.tokens)
                    if chunk.usage_completion_tokens is not None:
                        usage_out = chunk.usage_completion_tokens
                        usage_in = chunk.usage_prompt_tokens
                        server_ttft = chunk.server_ttft
            tail = decoder.flush()
            if tail is not None and read_chunk(tail).done:
                done = True
    except httpx.TimeoutException as exc:
        return _failure(t0, "timeout", type(exc).__name__, elapsed=clock() - t0)
    except (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, OSError) as exc:
        return _failure(t0, "connection", f"{type(exc).__name__}: {exc}"[:200], elapsed=clock() - t0)
    except (StreamProtocolError, httpx.DecodingError, UnicodeDecodeError) as exc:
        return _failure(t0, "protocol", str(exc)[:200], elapsed=clock() - t0)
    end = clock() - t0
    n = usage_out if usage_out is not None else sum(counts)
    if not times:
        return _failure(t0, "protocol", "stream ended without any output token", elapsed=end)
    if not done:
        return _failure(t0, "incomplete", f"stream ended without [DONE] after {n} tokens", elapsed=end)
    return RequestRecord(
        ok=True,
        start=t0,
        token_times=tuple(times),
        chunk_tokens=tuple(counts),
        end=end,
        output_tokens=n,
        prompt_tokens=usage_in if usage_in is not None else prompt.tokens,
        server_ttft=server_ttft,
        headers_at=headers_at,
    )


async def run_concurrency(
    pool: ClientPool,
    spec: RequestSpec,
    prompts: Sequence[Prompt],
    concurrency: int,
    requests: int,
    clock: Clock,
    on_record: OnRecord | None = None,
    label: str | None = None,
    stop: Stop | None = None,
) -> tuple[list[RequestRecord], float]:
    """``requests`` requests, ``concurrency`` in flight at all times. Returns records and duration.

    ``stop(records)``, asked after each answer, ends the level early: no request is sent after it
    says True and the ones in flight are cancelled (their connections closed, so the server aborts
    them); the records are the requests answered until then."""
    label = label or f"concurrency={concurrency}"
    records: list[RequestRecord] = []
    counter = iter(range(requests))
    workers: list[asyncio.Task] = []

    async def worker() -> None:
        for i in counter:
            rec = await send_pooled(pool, spec, prompts[i % len(prompts)], clock)
            records.append(rec)
            if on_record:
                on_record(label, rec)
            if stop is not None and stop(records):
                for other in workers:
                    if other is not asyncio.current_task():
                        other.cancel()
                return

    t0 = clock()
    workers.extend(asyncio.ensure_future(worker()) for _ in range(min(concurrency, requests)))
    outcomes = await asyncio.gather(*workers, return_exceptions=True)  # cancelled with its caller (Ctrl-C)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            raise outcome
    return records, clock() - t0


async def run_rate(
    pool: ClientPool,
    spec: RequestSpec,
    prompts: Sequence[Prompt],
    rate: float,
    requests: int,
    clock: Clock,
    sleep: Sleep,
    rng: random.Random,
    on_record: OnRecord | None = None,
) -> tuple[list[RequestRecord], float]:
    """``requests`` requests sent at Poisson arrival times of ``rate``/s (seeded ``rng``)."""
    label = f"rate={rate:g}/s"
    arrivals = poisson_arrivals(rate, requests, rng)
    records: list[RequestRecord] = []

    async def one(i: int) -> None:
        rec = await send_pooled(pool, spec, prompts[i % len(prompts)], clock)
        records.append(rec)
        if on_record:
            on_record(label, rec)

    t0 = clock()
    tasks = []
    for i, at in enumerate(arrivals):
        wait = t0 + at - clock()
        if wait > 0:
            await sleep(wait)
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    return records, clock() - t0


@dataclass(frozen=True)
class LevelRun:
    """One level's records and summary, and the server's metrics pages around it (if scraped)."""

    stats: LevelStats
    records: tuple[RequestRecord, ...]
    metrics_before: str | None = None
    metrics_after: str | None = None


Scrape = Callable[[], Awaitable[str]]


async def run_levels(
    spec: RequestSpec,
    prompts: Sequence[Prompt],
    concurrency: Sequence[int] = (),
    rate: float | None = None,
    requests: int = 32,
    warmup: int = 1,
    clock: Clock = time.perf_counter,
    sleep: Sleep = asyncio.sleep,
    rng: random.Random | None = None,
    on_record: OnRecord | None = None,
    scrape: Scrape | None = None,
    settle: Callable[[str, str, int], bool] | None = None,
    settle_timeout_s: float = 30.0,
    transport: httpx.AsyncBaseTransport | None = None,
    stop: Stop | None = None,
) -> list[LevelRun]:
    """Run every level (each concurrency, or the one rate), scraping metrics around each.

    ``settle(before, after, succeeded)`` says whether the after-page already holds this level's
    requests; Ray exports metrics with a delay, so the after-scrape is retried until it does or
    ``settle_timeout_s`` passes. ``stop`` may end each concurrency level early (``run_concurrency``).
    """
    rng = rng or random.Random(0)
    out: list[LevelRun] = []
    # Every request of the run gets its own prompt while the list lasts (warmup first, then each
    # level its own slice): a level that resent the previous level's prompts would have vLLM's
    # prefix cache answer their prefill (measured: 2,048-token prompts, TTFT median 88 ms at
    # concurrency 1 and 42 ms at 4, the same prompts again).
    cursor = 0

    def take(n: int) -> list[Prompt]:
        nonlocal cursor
        chunk = [prompts[(cursor + i) % len(prompts)] for i in range(n)]
        cursor += n
        return chunk

    async with ClientPool(spec, transport) as client:
        pre = await scrape() if scrape and warmup else None
        if warmup:
            records, _ = await run_concurrency(client, spec, take(warmup), 1, warmup, clock, label="warmup")
        if pre is not None:
            # the first level's before-page must already hold the warmup (Ray exports late),
            # else the warmup requests would be counted as the level's
            await _settled_page(scrape, pre, sum(r.ok for r in records), settle, settle_timeout_s, clock, sleep)
        shapes: list[tuple[int | None, float | None]] = [(None, rate)] if rate else [(c, None) for c in concurrency]
        for conc, r in shapes:
            before = await scrape() if scrape else None
            level_prompts = take(requests)
            if r:
                recs, dur = await run_rate(client, spec, level_prompts, r, requests, clock, sleep, rng, on_record)
                stats = summarize(recs, dur, f"rate={r:g}/s", rate=r)
            else:
                assert conc is not None
                recs, dur = await run_concurrency(client, spec, level_prompts, conc, requests, clock, on_record, stop=stop)
                stats = summarize(recs, dur, f"concurrency={conc}", concurrency=conc)
            after = None
            if scrape and before is not None:
                after = await _settled_page(scrape, before, stats.succeeded, settle, settle_timeout_s, clock, sleep)
            out.append(LevelRun(stats, tuple(recs), before, after))
    return out


async def _settled_page(
    scrape: Scrape,
    before: str,
    expected: int,
    settle: Callable[[str, str, int], bool] | None,
    timeout_s: float,
    clock: Clock,
    sleep: Sleep,
) -> str:
    """Scrape until the page counts ``expected`` more requests than ``before`` (or time runs out)."""
    deadline = clock() + timeout_s
    page = await scrape()
    while settle and not settle(before, page, expected) and clock() < deadline:
        await sleep(1.0)
        page = await scrape()
    return page


def http_scraper(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> Scrape:
    """A scrape callable reading a Prometheus page over HTTP."""

    async def scrape() -> str:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with httpx.AsyncClient(timeout=timeout_s) as c:
            resp = await c.get(url, headers=headers)
            resp.raise_for_status()
            return resp.text

    return scrape
