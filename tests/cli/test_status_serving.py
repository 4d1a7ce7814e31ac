"""The serving section's rendering (rich) and JSON, from the real captures."""

from __future__ import annotations

import json

from rich.console import Console

from orchestrator.cli.status_serving import render_serving, render_serving_to, serving_json
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.status.views import NodeRef
from tests.unit.test_status_serving import LOGGED, NODE_ID, build, payload


def text_of(serving, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    render_serving_to(console, serving)
    return console.export_text()


def test_running_section_shows_capacity_as_logged_live_figures_and_probe():
    out = text_of(build())
    assert "application orch-r1 RUNNING on route /, revision 1 (tiny, ready" in out
    assert "LLMServer:tiny" in out and "75z13c9r" in out and "head" in out
    # The same figures as the engine's line, in the same notation.
    assert "KV cache 524,288 tokens (CPU), max concurrency 512.00x at 1,024 tokens (engine log)" in out
    assert "524,288 tokens" in LOGGED and "1,024 tokens per request: 512.00x" in LOGGED
    assert "(n=16)" in out and "last 42 s" in out
    assert "Serve max_ongoing_requests 64 per replica; engine max_num_seqs vLLM's default" in out
    assert "ready (completion in 201 ms)" in out
    assert "fail" not in out and "hint" not in out


def test_problems_are_printed_with_their_hints():
    out = text_of(build(payload("unhealthy-engine-killed"), engine_logs={}, metrics_now=None, metrics_before=None,
                        nodes=[NodeRef("head", NODE_ID, "DEAD", reachable=False)],
                        probe=ProbeResult(False, None, None, "ConnectError: refused", "http://h:8000/v1/completions", "tiny")), width=200)  # fmt: skip
    assert "application orch-r1 UNHEALTHY" in out
    assert "fail NODE_HEARTBEAT_LOST head: node head is DEAD in Ray" in out
    assert "fail REPLICA_UNHEALTHY LLMServer:tiny" in out and "warn REPLICA_UNHEALTHY gz59mfrk" in out
    assert "probe failed (no answer: ConnectError: refused)" in out
    for code in ("NODE_HEARTBEAT_LOST", "REPLICA_UNHEALTHY", "SERVE_APP_NOT_RUNNING", "ENDPOINT_PROBE_FAILED"):
        assert f"runbooks/{code}.md" in out
    assert "KV cache unknown" in out and "not logged yet" in out


def test_idle_engine_and_missing_section():
    out = text_of(build(metrics_now=[], metrics_before=None))
    assert "live: no engine metrics" in out
    console = Console(width=80, record=True, color_system=None)
    console.print(render_serving(None))
    assert "serving: not read" in console.export_text()


def test_json_is_the_values_dict():
    s = build()
    assert serving_json(s) == json.loads(json.dumps(s.to_dict()))
    assert serving_json(None) is None


def test_nothing_deployed():
    from orchestrator.serve.ray_io.client import parse_serve_status
    from orchestrator.status.serving import build_serving_status

    s = build_serving_status(parse_serve_status({"applications": {}}), revision=None)
    assert s.problems == () and not s.healthy
    assert "serving: nothing is deployed" in text_of(s)


def test_status_shows_planned_against_measured_memory():
    from orchestrator.cli.status_serving import calibration_line

    record = {"vllm_version": "0.10.1.1", "tp": 1, "pp": 1, "measured_reserve_gib": 0.5,
              "predicted": {"weights_gib": 14.18, "kv_gib": 24.8, "kv_tokens": 464_368},
              "measured": {"weights_gib": 14.2488, "kv_gib": 24.83, "kv_tokens": 464_848},
              "error": {"weights_gib": -0.0048, "kv_gib": -0.0012, "kv_tokens": -0.001}}  # fmt: skip
    line = calibration_line(record)
    assert "KV tokens 464,368 planned, 464,848 measured (-0.1%)" in line
    assert "weights 14.18 GiB planned, 14.25 GiB measured (-0.5%)" in line
    assert "measured reserve 0.50 GiB per GPU, used by `orch plan --cluster`" in line


def test_status_does_not_compare_a_cpu_engine_with_a_gpu_plan():
    """The stand-in GPU test bed (H100 planned, vLLM's CPU backend ran): the record made from the
    captured CPU replica log is shown as measured only, never as an error against the H100 plan."""
    from pathlib import Path

    from orchestrator.cli.status_serving import calibration_line
    from orchestrator.plan.calibration import calibration_record, parse_engine_figures

    log = Path(__file__).resolve().parents[1] / "data/logs/engine/ray-serve-llm-cpu-replica-worker.out"
    plan = {"model_fingerprint": "f", "gpu_type": "H100-80GB", "vllm_version": "0.32.0", "tp": 2, "pp": 1, "gpu_memory_gib": 79.18,
            "engine_kwargs": {"gpu_memory_utilization": 0.92}, "kv_cache_tokens": 75_455_232}  # fmt: skip
    line = calibration_line(calibration_record(plan, parse_engine_figures(log.read_text().splitlines())))
    assert "planned" not in line and "%" not in line
    assert "KV tokens 524,288 measured; the engine ran on vLLM's cpu platform, not on H100-80GB" in line
