"""Failure signatures against real log lines (GitHub issues of vLLM, Ray, NCCL; see
tests/data/logs/SOURCES.md) and against captured logs of healthy runs."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.doctor.diagnose import CODES
from orchestrator.doctor.matching import (
    EVIDENCE_MAX_CHARS,
    DoctorFinding,
    LogLine,
    clean_evidence,
    match_line,
    match_logs,
)
from orchestrator.doctor.signatures import SIGNATURE_CODES, SIGNATURES, _looks_like_path, _sig

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
    # ids: the code and the line's number in <CODE>.log (plain text: mutmut selects tests by id)
    [
        pytest.param(code, line, id=f"{code}-{n}")
        for code in sorted(SIGNATURE_CODES)
        for n, line in enumerate(_real_lines(code), 1)
    ],
)
def test_real_line_matches_its_code_and_no_other(code, line):
    assert [s.code for s in match_line(line, SIGNATURES)] == [code]


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
    findings = match_logs(lines, SIGNATURES)
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
        # NVSHMEM reporting its settings (https://github.com/deepseek-ai/DeepEP/issues/38): a transport
        # source path, not an error
        "/work/nvshmem_src/src/modules/transport/common/transport_ib_common.h 103 NVSHMEM_IB_ADDR_FAMILY set by "
        "environment to AF_INET",
    ],
)
def test_healthy_lines_match_nothing(line):
    assert match_line(line, SIGNATURES) == []


def test_match_logs_dedups_per_node_and_code_and_counts():
    oom = _real_lines("CUDA_OOM")
    lines = [
        LogLine("w1", "logs/worker-a.err", 10, oom[2]),
        LogLine("w1", "logs/worker-b.err", 3, oom[0]),
        LogLine("w2", "logs/worker-c.err", 7, oom[1]),
    ]
    findings = match_logs(lines, SIGNATURES)
    assert [(f.node, f.code, f.count, f.where) for f in findings] == [
        ("w1", "CUDA_OOM", 2, "logs/worker-a.err:10"),
        ("w2", "CUDA_OOM", 1, "logs/worker-c.err:7"),
    ]
    assert "GPU 3 has a total capacity" in findings[0].evidence
    assert findings[0].hint.endswith("runbooks/CUDA_OOM.md")


def test_match_logs_prefers_a_failing_line_over_an_earlier_warning():
    warn, fail = _real_lines("NODE_HEARTBEAT_LOST")[3], _real_lines("NODE_HEARTBEAT_LOST")[4]
    findings = match_logs(
        [LogLine("w", "logs/raylet.out", 1, warn), LogLine("w", "logs/raylet.out", 9, fail)], SIGNATURES
    )
    assert len(findings) == 1
    assert (findings[0].severity, findings[0].line_no, findings[0].count) == ("fail", 9, 2)


def test_findings_are_ordered_failures_first():
    warn = next(x for x in _real_lines("COLLECTIVE_CONNECT_FAILED") if "Connection closed by remote peer" in x)
    fail = _real_lines("GCS_UNREACHABLE")[0]
    findings = match_logs([LogLine("a", "f", 1, warn), LogLine("b", "f", 1, fail)], SIGNATURES)
    assert [(f.severity, f.code) for f in findings] == [
        ("fail", "GCS_UNREACHABLE"),
        ("warn", "COLLECTIVE_CONNECT_FAILED"),
    ]


def test_evidence_is_cleaned_and_bounded():
    assert clean_evidence("\x1b[36m(RayWorkerWrapper pid=1)\x1b[0m boom  ") == "(RayWorkerWrapper pid=1) boom"
    long = clean_evidence("x" * 5000)
    assert len(long) == EVIDENCE_MAX_CHARS and long.endswith("...")


def test_every_hint_links_its_runbook_and_doctor_exports_all_codes():
    for sig in SIGNATURES:
        assert sig.hint.endswith(f"runbooks/{sig.code}.md"), sig.code
        assert sig.code in CODES
    assert set(SIGNATURE_CODES) <= set(CODES)


# ---- behaviour the mutation run (issue 17) showed untested


def test_a_signature_is_built_with_its_codes_title_and_runbook_hint():
    # SIGNATURES is built once at import; the builder itself is checked here
    sig = _sig("CUDA_OOM", r"CUDA out of memory", ("CUDA out of memory",), "vllm")
    assert (sig.code, sig.title, sig.component, sig.severity) == (
        "CUDA_OOM",
        SIGNATURE_CODES["CUDA_OOM"],
        "vllm",
        "fail",
    )
    assert sig.pattern == re.compile(r"CUDA out of memory") and sig.keywords == ("CUDA out of memory",)
    assert "gpu_memory_utilization" in sig.hint and sig.hint.endswith(
        "; see `orch runbook CUDA_OOM` or runbooks/CUDA_OOM.md"
    )
    assert sig.predicate is None
    path_sig = _sig(
        "MODEL_PATH_NOT_FOUND", r"'(?P<value>[^']+)'", ("'",), "vllm", severity="warn", predicate=_looks_like_path
    )
    assert path_sig.severity == "warn" and path_sig.predicate is _looks_like_path
    assert path_sig.match("'/models/x'") is not None and path_sig.match("'org/model'") is None


def test_a_line_of_exactly_the_evidence_limit_is_kept_whole():
    assert clean_evidence("x" * EVIDENCE_MAX_CHARS) == "x" * EVIDENCE_MAX_CHARS
    assert clean_evidence("x" * (EVIDENCE_MAX_CHARS + 1)) == "x" * (EVIDENCE_MAX_CHARS - 3) + "..."


def test_one_line_reports_each_code_once_and_every_code_it_shows():
    # a real OOM line; signatures listed here: two for one code report it once (the first
    # listed), a third of another code that the same line shows is reported too
    line = min(_real_lines("CUDA_OOM"), key=len)
    first = _sig("CUDA_OOM", r"CUDA out of memory", ("CUDA out of memory",), "vllm")
    second = _sig("CUDA_OOM", r"OutOfMemoryError", ("OutOfMemoryError",), "vllm", severity="warn")
    other = _sig("ENGINE_DEAD", r"Tried to allocate", ("Tried to allocate",), "vllm")
    assert match_line(line, [first, second, other]) == [first, other]
    findings = match_logs([LogLine("w", "f", 1, line)], [first, second, other])
    assert [(f.code, f.severity, f.count) for f in findings] == [("CUDA_OOM", "fail", 1), ("ENGINE_DEAD", "fail", 1)]


def test_match_logs_uses_the_signatures_it_is_given():
    oom = _real_lines("CUDA_OOM")[0]
    only_dead = [s for s in SIGNATURES if s.code == "ENGINE_DEAD"]
    assert match_logs([LogLine("w", "f", 1, oom)], only_dead) == []


def test_a_finding_carries_the_signature_title_component_file_evidence_and_hint():
    oom = min(_real_lines("CUDA_OOM"), key=len)  # 497 characters: the evidence is the line cut to the limit
    (f,) = match_logs([LogLine("w1", "logs/worker-a.err", 10, "\x1b[31m" + oom + "  ")], SIGNATURES)
    sig = match_line(oom, SIGNATURES)[0]
    assert (f.title, f.component, f.file, f.hint) == (
        SIGNATURE_CODES["CUDA_OOM"],
        "vllm",
        "logs/worker-a.err",
        sig.hint,
    )
    assert f.evidence == oom[: EVIDENCE_MAX_CHARS - 3] + "..."  # colour code dropped, cut to the limit


def test_a_failing_line_after_a_warning_replaces_the_evidence_file_and_hint():
    warn, fail = _real_lines("NODE_HEARTBEAT_LOST")[3], _real_lines("NODE_HEARTBEAT_LOST")[4]
    findings = match_logs(
        [
            LogLine("w", "logs/raylet.out", 1, warn),
            LogLine("w", "logs/gcs_server.out", 9, fail),
            LogLine("x", "logs/raylet.out", 2, warn),  # later lines are still read
        ],
        SIGNATURES,
    )
    f = next(f for f in findings if f.node == "w")
    fail_sig = match_line(fail, SIGNATURES)[0]
    assert (f.file, f.line_no, f.evidence, f.hint, f.severity) == (
        "logs/gcs_server.out",
        9,
        fail.strip(),
        fail_sig.hint,
        "fail",
    )
    assert (f.title, f.component, f.count) == (SIGNATURE_CODES["NODE_HEARTBEAT_LOST"], "ray", 2)
    assert [(g.node, g.severity) for g in findings] == [("w", "fail"), ("x", "warn")]


def test_a_second_node_after_a_repeated_line_is_still_reported():
    oom = _real_lines("CUDA_OOM")[0]
    findings = match_logs([LogLine("a", "f", 1, oom), LogLine("a", "f", 2, oom), LogLine("b", "f", 1, oom)], SIGNATURES)
    assert [(f.node, f.count) for f in findings] == [("a", 2), ("b", 1)]


def test_finding_json_names_every_field():
    f = DoctorFinding(
        "CUDA_OOM", "w1", "logs/a.err", 3, "boom", "hint text", "warn", "CUDA out of memory", "vllm", 2, "logs"
    )
    assert f.to_dict() == {
        "code": "CUDA_OOM",
        "severity": "warn",
        "title": "CUDA out of memory",
        "component": "vllm",
        "node": "w1",
        "file": "logs/a.err",
        "line_no": 3,
        "evidence": "boom",
        "count": 2,
        "hint": "hint text",
        "source": "logs",
    }


def test_the_failing_signature_hint_replaces_the_warning_hint():
    # signatures given to match_logs may carry their own hints: the upgrade takes the failing one's
    line = min(_real_lines("CUDA_OOM"), key=len)
    warn = replace(
        _sig("CUDA_OOM", r"OutOfMemoryError", ("OutOfMemoryError",), "vllm", severity="warn"), hint="warn hint"
    )
    fail = replace(_sig("CUDA_OOM", r"CUDA out of memory", ("CUDA out of memory",), "vllm"), hint="fail hint")
    # the first line shows only the warning's pattern, the second (a real OOM line) the failing one's
    upgraded = match_logs([LogLine("w", "a", 1, "torch.OutOfMemoryError"), LogLine("w", "b", 2, line)], [fail, warn])
    assert [(f.severity, f.hint, f.file, f.count) for f in upgraded] == [("fail", "fail hint", "b", 2)]


def test_a_timed_out_all_reduce_is_not_an_all_to_all_timeout():
    """torch's watchdog names the collective: only ALLTOALL ops are the expert-parallel exchange
    (https://github.com/vllm-project/vllm/issues/6042, a TP all-reduce)."""
    line = ("(RayWorkerWrapper pid=489968) [rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1572864, NumelOut=1572864, "
            "Timeout(ms)=600000) ran for 600021 milliseconds before timing out.")
    assert "EP_ALLTOALL_TIMEOUT" not in [s.code for s in match_line(line, SIGNATURES)]
    assert [s.code for s in match_line(line.replace("OpType=ALLREDUCE", "OpType=ALLTOALL_BASE"), SIGNATURES)] == [
        "EP_ALLTOALL_TIMEOUT"
    ]
