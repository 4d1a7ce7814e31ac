"""Failure signatures against real log lines (GitHub issues of vLLM, Ray, NCCL; see
tests/data/logs/SOURCES.md) and against captured logs of healthy runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.doctor.diagnose import CODES
from orchestrator.doctor.signatures import (
    EVIDENCE_MAX_CHARS,
    SIGNATURE_CODES,
    SIGNATURES,
    LogLine,
    clean_evidence,
    match_line,
    match_logs,
)

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
NORMAL = LOGS / "normal"


def _real_lines(code: str) -> list[str]:
    return [line for line in (LOGS / f"{code}.log").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("code", sorted(SIGNATURE_CODES))
def test_every_signature_code_has_real_log_lines_with_sources(code):
    path = LOGS / f"{code}.log"
    assert path.is_file(), f"no real log lines for {code}"
    assert _real_lines(code), f"{path} is empty"
    assert f"## {code}.log" in (LOGS / "SOURCES.md").read_text(), f"SOURCES.md does not list {code}.log"


@pytest.mark.parametrize(
    "code,line",
    [(code, line) for code in sorted(SIGNATURE_CODES) for line in _real_lines(code)],
    ids=lambda v: v[:40] if isinstance(v, str) else str(v),
)
def test_real_line_matches_its_code_and_no_other(code, line):
    assert [s.code for s in match_line(line)] == [code]


def test_every_signature_pattern_is_exercised_by_a_real_line():
    unused = []
    for sig in SIGNATURES:
        if not any(sig.match(line) for line in _real_lines(sig.code)):
            unused.append((sig.code, sig.pattern.pattern))
    assert unused == []


def test_normal_logs_exist_and_show_no_failure():
    """A healthy Ray Serve LLM run: nothing but the slow-start warning it really printed."""
    files = sorted(p for p in NORMAL.rglob("*") if p.is_file() and p.name != "README.md")
    assert len(files) >= 5, "captured healthy logs are missing"
    lines = []
    for path in files:
        rel = str(path.relative_to(NORMAL))
        lines += [LogLine("head", rel, i, t) for i, t in enumerate(path.read_text(errors="replace").splitlines(), 1)]
    assert len(lines) > 1000
    findings = match_logs(lines)
    assert [(f.code, f.severity) for f in findings] == [("PLACEMENT_INFEASIBLE", "warn")]
    assert "taken more than 30s to be scheduled" in findings[0].evidence


@pytest.mark.parametrize(
    "line",
    [
        # vLLM prints these on every healthy start with the Ray executor / compiled graphs
        "INFO 06-12 10:46:22 [ray_distributed_executor.py:579] RAY_CGRAPH_get_timeout is set to 300",
        "INFO 07-28 23:02:27 [kv_cache_utils.py:833] GPU KV cache size: 176,240 tokens",
        # an HF repo id that is a repo id, not a path: not a missing model directory
        "Repo id must be in the form 'repo_name' or 'namespace/repo_name': 'a/b/c'. Use `repo_type` argument if needed.",
        # NCCL retrying a connect is not yet a failure (https://github.com/NVIDIA/nccl/pull/1618)
        "[03/16][2025-02-25 15:46:48,390] [misc/socket.cc:551] [s11gn1268:pid=3987720] NCCL INFO socketPollConnect: "
        "connect returned Connection timed out, retrying (1/34) after sleep for 100 msec",
        # NCCL naming the interface it uses is the healthy case
        "ae05277d311f:55933:55933 [1] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0",
        "ae05277d311f:55933:55933 [1] NCCL INFO Bootstrap : Using eth0:172.17.0.3<0>",
        # a slow constructor is not a resource shortage
        "Deployment 'LLMServer:tiny' in application 'llm' has 1 replicas that have taken more than 30s to initialize. "
        "This may be caused by a slow __init__ or reconfigure method.",
    ],
)
def test_healthy_lines_match_nothing(line):
    assert match_line(line) == []


def test_match_logs_dedups_per_node_and_code_and_counts():
    oom = _real_lines("CUDA_OOM")
    lines = [
        LogLine("w1", "logs/worker-a.err", 10, oom[2]),
        LogLine("w1", "logs/worker-b.err", 3, oom[0]),
        LogLine("w2", "logs/worker-c.err", 7, oom[1]),
    ]
    findings = match_logs(lines)
    assert [(f.node, f.code, f.count, f.where) for f in findings] == [
        ("w1", "CUDA_OOM", 2, "logs/worker-a.err:10"),
        ("w2", "CUDA_OOM", 1, "logs/worker-c.err:7"),
    ]
    assert "GPU 3 has a total capacity" in findings[0].evidence
    assert findings[0].hint.endswith("runbooks/CUDA_OOM.md")


def test_match_logs_prefers_a_failing_line_over_an_earlier_warning():
    warn, fail = _real_lines("NODE_HEARTBEAT_LOST")[3], _real_lines("NODE_HEARTBEAT_LOST")[4]
    findings = match_logs([LogLine("w", "logs/raylet.out", 1, warn), LogLine("w", "logs/raylet.out", 9, fail)])
    assert len(findings) == 1
    assert (findings[0].severity, findings[0].line_no, findings[0].count) == ("fail", 9, 2)


def test_findings_are_ordered_failures_first():
    warn = next(x for x in _real_lines("COLLECTIVE_CONNECT_FAILED") if "Connection closed by remote peer" in x)
    fail = _real_lines("GCS_UNREACHABLE")[0]
    findings = match_logs([LogLine("a", "f", 1, warn), LogLine("b", "f", 1, fail)])
    assert [(f.severity, f.code) for f in findings] == [("fail", "GCS_UNREACHABLE"), ("warn", "COLLECTIVE_CONNECT_FAILED")]


def test_evidence_is_cleaned_and_bounded():
    assert clean_evidence("\x1b[36m(RayWorkerWrapper pid=1)\x1b[0m boom  ") == "(RayWorkerWrapper pid=1) boom"
    long = clean_evidence("x" * 5000)
    assert len(long) == EVIDENCE_MAX_CHARS and long.endswith("...")


def test_every_hint_links_its_runbook_and_doctor_exports_all_codes():
    for sig in SIGNATURES:
        assert sig.hint.endswith(f"runbooks/{sig.code}.md"), sig.code
        assert sig.code in CODES
    assert set(SIGNATURE_CODES) <= set(CODES)
