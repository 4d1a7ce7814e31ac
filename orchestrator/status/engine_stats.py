"""What a vLLM engine says about itself: its KV-cache capacity from its start-up log, and its live
figures from its Prometheus metrics. Pure, no I/O.

``parse_kv_capacity`` reads every known wording of vLLM's capacity line (one line in 0.32, two
lines in earlier V1 releases, GPU blocks in V0; "GPU", "CPU", "XPU" or "GPU + host" pools).
``parse_dp_rank`` reads which data-parallel rank a ``DPServer`` replica is.
``live_metrics`` reads KV-cache usage, running and waiting requests (gauges, now) and TTFT/TPOT
p50/p95 from the histogram delta between two scrapes (``engine_metrics.Histogram.minus``), or since the
engines started when no earlier scrape is given. Names and their two spellings (bare vLLM,
Ray Serve LLM with a ``ReplicaId`` label) are ``orchestrator.engine_metrics``.
``prefix_cache_by_replica`` reads each replica's prefix-cache queries and hits (tokens, counters
since its engine started). ``pick_baseline`` chooses which kept scrape to diff against.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator import engine_metrics as prom
from orchestrator.serve.shapes import rank_log_keywords, rank_logs

# ----------------------------------------------------------------------------- KV capacity

# vLLM V1 (0.8 .. 0.32): "GPU KV cache size: 42,656 tokens" (0.32 adds ", Maximum concurrency ..."
# on the same line; before, that came as its own line). The device is "GPU", "CPU", "XPU", or
# "GPU + host" (hisparse). V0 printed "# GPU blocks: 1952, # CPU blocks: 2048" instead of tokens.
_SIZE = re.compile(r"(?P<device>[A-Z]{2,4}(?: \+ host)?) KV cache size: (?P<tokens>\d[\d,]*) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>\d[\d,]*) tokens per request: (?P<x>\d+(?:\.\d+)?)x")
_BLOCKS = re.compile(r"(?:^|[\s\]])#? ?(?P<device>GPU|CPU|XPU|NPU) blocks: (?P<blocks>\d+)")


@dataclass(frozen=True)
class KvCapacity:
    """The engine's KV-cache capacity as it reported it at start-up."""

    tokens: int | None  # KV-cache size in tokens (None: a V0 log, which counts blocks)
    max_model_len: int | None  # the request length the concurrency figure is for
    max_concurrency: float | None  # requests of max_model_len tokens that fit at once
    device: str | None = None  # "GPU", "CPU", "GPU + host"
    blocks: int | None = None  # V0 logs: "# GPU blocks: N"
    source: str = "log"  # "log": the engine's start-up line; "metrics": vllm:cache_config_info
    evidence: tuple[str, ...] = ()  # the line(s) it was read from

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": self.max_concurrency,
            "device": self.device,
            "blocks": self.blocks,
            "source": self.source,
            "evidence": list(self.evidence),
        }


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_kv_capacity(lines: Iterable[str]) -> KvCapacity | None:
    """The last KV-cache capacity an engine logged in ``lines`` (the latest start-up wins: a
    restarted replica logs again). Reads the one-line form of vLLM 0.32, the two-line form of
    earlier V1 releases and the blocks form of V0; None when no such line is there."""
    found: KvCapacity | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        size = _SIZE.search(line)
        conc = _CONCURRENCY.search(line)
        blocks = _BLOCKS.search(line) if not size else None
        if size:
            found = KvCapacity(
                tokens=_int(size["tokens"]),
                max_model_len=None,
                max_concurrency=None,
                device=size["device"],
                evidence=(line.strip(),),
            )
        elif blocks:
            found = KvCapacity(None, None, None, device=blocks["device"], blocks=int(blocks["blocks"]), evidence=(line.strip(),))
        if conc:
            base = found if found is not None and found.max_concurrency is None else KvCapacity(None, None, None)
            evidence = base.evidence if size else (*base.evidence, line.strip())
            found = KvCapacity(
                tokens=base.tokens,
                max_model_len=_int(conc["len"]),
                max_concurrency=float(conc["x"]),
                device=base.device,
                blocks=base.blocks,
                evidence=evidence,
            )
    return found


