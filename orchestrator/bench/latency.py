"""Latency statistics of a benchmark run: per-request figures and per-level summaries. Pure, no I/O.

Definitions (the latency formulas, vLLM 0.32 benchmark page):
- TTFT: from the moment the request was sent to the arrival of the first chunk that carries an
  output token (queueing + prefill + network). A chat stream's opening role-only chunk is not a
  token.
- TPOT = (t_total - TTFT) / (N - 1), N = output tokens, t_total = time from sending to the arrival
  of the last output token. With N = 1 TPOT is undefined (``None``), never a division by zero.
- ITL (inter-token latency): the gaps between consecutive token-carrying chunks.
- end-to-end: from sending to the end of the stream.

Percentiles use linear interpolation between closest ranks (numpy's default "linear" method,
Hyndman & Fan type 7): p = values[(n-1)*q] interpolated. The same method everywhere in orch.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PERCENTILE_METHOD = "linear interpolation between closest ranks (numpy 'linear', type 7)"

# Error kinds a request can end with (see bench.py for how each is detected).
ERROR_KINDS = ("http", "timeout", "connection", "protocol", "server_error", "incomplete")


@dataclass(frozen=True)
class RequestRecord:
    """What one request did. Times are seconds relative to the moment it was sent.

    ``token_times`` holds the arrival time of every token-carrying chunk and ``chunk_tokens`` how
    many tokens each carried (1 when the server does not say). ``output_tokens`` is the server's
    usage count when it sent one, else the sum of ``chunk_tokens``.
    """

    ok: bool
    start: float = 0.0  # absolute (run clock) time the request was sent
    token_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    end: float | None = None  # stream closed, relative to sending
    output_tokens: int = 0
    prompt_tokens: int | None = None
    error_kind: str | None = None  # one of ERROR_KINDS
    error: str | None = None  # e.g. "HTTP 503", exception class name
    status: int | None = None
    server_ttft: float | None = None  # the server's own TTFT of this request, when it reports one
    headers_at: float | None = None  # response headers received, relative to sending

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] if self.ok and self.token_times else None

    @property
    def t_total(self) -> float | None:
        """Time from sending to the last output token."""
        return self.token_times[-1] if self.ok and self.token_times else None

    @property
    def tpot(self) -> float | None:
        return tpot(self.t_total, self.ttft, self.output_tokens) if self.ok else None

    @property
    def ttft_from_headers(self) -> float | None:
        """First token counted from the response headers: a client-side stand-in for vLLM's own
        starting point (it answers with headers right after parsing the request)."""
        if self.ttft is None or self.headers_at is None:
            return None
        return self.ttft - self.headers_at

    @property
    def itls(self) -> tuple[float, ...]:
        if not self.ok:
            return ()
        t = self.token_times
        return tuple(b - a for a, b in zip(t, t[1:]))


def tpot(t_total: float | None, ttft: float | None, n_tokens: int) -> float | None:
    """TPOT = (t_total - TTFT) / (N - 1); undefined (None) for N <= 1 or missing times."""
    if t_total is None or ttft is None or n_tokens <= 1:
        return None
    return (t_total - ttft) / (n_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; None if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency figure over the successful requests of a level (seconds)."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    min: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution:
        xs = [v for v in values if v is not None]
        if not xs:
            return cls(0, None, None, None, None, None, None)
        return cls(
            count=len(xs),
            mean=sum(xs) / len(xs),
            p50=percentile(xs, 50),
            p95=percentile(xs, 95),
            p99=percentile(xs, 99),
            min=min(xs),
            max=max(xs),
        )

    def as_ms(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"count": self.count}
        for k in ("mean", "p50", "p95", "p99", "min", "max"):
            v = getattr(self, k)
            out[k] = None if v is None else v * 1000.0
        return out


@dataclass(frozen=True)
class LevelStats:
    """The summary of one load level (one concurrency or one request rate)."""

    label: str  # "concurrency=4" or "rate=2.0/s"
    concurrency: int | None
    rate: float | None
    requests: int
    succeeded: int
    failed: int
    errors: dict[str, int]  # error kind -> count
    error_rate: float
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    output_tok_per_s: float
    req_per_s: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    error_samples: tuple[str, ...] = field(default=())
    # diagnostics: response headers (the server accepted the request) and the server's own
    # per-request TTFT (vLLM --enable-per-request-metrics), when available
    headers: Distribution = field(default_factory=lambda: Distribution.of(()))
    server_ttft: Distribution = field(default_factory=lambda: Distribution.of(()))


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    label: str,
    concurrency: int | None = None,
    rate: float | None = None,
) -> LevelStats:
    """Turn the records of one level into its summary. Empty and all-failed levels are valid."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    errors = Counter(r.error_kind or "unknown" for r in failed)
    samples = tuple(dict.fromkeys(f"{r.error_kind or 'unknown'}: {r.error}" for r in failed))[:5]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    return LevelStats(
        label=label,
        concurrency=concurrency,
        rate=rate,
        requests=len(records),
        succeeded=len(ok),
        failed=len(failed),
        errors=dict(sorted(errors.items())),
        error_rate=(len(failed) / len(records)) if records else 0.0,
        duration_s=duration_s,
        output_tokens=out_tokens,
        prompt_tokens=prompt_tokens,
        output_tok_per_s=per_s(out_tokens),
        req_per_s=per_s(len(ok)),
        ttft=Distribution.of(r.ttft for r in ok),
        tpot=Distribution.of(r.tpot for r in ok),
        itl=Distribution.of(x for r in ok for x in r.itls),
        e2e=Distribution.of(r.end for r in ok),
        error_samples=samples,
        headers=Distribution.of(r.headers_at for r in ok),
        server_ttft=Distribution.of(r.server_ttft for r in ok),
    )


def poisson_arrivals(rate: float, n: int, rng: random.Random) -> list[float]:
    """Send times (seconds from the start) of n requests arriving as a Poisson process of ``rate``/s:
    exponential gaps with mean 1/rate, drawn from the injected (seeded) generator."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def parse_levels(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; each a positive integer."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"concurrency levels must be positive integers, got {part!r}")
        levels.append(int(part))
    if not levels:
        raise ValueError("no concurrency level given")
    return levels
