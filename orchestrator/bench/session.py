"""One ``orch bench`` run from options to the results dict: prompts, load levels, metrics scrapes
around each level, the cross-check with vLLM's own histograms. Network I/O through
``orchestrator.bench.loadgen``; clock, sleep and random generator injected.

Metrics come from one or more Prometheus pages: a bare vLLM serves ``/metrics`` on its own port;
under Ray Serve LLM vLLM's figures are exported by Ray on every node's metrics export port (listed
in ``<ray temp dir>/prom_metrics_service_discovery.json`` on the head), so several pages are
scraped and read together.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from orchestrator.bench import crosscheck
from orchestrator.bench.loadgen import LevelRun, OnRecord, Prompt, RequestSpec, Stop, run_levels
from orchestrator.bench.prompts import (
    approximate_prompts,
    calibrate_words_per_token,
    exact_prompts,
    load_tokenizer,
    shared_prefix_prompts,
)
from orchestrator.bench.report import bench_result, level_dict
from orchestrator.errors import OrchError, UsageError


class BenchError(OrchError):
    """The endpoint could not be benchmarked at all (unreachable, refused every request)."""

    exit_code = 1


@dataclass(frozen=True)
class BenchOptions:
    base_url: str
    model: str
    concurrency: tuple[int, ...] = (1, 4, 16)
    rate: float | None = None
    requests: int = 32
    prompt_tokens: int = 128
    output_tokens: int = 64
    endpoint: str = "completions"
    tokenizer: Path | None = None
    api_key: str | None = field(default=None, repr=False)
    metrics_urls: tuple[str, ...] = ()
    seed: int | None = None  # None: a fresh one per run (see resolved_seed)
    warmup: int = 2
    timeout_s: float = 300.0
    settle_timeout_s: float = 60.0  # Ray exports every few seconds; a loaded node lags more
    stream_interval: int | None = None
    # "shared_prefix": `prefixes` system prompts of `prefix_tokens` tokens, each followed by short
    # user turns of `prompt_tokens` tokens, in shuffled order (bench.prompts.shared_prefix_prompts)
    workload: str = "random"
    prefixes: int = 8
    prefix_tokens: int = 1024


WORKLOADS = ("random", "shared_prefix")


def resolved_seed(seed: int | None) -> int:
    """The run's seed: the given one, else a fresh one. A fixed default would send the same
    prompts every run, and vLLM's prefix cache would answer the second run's prefill from cache
    (measured: 2,048-token prompts, TTFT median 88 ms on the first run, 15 ms on the repeat)."""
    return seed if seed is not None else random.SystemRandom().randrange(2**31)


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port spelled out when it is the scheme's default."""
    u = httpx.URL(url)
    port = u.port if u.port is not None else {"http": 80, "https": 443}.get(u.scheme)
    return (u.scheme, u.host, port)


def multi_scraper(
    urls: Sequence[str], api_key: str | None = None, timeout_s: float = 10.0, key_origin: str | None = None
) -> Callable[[], Awaitable[str]]:
    """Scrape every page and join them: the parser sums a histogram over all matching series.
    The API key goes only to pages of ``key_origin`` (the serving endpoint it belongs to), never
    to another host or port such as a user's --metrics-url (redirects are not followed)."""

    def headers_for(url: str) -> dict[str, str]:
        if api_key and key_origin is not None and origin(url) == origin(key_origin):
            return {"Authorization": f"Bearer {api_key}"}
        return {}

    async def scrape() -> str:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as c:
            pages = []
            for url in urls:
                try:
                    resp = await c.get(url, headers=headers_for(url))
                    resp.raise_for_status()
                    pages.append(resp.text)
                except httpx.HTTPError:
                    pages.append("")  # a node without metrics must not stop the run
            return "\n".join(pages)

    return scrape


def build_prompts(opts: BenchOptions, n: int, rng: random.Random, count_tokens: Callable[[str], int] | None) -> tuple[list[Prompt], str]:
    """Exact prompts with the local tokenizer, else sized from the server's usage counts; the
    shared-prefix workload when the options ask for it."""
    shared = opts.workload == "shared_prefix"
    what = f"shared prefix: {opts.prefixes} system prompts of {opts.prefix_tokens} tokens + {opts.prompt_tokens}-token turns; " if shared else ""
    if opts.tokenizer is not None:
        try:
            tok = load_tokenizer(opts.tokenizer)
        except (OSError, ValueError) as exc:
            raise UsageError(
                f"--tokenizer {opts.tokenizer}: cannot load a tokenizer from it ({type(exc).__name__})",
                hint="point --tokenizer at a local model folder with tokenizer files, or leave it out",
            ) from exc
        if shared:
            return shared_prefix_prompts(n, opts.prefixes, opts.prefix_tokens, opts.prompt_tokens, rng, tokenizer=tok), what + f"exact, tokenizer {opts.tokenizer}"
        return exact_prompts(tok, n, opts.prompt_tokens, rng), f"exact, tokenizer {opts.tokenizer}"
    fit, how = (1.3, 1.0), "approximate, default 1.3 tokens/word"
    if count_tokens is not None:
        try:
            fit = calibrate_words_per_token(count_tokens, rng)
            how = f"approximate, {fit[0]:.2f} tokens/word from server usage"
        except (httpx.HTTPError, KeyError, ValueError, TypeError):
            pass
    if shared:
        return shared_prefix_prompts(n, opts.prefixes, opts.prefix_tokens, opts.prompt_tokens, rng, fit=fit), what + how
    return approximate_prompts(n, opts.prompt_tokens, rng, fit), how


