"""vLLM engine metrics: their names, and the Prometheus text format and histogram arithmetic to
read them. Pure; the bottom of the house beside ``errors`` (it imports only prometheus_client).

Everything in orch that reads an engine's ``/metrics`` goes through here: ``orch status`` (KV
usage, running/waiting requests, live TTFT/TPOT, prefix-cache hits), ``orch bench``'s cross-check
against vLLM's own histograms, and the rollout's measurements.

``parse_text`` reads a ``/metrics`` page into samples (with ``prometheus_client``'s parser).
``select`` finds a metric's samples under either spelling: ``vllm:x`` on a bare vLLM server and
``ray_vllm_x`` on a Ray node's metrics export port (Ray Serve LLM sanitises ``:`` to ``_``, Ray
prefixes ``ray_`` and adds a ``ReplicaId`` label: vllm/v1/metrics/ray_wrappers.py), narrowed to
one model and to given replicas. ``histogram`` collects one histogram family (summed over the
series that match a label filter); ``Histogram.minus`` gives the delta of two scrapes (what one
benchmark run added), ``mean`` is exact (sum/count), ``quantile`` interpolates linearly inside the
bucket as Prometheus' ``histogram_quantile`` does; ``bin_samples`` puts a client's own samples
into the same buckets so both sides can be compared with one estimator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# vLLM 0.32 names (vllm/v1/metrics/loggers.py); where a name changed, older spellings follow in
# the tuples that status looks up (the first one present wins).
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
E2E = "vllm:e2e_request_latency_seconds"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
TPOT_NAMES = (TPOT, "vllm:time_per_output_token_seconds")
CACHE_INFO = "vllm:cache_config_info"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counters, in tokens (vllm/v1/metrics/loggers.py)
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
REQUEST_SUCCESS = "vllm:request_success"  # counter of finished requests (label finished_reason)
REPLICA_LABEL = "ReplicaId"  # added by vLLM's RayPrometheusStatLogger under Ray Serve LLM
MODEL_LABEL = "model_name"


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


def parse_text(text: str) -> list[Sample]:
    """Every sample of a Prometheus text-format page, read by ``prometheus_client``'s parser
    (escapes, timestamps, NaN/Inf, TYPE/HELP lines); a page it cannot read is a MetricsFormatError."""
    try:
        return [
            Sample(sample.name, tuple(sample.labels.items()), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError as exc:
        raise MetricsFormatError(f"not Prometheus text format: {exc}") from exc


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
                bound = float(le)  # float() reads +Inf
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


_SUFFIXES = ("", "_bucket", "_sum", "_count", "_total")


def select(samples: Sequence[Sample], names: Sequence[str], model: str | None = None, replica_ids: Iterable[str] | None = None) -> list[Sample]:
    """Samples of the first of ``names`` (bare or Ray spelling, with suffixes) present, for
    ``model`` when the page labels models, and for the given replicas when it labels replicas."""
    ids = set(replica_ids) if replica_ids is not None else None
    for name in names:
        variants = name_variants(name)
        hits = [s for s in samples if any(s.name == v + suf for v in variants for suf in _SUFFIXES)]
        if not hits:
            continue
        if model is not None and any(s.label(MODEL_LABEL) is not None for s in hits):
            hits = [s for s in hits if s.label(MODEL_LABEL) == model]  # another model's: not ours
        if ids is not None and any(s.label(REPLICA_LABEL) for s in hits):
            hits = [s for s in hits if s.label(REPLICA_LABEL) in ids]
        return hits
    return []


def gauge_values(samples: Sequence[Sample], names: Sequence[str], model: str | None = None, replica_ids: Iterable[str] | None = None) -> list[float]:
    """The values of a gauge or counter (``select`` without histogram parts)."""
    return [s.value for s in select(samples, names, model, replica_ids) if not s.name.endswith(("_bucket", "_sum", "_count"))]
