"""Report writing: results.json schema, markdown, a real PNG; acceptance report folder; the pure
helpers of the cluster wiring (health word, replica choice, collective env)."""

from __future__ import annotations

import json

from orchestrator.accept.report import acceptance_dict, write_acceptance_report
from orchestrator.accept.stages import AcceptancePlan, StageResult, Targets
from orchestrator.bench.crosscheck import FigureCheck
from orchestrator.bench.latency import RequestRecord, summarize
from orchestrator.bench.report import SCHEMA, bench_result, level_dict, render_markdown, write_bench_report
from orchestrator.serve.ray_io.client import AppStatus, DeploymentStatus, ReplicaStatus
from orchestrator.workflows.accept import app_health, collective_env, engine_replica

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _level(c: int):
    recs = [
        RequestRecord(ok=True, token_times=(0.05 * c, 0.05 * c + 0.3), chunk_tokens=(1, 1), end=0.4, output_tokens=31, prompt_tokens=8)
        for _ in range(6)
    ] + [RequestRecord(ok=False, error_kind="http", error="HTTP 503")]
    check = {"ttft": FigureCheck("ttft", 6, 6, 0.05, 0.052, 0.05, 0.051, 0.052, 0.04, 0.02, True)}
    return level_dict(summarize(recs, 2.0, f"concurrency={c}", concurrency=c), check)


def test_bench_report_files_schema_and_png(tmp_path):
    levels = [_level(c) for c in (1, 4, 16)]
    result = bench_result({"url": "http://x:8000", "model": "tiny", "endpoint": "completions"},
                          {"prompt_tokens": 8, "output_tokens": 32, "requests": 7}, levels, None, "2026-11-29T10:00:00+00:00")  # fmt: skip
    paths = write_bench_report(result, tmp_path / "out", targets={"ttft_p95_ms": 500})
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == SCHEMA and len(data["levels"]) == 3
    lv = data["levels"][1]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(lv[key]) == {"count", "mean", "p50", "p95", "p99", "min", "max"}
    assert lv["errors"] == {"http": 1} and lv["succeeded"] == 6 and lv["concurrency"] == 4
    assert lv["ttft_ms"]["p50"] == 200.0  # 0.05 s * 4, in ms
    assert lv["tpot_ms"]["p50"] == 10.0  # 0.3 s / 30
    assert lv["crosscheck"]["ttft"]["agrees"] is True
    png = paths["plot"].read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    md = paths["markdown"].read_text()
    assert "| concurrency=16 | 6/7 | http 1 |" in md and "tradeoff.png" in md and "Cross-check" in md


def test_markdown_without_crosscheck_or_successes():
    from orchestrator.bench.latency import summarize

    failed = level_dict(summarize([RequestRecord(ok=False, error_kind="connection", error="refused")], 1.0, "concurrency=1", 1))
    md = render_markdown(bench_result({"url": "u", "model": "m", "endpoint": "completions"}, {}, [failed]), None)
    assert "| concurrency=1 | 0/1 | connection 1 |" in md and "Cross-check" not in md


def test_acceptance_report_folder(tmp_path):
    plan = AcceptancePlan(targets=Targets(ttft_p95_ms=500, tpot_p95_ms=50))
    results = [
        StageResult("topology", "pass", "1 node(s), 0 GPU(s) captured", 1.0, {}, {"nodes": {"head": {"gpus": [], "nics": [{"name": "lo", "state": "UNKNOWN", "mtu": 65536}], "collective_env": {"GLOO_SOCKET_IFNAME": "lo"}}}}),
        StageResult("concurrency_sweep", "pass", "targets met up to concurrency 4", 9.0, {"highest_concurrency_meeting_targets": 4},
                    {"levels": [_level(1), _level(2), _level(4)]}),
        StageResult("failure", "fail", "never unhealthy", 30.0, {"killed": {"pid": 1}}, {"health_timeline": [(0.0, "healthy")], "traffic": {}}),
    ]  # fmt: skip
    data = acceptance_dict(results, plan, {"cluster": "local", "model": "tiny", "url": "http://x"}, None)
    assert data["verdict"] == "fail"
    paths = write_acceptance_report(data, tmp_path / "acc")
    assert json.loads(paths["json"].read_text())["stages"][2]["verdict"] == "fail"
    assert paths["plot"].read_bytes().startswith(PNG_MAGIC)
    md = paths["markdown"].read_text()
    assert "**Verdict: FAIL**" in md and "| failure | **FAIL** |" in md and "GLOO_SOCKET_IFNAME=lo" in md and "sweep.png" in md


def _app(status="RUNNING", dep_status="HEALTHY", states=("RUNNING",)):
    reps = tuple(ReplicaStatus(f"r{i}", s, node_id="n1", node_ip="10.0.0.1", pid=100 + i) for i, s in enumerate(states))
    return AppStatus("orch-r1", status, deployments=(DeploymentStatus("LLMServer:tiny", dep_status, replicas=reps),
                                                     DeploymentStatus("LLMRouter", "HEALTHY", replicas=(ReplicaStatus("x", "RUNNING"),))))  # fmt: skip


def test_app_health_words():
    assert app_health(_app()) == "healthy"
    assert app_health(None) == "absent"
    assert app_health(_app(status="DEPLOYING")) == "deploying"
    assert app_health(_app(dep_status="UNHEALTHY", states=("RECOVERING",))) == "LLMServer:tiny unhealthy 1 recovering"


def test_engine_replica_prefers_a_running_replica_of_the_model():
    dep, rep = engine_replica(_app(states=("STARTING", "RUNNING")), "tiny")
    assert dep.name == "LLMServer:tiny" and rep.replica_id == "r1" and rep.pid == 101


def test_collective_env_keeps_only_the_variables_collectives_read():
    env = {"NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0", "VLLM_HOST_IP": "10.0.0.1", "RAY_AUTH_MODE": "token", "PATH": "/bin"}
    assert collective_env(env) == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0", "VLLM_HOST_IP": "10.0.0.1"}
