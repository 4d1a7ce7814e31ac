"""LocalRunner: the runner of `transport: local` nodes, on real subprocesses."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from orchestrator.errors import CommandFailedError, CommandTimeoutError
from orchestrator.remote.local import LocalRunner
from orchestrator.remote.runner import Runner
from tests.wait import wait_until


def test_stdout_stderr_exit_code_and_merged_env():
    r = LocalRunner("here", base_env={"PATH": os.environ["PATH"], "KEEP": "base"})
    res = r.run([sys.executable, "-c", "import os,sys; print(os.environ['KEEP'], os.environ['EXTRA']); "
                 "sys.stderr.write('warn'); sys.exit(4)"], env={"EXTRA": "a b"})
    assert (res.exit_code, res.stdout, res.stderr) == (4, "base a b\n", "warn")
    assert res.argv[0] == sys.executable and not res.ok
    assert isinstance(r, Runner)


def test_orchs_own_secrets_do_not_reach_local_commands(monkeypatch):
    """A local `ray start` (and every Ray worker under it) gets an explicit environment, not
    orch's: ORCH_API_KEY, AWS_* and the like stay in orch (issue 12)."""
    monkeypatch.setenv("ORCH_API_KEY", "sk-orch-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    res = LocalRunner("here").run(["env"], env={"HF_TOKEN": "given on purpose"})
    seen = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert "ORCH_API_KEY" not in seen and "AWS_SECRET_ACCESS_KEY" not in seen
    assert seen["HF_TOKEN"] == "given on purpose"
    assert seen["PATH"] == os.environ["PATH"] and seen["LC_ALL"] == "C.UTF-8"


def test_argv_is_not_interpreted_by_a_shell():
    res = LocalRunner("here").run(["echo", "$HOME", ";", "`id`"])
    assert res.stdout == "$HOME ; `id`\n"


def test_missing_command_is_exit_127_like_a_remote_shell():
    res = LocalRunner("here").run(["orch-no-such-command-xyz"])
    assert res.exit_code == 127 and "command not found" in res.stderr


def test_timeout_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pidfile}; wait"
    with pytest.raises(CommandTimeoutError) as info:
        LocalRunner("here").run(["sh", "-c", script], timeout=0.5)
    assert info.value.node == "here" and "here" in str(info.value) and "0.5s" in str(info.value)
    child = int(pidfile.read_text())

    def gone() -> bool:  # the grandchild (sleep) went with its group (a zombie counts as gone)
        try:
            return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    wait_until(gone, what=f"the command's child process (pid {child}) to die with its group", timeout=30)


def test_put_file_sets_mode_and_replaces_atomically(tmp_path):
    target = tmp_path / "deep" / "ray-token"
    r = LocalRunner("here")
    r.put_file(str(target), b"one", 0o600)
    r.put_file(str(target), b"two", 0o600)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["ray-token"]  # no temp files left


def test_put_file_failure_is_typed(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CommandFailedError) as info:
        LocalRunner("here").put_file(str(blocker / "below"), b"x")
    assert info.value.node == "here"


def test_forward_is_the_port_itself():
    with LocalRunner("here") as r:
        assert r.forward("127.0.0.1", 8265) == 8265
