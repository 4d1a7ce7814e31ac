"""Which start failures a retry cannot fix (doctor.codes.RETRY_CANNOT_FIX), and the cause
doctor.start_cause names, against real lines: Serve's deployment messages and the failed
replicas' logs captured on the test bed (tests/data/serve/start-failures/, SOURCES.md there),
the issue lines of tests/data/logs/<CODE>.log, and logs of healthy starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.doctor.codes import CODE_INFO, RETRY_CANNOT_FIX
from orchestrator.doctor.matching import LogLine
from orchestrator.doctor.signatures import SIGNATURES
from orchestrator.doctor.start_cause import start_cause, start_keywords, text_lines
from orchestrator.serve.ray_io.client import parse_serve_status, startup_failures

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = DATA / "logs"
CAPTURES = DATA / "serve" / "start-failures"


def _candidate(name: str):
    """The candidate application (not the serving orch-r1) of a captured Serve status."""
    status = parse_serve_status(json.loads((CAPTURES / name).read_text()))
    return next(a for n, a in status.applications.items() if n != "orch-r1")


def _real_lines(code: str) -> list[str]:
    return [line for line in (LOGS / f"{code}.log").read_text().splitlines() if line.strip()]


def _log(path: Path, node: str = "host0") -> list[LogLine]:
    return [LogLine(node, f"logs/{path.name}", i, t) for i, t in enumerate(path.read_text(errors="replace").splitlines(), 1)]


# ---- the property, per signature


def test_every_code_a_retry_cannot_fix_is_a_signature_code_with_a_reason():
    assert set(RETRY_CANNOT_FIX) <= set(CODE_INFO)
    assert all(reason.strip() for reason in RETRY_CANNOT_FIX.values())


def test_only_failing_signatures_of_those_codes_stop_a_rollout():
    for sig in SIGNATURES:
        assert sig.retry_cannot_fix == (sig.severity == "fail" and sig.code in RETRY_CANNOT_FIX), (sig.code, sig.pattern.pattern)
    # a peer hanging up is the echo of another rank's failure: a warning, never a stop on its own
    closed = next(x for x in _real_lines("COLLECTIVE_CONNECT_FAILED") if "Connection closed by remote peer" in x)
    assert start_cause([LogLine("w", "f", 1, closed)]) is None


@pytest.mark.parametrize("code", ["GCS_UNREACHABLE", "NODE_HEARTBEAT_LOST", "PLACEMENT_INFEASIBLE", "ENGINE_DEAD"])
def test_a_failure_the_next_attempt_may_not_meet_leaves_serves_retries_alone(code):
    """A node briefly unreachable, a wait for resources, an engine that died of something else:
    the real lines of these codes never stop a rollout."""
    lines = [LogLine("w", "f", i, t) for i, t in enumerate(_real_lines(code), 1)]
    assert start_cause(lines) is None


@pytest.mark.parametrize("code", sorted(RETRY_CANNOT_FIX))
def test_every_real_failing_line_of_a_code_a_retry_cannot_fix_is_named_as_that_code(code):
    failing = [t for t in _real_lines(code) if any(s.code == code and s.severity == "fail" and s.match(t) for s in SIGNATURES)]
    assert failing
    for text in failing:
        cause = start_cause([LogLine("w1", "logs/worker-x.err", 7, text)])
        assert cause is not None and cause.code == code, text
        assert cause.where == "w1:logs/worker-x.err:7"
        assert cause.hint.endswith(f"runbooks/{code}.md") and cause.reason == RETRY_CANNOT_FIX[code]


def test_the_keywords_sent_to_the_node_are_those_of_the_stopping_signatures_only():
    words = start_keywords()
    assert "connectFullMesh" in words and "CUDA out of memory" in words
    assert "Last heartbeat was sent" not in words and "EngineDeadError" not in words


# ---- the cause among many lines


def test_the_first_line_showing_such_a_failure_is_the_cause_and_takes_its_context():
    text = "\n".join(["Traceback (most recent call last):", "RuntimeError: Engine core initialization failed.",
                      _real_lines("COLLECTIVE_PEER_LOOPBACK")[2], "next line", "", "after a blank"])  # fmt: skip
    cause = start_cause(text_lines(text, "Serve's message"), context=2)
    assert cause is not None and cause.code == "COLLECTIVE_PEER_LOOPBACK"
    assert cause.where == "Serve's message:3"
    assert cause.evidence.endswith("| next line")  # the blank line ends the context
    assert start_cause(text_lines(text, "Serve's message")).evidence == _real_lines("COLLECTIVE_PEER_LOOPBACK")[2].strip()


def test_healthy_start_logs_show_no_such_cause():
    healthy = _log(LOGS / "engine" / "ray-serve-llm-cpu-replica-worker.out")
    for path in sorted(p for p in (LOGS / "normal").rglob("*") if p.is_file() and p.name != "README.md"):
        healthy += _log(path)
    assert len(healthy) > 1000
    assert start_cause(healthy) is None


@pytest.mark.parametrize(
    "line",
    [
        # ModelConfig's header: its validators also report a missing model or an unknown
        # architecture, named by their own lines (https://github.com/modelscope/ms-swift/issues/6290)
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        # a validator's error on the model's own files, not an argument's value
        # (https://github.com/OpenSQZ/MiniCPM-V-CookBook/issues/51)
        "(APIServer pid=2994609)   Value error, Expecting value: line 1 column 1 (char 0) [type=value_error, "
        "input_value=ArgsKwargs((), {'model': ...rocessor_plugin': None}), input_type=ArgsKwargs]",
    ],
)
def test_lines_that_do_not_say_which_cause_name_none(line):
    assert start_cause([LogLine("w", "f", 1, line)]) is None


# ---- captured on the test bed: a TP=2 candidate across two hosts with `interface: lo`


def test_the_wrong_interface_message_names_the_failed_replica_but_not_the_cause():
    (failure,) = startup_failures(_candidate("wrong-nic-retrying.json"))
    assert (failure.deployment, failure.retries_left, failure.pid, failure.node_ip) == ("LLMServer:tiny", 2, 214, "10.170.162.12")
    assert failure.error.rstrip().endswith("RuntimeError: Engine core initialization failed. See root cause above. "
                                           "Failed core proc(s): {}")  # fmt: skip
    assert start_cause(text_lines(failure.error, "Serve's message"), context=2) is None


def test_the_failed_replicas_log_names_the_loopback_peer():
    """Its .err holds Gloo's last connect (forwarded from the rank on the other host), its .out
    the EngineCore's error: both name a peer at 127.0.0.1; the scan reads .err first."""
    err, out = sorted(CAPTURES.glob("worker-*-214.*"))
    assert err.suffix == ".err" and out.suffix == ".out"
    cause = start_cause(_log(err, "host2") + _log(out, "host2"))
    assert cause is not None and cause.code == "COLLECTIVE_PEER_LOOPBACK"
    assert "ERROR failed to connect, willRetry=0" in cause.evidence and "remote=[127.0.0.1]:15272" in cause.evidence
    assert cause.where.startswith(f"host2:logs/{err.name}:")
    from_out = start_cause(_log(out, "host2"))
    assert from_out is not None and from_out.code == "COLLECTIVE_PEER_LOOPBACK"
    assert "(EngineCore pid=695) ERROR" in from_out.evidence and "Gloo connectFullMesh failed" in from_out.evidence


def test_a_replica_waiting_to_be_scheduled_has_not_failed():
    assert startup_failures(_candidate("wrong-nic-scheduling.json")) == []


def test_an_unknown_architecture_is_named_from_serves_message_alone():
    """A config error fails in the replica's constructor: the cause is in the message, with
    pydantic's class line before it, and nothing needs reading on the node."""
    (failure,) = startup_failures(_candidate("bad-arch-retrying.json"))
    assert (failure.retries_left, failure.pid, failure.node_ip) == (2, 3457, "10.170.162.10")  # the replica, not its config task
    cause = start_cause(text_lines(failure.error, "Serve's message"), context=2)
    assert cause is not None and cause.code == "MODEL_ARCH_UNSUPPORTED"
    assert cause.evidence.startswith("Value error, Model architectures ['OrchNoSuchForCausalLM'] are not supported for now.")
    assert cause.hint.endswith("runbooks/MODEL_ARCH_UNSUPPORTED.md")