# The line a replica logs when it starts as a rank of a group, per application shape
# (serve.shapes: DPServer's "DPServer replica initialized: dp_rank=1, dp_size=2, gang_id=0c6edda3").
DP_RANK_KEYWORDS = tuple(rank_log_keywords())


@dataclass(frozen=True)
class DpRank:
    """A data-parallel rank as its DPServer replica logged it: its rank, the group's size and the
    gang (group) id Serve gave the group."""

    rank: int
    size: int
    group: str
    evidence: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "group": self.group}


def parse_dp_rank(lines: Iterable[str]) -> DpRank | None:
    """The last DP rank a replica's log says it is (None: not a DPServer replica, or not yet)."""
    found = None
    patterns = rank_logs()
    for raw in lines:
        m = next((m for p in patterns if (m := p.search(raw))), None)
        if m:
            found = DpRank(int(m["rank"]), int(m["size"]), m["gang"].rstrip(".,"), raw.strip())
    return found


def start_up_lines(lines: Sequence[str]) -> tuple[str, ...] | None:
    """What a replica's log says about its engine once for all: the capacity lines and, for a DP
    rank, its rank line. None until the capacity is logged (the engine is still starting)."""
    capacity = parse_kv_capacity(lines)
    if capacity is None:
        return None
    rank = parse_dp_rank(lines)
    return (*((rank.evidence,) if rank else ()), *capacity.evidence)


def kv_capacity_from_metrics(samples: Sequence[prom.Sample], model: str | None = None) -> KvCapacity | None:
    """vLLM 0.32 also publishes the capacity as labels of ``vllm:cache_config_info``
    (``kv_cache_size_tokens``, ``kv_cache_max_concurrency``); a fallback when the log is gone."""
    for s in prom.select(samples, (prom.CACHE_INFO,), model, None):
        tokens = s.label("kv_cache_size_tokens")
        conc = s.label("kv_cache_max_concurrency")
        if tokens and tokens.isdigit():
            return KvCapacity(
                tokens=int(tokens),
                max_model_len=None,
                max_concurrency=float(conc) if conc and _is_float(conc) else None,
                blocks=int(s.label("num_gpu_blocks") or 0) or None,
                source="metrics",
            )
    return None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------- live metrics


@dataclass(frozen=True)
class Latency:
    """Percentiles (seconds) of one vLLM histogram over the window, at its bucket resolution."""

    count: int
    p50: float | None
    p95: float | None
    mean: float | None

    def to_dict(self) -> dict[str, Any]:
        ms = lambda v: None if v is None else round(v * 1000.0, 3)  # noqa: E731
        return {"count": self.count, "p50_ms": ms(self.p50), "p95_ms": ms(self.p95), "mean_ms": ms(self.mean)}


@dataclass(frozen=True)
class LiveMetrics:
    kv_cache_usage: float | None  # fraction 0..1; the fullest replica when several
    running: float | None  # requests in the engines' running batch (sum over replicas)
    waiting: float | None  # requests queued for KV-cache room (sum over replicas)
    ttft: Latency | None
    tpot: Latency | None
    window_s: float | None  # seconds between the two scrapes; None: since the engines started
    engines: int = 0  # engine series seen (replicas x engines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_cache_usage": self.kv_cache_usage,
            "running": self.running,
            "waiting": self.waiting,
            "ttft": self.ttft.to_dict() if self.ttft else None,
            "tpot": self.tpot.to_dict() if self.tpot else None,
            "window_s": self.window_s,
            "since_start": self.window_s is None,
            "engines": self.engines,
        }


def _latency(
    now: Sequence[prom.Sample], before: Sequence[prom.Sample] | None, names: Sequence[str], model: str | None,
    ids: Iterable[str] | None,
) -> Latency | None:  # fmt: skip
    after_s = prom.select(now, names, model, ids)
    if not after_s:
        return None
    name = next(n for n in names if prom.select(now, (n,), model, ids))
    h_after = prom.histogram(after_s, name)
    if h_after is None:
        return None
    h_before = prom.histogram(prom.select(before, (name,), model, ids), name) if before is not None else None
    delta = h_after.minus(h_before)
    count = int(round(delta.count))
    return Latency(count, delta.quantile(0.5), delta.quantile(0.95), delta.mean)


