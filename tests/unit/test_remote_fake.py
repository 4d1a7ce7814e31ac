"""FakeRunner: scripted results for workflow tests."""

from __future__ import annotations

import pytest

from orchestrator.errors import UnreachableError
from orchestrator.remote.fake import FakeRunner, Prefix, UnscriptedCommand, result
from orchestrator.remote.runner import CommandResult, Runner, fan_out


def test_exact_prefix_and_predicate_rules_in_order():
    r = FakeRunner(
        "head",
        [
            (("ray", "--version"), result("ray, version 2.60.0\n")),
            (Prefix("ray", "start"), result(exit_code=1, stderr="port taken")),
            (lambda argv: argv[0] == "nvidia-smi", "0, NVIDIA H100 80GB HBM3\n"),
        ],
    )
    assert r.run(["ray", "--version"]).stdout == "ray, version 2.60.0\n"
    started = r.run(["ray", "start", "--head"], timeout=5, env={"RAY_AUTH_MODE": "token"})
    assert (started.exit_code, started.stderr, started.argv) == (1, "port taken", ("ray", "start", "--head"))
    assert r.run(["nvidia-smi", "-L"]).stdout.startswith("0, NVIDIA")
    assert r.calls[1].env == {"RAY_AUTH_MODE": "token"} and r.calls[1].timeout == 5
    assert [c.argv[0] for c in r.ran("ray")] == ["ray", "ray"]
    assert isinstance(r, Runner)


def test_unscripted_command_fails_the_test_unless_a_default_is_given():
    with pytest.raises(UnscriptedCommand, match="rm"):
        FakeRunner("w1").run(["rm", "-rf", "/tmp/x"])
    assert FakeRunner("w1", default=result("ok")).run(["anything"]).stdout == "ok"


def test_times_scripts_a_sequence_and_errors_get_the_node_name():
    r = FakeRunner("w2").on(Prefix("ray", "status"), UnreachableError("gone"), times=1)
    r.on(Prefix("ray", "status"), result("1 node"))
    outcomes = fan_out([r], lambda x: x.run(["ray", "status"]))
    assert outcomes[0].error is not None and outcomes[0].error.node == "w2"
    assert r.run(["ray", "status"]).stdout == "1 node"


def test_callable_response_sees_argv_and_env():
    def echo(argv, env):
        return CommandResult(argv, 0, f"{argv[-1]}:{env['X']}", "", 0.0)

    r = FakeRunner("n", {Prefix("echo"): echo})
    assert r.run(["echo", "hi"], env={"X": "1"}).stdout == "hi:1"


def test_files_forwards_and_close_are_recorded():
    r = FakeRunner("head", forward_port=40001)
    r.put_file("/tmp/ray/token", b"t", 0o600)
    assert r.files["/tmp/ray/token"].content == b"t" and r.files["/tmp/ray/token"].mode == 0o600
    assert r.forward("127.0.0.1", 8265) == 40001 and r.forwards == [("127.0.0.1", 8265)]
    r.close()
    assert r.closed
