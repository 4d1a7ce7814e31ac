"""Prometheus text exposition format and histogram arithmetic for vLLM's own latency figures. Pure.

``parse_text`` reads a ``/metrics`` page into samples. ``histogram`` collects one histogram
family (summed over the series that match a label filter) under any of several names, because
the same vLLM metric is called ``vllm:time_to_first_token_seconds`` on a bare vLLM server and
``ray_vllm_time_to_first_token_seconds`` on a Ray node's metrics export port (Ray Serve LLM
sanitises ``:`` to ``_`` and Ray prefixes ``ray_``). ``Histogram.minus`` gives the delta of two
scrapes (what one benchmark run added), ``mean`` is exact (sum/count), ``quantile`` interpolates
linearly inside the bucket as Prometheus' ``histogram_quantile`` does; ``bin_samples`` puts a
client's own samples into the same buckets so both sides can be compared with one estimator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# vLLM 0.32 names (vllm/v1/metrics/loggers.py) of the figures orch cross-checks.
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"


def name_variants(name: str) -> tuple[str, ...]:
    """A vLLM metric name as a bare server and as Ray's metrics export show it."""
    sanitised = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return (name, sanitised, "ray_" + sanitised)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return None


class MetricsFormatError(ValueError):
    """A line that is not Prometheus text format."""


def _parse_labels(text: str, i: int, line: str) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="x",b="y"}`` starting at text[i] == '{'; return labels and the index after '}'."""
    labels: list[tuple[str, str]] = []
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return tuple(labels), i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            raise MetricsFormatError(f"bad label set in line: {line[:120]!r}")
        key = text[i:eq].strip()
        j = eq + 2
        buf = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                nxt = text[j + 1]
                buf.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                j += 2
                continue
            buf.append(text[j])
            j += 1
        if j >= n:
            raise MetricsFormatError(f"unterminated label value in line: {line[:120]!r}")
        labels.append((key, "".join(buf)))
        i = j + 1


def _parse_value(text: str) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf"):
        return math.inf
    if t == "-Inf":
        return -math.inf
    return float(t)  # float() accepts NaN


def parse_text(text: str) -> list[Sample]:
    """Every sample of a Prometheus text-format page (comments and TYPE/HELP lines skipped)."""
    out: list[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, after = _parse_labels(line, brace, line)
            rest = line[after:].split()
        else:
            parts = line.split()
            name, labels, rest = parts[0], (), parts[1:]
        if not rest:
            raise MetricsFormatError(f"sample without a value: {line[:120]!r}")
        try:
            value = _parse_value(rest[0])  # an optional timestamp may follow
        except ValueError as exc:
            raise MetricsFormatError(f"bad sample value in line: {line[:120]!r}") from exc
        out.append(Sample(name, labels, value))
    return out


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (upper bound -> count, +Inf last), sum and count."""

    name: str
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        """What was added since ``before`` (a counter reset shows as this scrape alone)."""
        if before is None or before.count > self.count:
            return self
        prev = dict(before.buckets)
        return Histogram(
            self.name,
            tuple((le, c - prev.get(le, 0.0)) for le, c in self.buckets),
            self.sum - before.sum,
            self.count - before.count,
        )

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def midpoint_mean(self) -> float | None:
        """The mean if every observation sat at its bucket's midpoint (the first bucket's from 0);
        None when any fell in the +Inf bucket. Ray's metrics export rebuilds a histogram from
        bucket counts at the midpoints, so under Ray Serve LLM ``sum`` is this estimate."""
        if self.count <= 0:
            return None
        total, lower, below = 0.0, 0.0, 0.0
        for le, cum in self.buckets:
            n = cum - below
            if n > 0:
                if math.isinf(le):
                    return None
                total += n * (lower + le) / 2
            lower, below = (le if not math.isinf(le) else lower), cum
        return total / self.count

    @property
    def sum_from_midpoints(self) -> bool:
        """Whether ``sum`` is exactly the bucket-midpoint estimate (not a measured sum)."""
        est = self.midpoint_mean()
        return est is not None and self.mean is not None and math.isclose(self.mean, est, rel_tol=1e-9, abs_tol=1e-12)

    def quantile(self, q: float) -> float | None:
        """Prometheus histogram_quantile: linear interpolation inside the bucket holding rank q*count.
        The first bucket interpolates from 0; a rank in the +Inf bucket returns the last finite bound."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must be within 0..1, got {q}")
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for le, cum in self.buckets:
            if cum >= rank and cum > lower_count:
                if math.isinf(le):
                    return lower_bound
                return lower_bound + (le - lower_bound) * (rank - lower_count) / (cum - lower_count)
            lower_bound, lower_count = (le if not math.isinf(le) else lower_bound), cum
        return lower_bound


def _matches(sample: Sample, where: Mapping[str, str]) -> bool:
    return all(sample.label(k) == v for k, v in where.items())


def histogram(samples: Iterable[Sample], name: str, where: Mapping[str, str] | None = None) -> Histogram | None:
    """The histogram ``name`` (any of its bare/Ray spellings), summed over all series matching
    ``where`` (e.g. {"model_name": "tiny"}); None when the page has no such series."""
    where = where or {}
    found = None
    for variant in name_variants(name):
        buckets: dict[float, float] = {}
        total = count = 0.0
        seen = False
        for s in samples:
            if not s.name.startswith(variant) or not _matches(s, where):
                continue
            suffix = s.name[len(variant):]
            if suffix == "_bucket":
                le = s.label("le")
                if le is None:
                    continue
                bound = _parse_value(le)
                buckets[bound] = buckets.get(bound, 0.0) + s.value
                seen = True
            elif suffix == "_sum":
                total += s.value
                seen = True
            elif suffix == "_count":
                count += s.value
                seen = True
        if seen:
            found = Histogram(variant, tuple(sorted(buckets.items())), total, count)
            break
    return found


def counter(samples: Iterable[Sample], name: str, where: Mapping[str, str] | None = None) -> float | None:
    """A counter summed over matching series (``name`` or ``name_total``, bare or Ray spelling)."""
    where = where or {}
    for variant in name_variants(name):
        vals = [s.value for s in samples if s.name in (variant, variant + "_total") and _matches(s, where)]
        if vals:
            return sum(vals)
    return None


def bin_samples(values: Sequence[float], bounds: Sequence[float], name: str = "client") -> Histogram:
    """Put raw samples into the cumulative buckets ``bounds`` (upper bounds, +Inf added)."""
    ub = sorted(set(bounds) | {math.inf})
    xs = sorted(values)
    buckets = []
    j = 0
    for le in ub:
        while j < len(xs) and xs[j] <= le:
            j += 1
        buckets.append((le, float(j)))
    return Histogram(name, tuple(buckets), float(sum(xs)), float(len(xs)))