def live_metrics(
    now: Sequence[prom.Sample],
    before: Sequence[prom.Sample] | None = None,
    model: str | None = None,
    replica_ids: Iterable[str] | None = None,
    window_s: float | None = None,
) -> LiveMetrics | None:
    """Live figures of ``model``'s engines from a scrape, with TTFT/TPOT over the requests that
    finished since ``before`` (``window_s`` seconds earlier) or, without ``before``, since the
    engines started. None when the page has no vLLM metrics at all."""
    ids = list(replica_ids) if replica_ids is not None else None
    usage = prom.gauge_values(now, prom.KV_USAGE, model, ids)
    running = prom.gauge_values(now, prom.RUNNING, model, ids)
    waiting = prom.gauge_values(now, prom.WAITING, model, ids)
    ttft = _latency(now, before, (prom.TTFT,), model, ids)
    tpot = _latency(now, before, prom.TPOT_NAMES, model, ids)
    if not (usage or running or waiting or ttft or tpot):
        return None
    return LiveMetrics(
        kv_cache_usage=max(usage) if usage else None,
        running=sum(running) if running else None,
        waiting=sum(waiting) if waiting else None,
        ttft=ttft,
        tpot=tpot,
        window_s=window_s if before is not None else None,
        engines=max(len(usage), len(running)),
    )


@dataclass(frozen=True)
class ReplicaGauges:
    """One engine replica's gauges now (each None when Ray did not export it: idle engine)."""

    kv_cache_usage: float | None  # fraction 0..1
    running: float | None
    waiting: float | None


def replica_gauges(samples: Sequence[prom.Sample], replica_id: str) -> ReplicaGauges:
    """The KV-cache usage and queues of one Serve replica: only series that carry its
    ``ReplicaId`` (a page without replica labels says nothing about any one replica)."""

    def one(names: Sequence[str]) -> float | None:
        picked = [s for s in prom.select(samples, names) if s.label(prom.REPLICA_LABEL) == replica_id]
        values = [s.value for s in picked if not s.name.endswith(("_bucket", "_sum", "_count"))]
        return max(values) if values else None

    return ReplicaGauges(one(prom.KV_USAGE), one(prom.RUNNING), one(prom.WAITING))


@dataclass(frozen=True)
class PrefixCache:
    """One engine's prefix cache since it started: prompt tokens looked up and found (vLLM's
    ``vllm:prefix_cache_queries`` / ``_hits`` counters, in tokens)."""

    queries: float
    hits: float

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"queries": self.queries, "hits": self.hits, "hit_rate": self.hit_rate}


def prefix_cache_by_replica(samples: Sequence[prom.Sample], model: str | None, replica_ids: Iterable[str]) -> dict[str, PrefixCache]:
    """Each replica's prefix-cache counters (Ray Serve LLM labels them ``ReplicaId``); a replica
    whose engine exported none yet is left out."""
    out: dict[str, PrefixCache] = {}
    for rid in replica_ids:
        where = {prom.REPLICA_LABEL: rid}
        queries = prom.counter(prom.select(samples, (prom.PREFIX_CACHE_QUERIES,), model, [rid]), prom.PREFIX_CACHE_QUERIES, where)
        hits = prom.counter(prom.select(samples, (prom.PREFIX_CACHE_HITS,), model, [rid]), prom.PREFIX_CACHE_HITS, where)
        if queries is not None:
            out[rid] = PrefixCache(queries, hits or 0.0)
    return out


def pick_baseline(kept: Sequence[tuple[float, Any]], now: float, window_s: float, min_gap_s: float = 5.0) -> tuple[float, Any] | None:
    """Of the scrapes kept from earlier runs, ``(time, scrape)``, the one that spans the longest
    part of the window: the oldest within ``window_s`` of ``now``, at least ``min_gap_s`` old.
    None when there is none (then the figures are since the engines started)."""
    eligible = [k for k in kept if now - window_s <= k[0] <= now - min_gap_s]
    return min(eligible, key=lambda k: k[0]) if eligible else None


def keep_metric_lines(text: str) -> str:
    """The part of a /metrics page worth keeping between runs: vLLM's series (and their HELP/TYPE)."""
    return "".join(line for line in text.splitlines(keepends=True) if "vllm" in line)