def server_token_counter(spec: RequestSpec) -> Callable[[str], int]:
    """Ask the server how many prompt tokens a text is (a 1-token completion's usage)."""

    def count(text: str) -> int:
        body = {"model": spec.model, "prompt": text, "max_tokens": 1}
        if spec.endpoint == "chat":
            body = {"model": spec.model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        with httpx.Client(base_url=spec.base_url, headers=spec.headers(), timeout=30.0) as c:
            resp = c.post(spec.path, json=body)
            resp.raise_for_status()
            return int(resp.json()["usage"]["prompt_tokens"])

    return count


def run_bench(
    opts: BenchOptions,
    on_record: OnRecord | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], _dt.datetime] = lambda: _dt.datetime.now(_dt.timezone.utc),
    transport: httpx.AsyncBaseTransport | None = None,
    count_tokens: Callable[[str], int] | None = None,
    stop: Stop | None = None,
) -> tuple[dict, list[LevelRun]]:
    """Run the benchmark and return (results dict, raw level runs). ``stop`` may end a concurrency
    level early (``loadgen.run_concurrency``; the SLO gate's decided miss)."""
    spec = RequestSpec(
        base_url=opts.base_url.rstrip("/"),
        model=opts.model,
        output_tokens=opts.output_tokens,
        endpoint=opts.endpoint,
        api_key=opts.api_key,
        timeout_s=opts.timeout_s,
        stream_interval=opts.stream_interval,
    )
    seed = resolved_seed(opts.seed)
    rng = random.Random(seed)
    levels = 1 if opts.rate else len(opts.concurrency)
    n_prompts = min(opts.requests * levels + opts.warmup, 4096)
    if count_tokens is None and opts.tokenizer is None and transport is None:
        count_tokens = server_token_counter(spec)
    prompts, source = build_prompts(opts, n_prompts, rng, count_tokens)
    scrape = multi_scraper(opts.metrics_urls, opts.api_key, key_origin=opts.base_url) if opts.metrics_urls else None
    started = now().isoformat(timespec="seconds")
    runs = asyncio.run(
        run_levels(
            spec,
            prompts,
            concurrency=opts.concurrency,
            rate=opts.rate,
            requests=opts.requests,
            warmup=opts.warmup,
            clock=clock,
            sleep=sleep,
            rng=rng,
            on_record=on_record,
            scrape=scrape,
            settle=lambda b, a, n: crosscheck.settled(b, a, n, opts.model),
            settle_timeout_s=opts.settle_timeout_s,
            transport=transport,
            stop=stop,
        )
    )
    total = sum(r.stats.requests for r in runs)
    if total and all(r.stats.succeeded == 0 for r in runs) and all("connection" in r.stats.errors for r in runs):
        raise BenchError(
            f"every request to {opts.base_url} failed to connect",
            hint="check --url (or that the cluster's Serve application is RUNNING: orch status)",
        )
    level_dicts = []
    for r in runs:
        checks = None
        if r.metrics_before is not None and r.metrics_after is not None:
            checks = crosscheck.compare_level(r.records, r.metrics_before, r.metrics_after, opts.model)
        level_dicts.append(level_dict(r.stats, checks))
    whole = None
    if runs and runs[0].metrics_before is not None and runs[-1].metrics_after is not None:
        whole = crosscheck.compare_level(
            [x for r in runs for x in r.records], runs[0].metrics_before, runs[-1].metrics_after, opts.model
        )
    config = {
        "prompt_tokens": opts.prompt_tokens,
        "prompt_source": source,
        "output_tokens": opts.output_tokens,
        "requests": opts.requests,
        "concurrency": list(opts.concurrency) if not opts.rate else None,
        "rate": opts.rate,
        "seed": seed,
        "warmup": opts.warmup,
        "metrics_urls": list(opts.metrics_urls),
        "stream_interval": opts.stream_interval,
        "workload": opts.workload,
        **({"prefixes": opts.prefixes, "prefix_tokens": opts.prefix_tokens} if opts.workload == "shared_prefix" else {}),
    }
    target = {"url": opts.base_url, "model": opts.model, "endpoint": opts.endpoint}
    return bench_result(target, config, level_dicts, whole, started), runs


def with_levels(opts: BenchOptions, concurrency: Sequence[int]) -> BenchOptions:
    return replace(opts, concurrency=tuple(concurrency), rate=None)
