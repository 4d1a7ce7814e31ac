"""`orch logs` (issue 25 item 10) and `orch dashboard` (item 11) at the CLI, on one local node
(`transport: local`) whose Ray session folder holds a raylet log: the real scan script of the
doctor finds and reads it, and --follow runs the real ``tail -F``. The replica and engine-worker
logs of a served model are tests/integration/test_logs.py; the dashboard's tunnel to a real Ray
head is tests/integration/test_dashboard_cli.py."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.signals import sigint_default
from tests.wait import wait_until


@pytest.fixture
def local_cluster():
    d = Path(tempfile.mkdtemp(prefix="ologs-", dir="/tmp"))
    logs = d / "ray" / "session_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "raylet.out").write_text("".join(f"[raylet] line {i}\n" for i in range(1, 501)))
    (logs / "raylet.err").write_text("")
    (logs / "gcs_server.out").write_text("not a raylet line\n")
    (d / "ray" / "session_latest").symlink_to("session_1")
    yaml = d / "cluster.yaml"
    yaml.write_text(f"name: logtest\naccelerator: cpu\npython: {sys.executable}\n"
                    f"nodes:\n  - {{name: local, host: 127.0.0.1, role: head, transport: local}}\nray:\n  temp_dir: {d / 'ray'}\n")  # fmt: skip
    yield yaml, d / "ray" / "session_1"
    shutil.rmtree(d, ignore_errors=True)


def test_raylet_tail(local_cluster, capsys):
    yaml, session = local_cluster
    assert main(["logs", str(yaml), "--raylet", "--tail", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"==> raylet on local: local:{session}/logs/raylet.err <==",
        f"==> raylet on local: local:{session}/logs/raylet.out <==",
        "[raylet] line 498", "[raylet] line 499", "[raylet] line 500",
    ]  # fmt: skip


def test_raylet_of_one_node_and_the_default_tail(local_cluster, capsys):
    yaml, _ = local_cluster
    assert main(["logs", str(yaml), "--raylet", "--node", "local"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("==>")]
    assert lines == [f"[raylet] line {i}" for i in range(401, 501)]


@pytest.mark.parametrize("argv, code, message", [
    (["--raylet", "--rank", "0"], 2, "error: --raylet shows Ray's own log: it takes no --replica or --rank"),
    (["--raylet", "--node", "nope"], 2, "error: --node nope: not a node of cluster logtest"),
    (["--raylet", "--json", "--follow"], 2, "error: --json prints the lines read once: it takes no --follow"),
])  # fmt: skip
def test_usage_errors(local_cluster, capsys, argv, code, message):
    yaml, _ = local_cluster
    assert main(["logs", str(yaml), *argv]) == code
    assert capsys.readouterr().err.startswith(message)


def test_without_a_cluster_up(capsys):
    assert main(["logs"]) == 5
    assert "error: no cluster is up in" in capsys.readouterr().err


def test_json(local_cluster, capsys):
    yaml, session = local_cluster
    assert main(["logs", str(yaml), "--raylet", "--tail", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "cluster": "logtest",
        "logs": [
            {"source": "raylet on local", "node": "local", "path": f"{session}/logs/raylet.err", "lines": []},
            {"source": "raylet on local", "node": "local", "path": f"{session}/logs/raylet.out", "lines": ["[raylet] line 499", "[raylet] line 500"]},
        ],
        "errors": [],
    }  # fmt: skip


def test_no_ray_session_is_said(local_cluster, capsys):
    yaml, session = local_cluster
    shutil.rmtree(session.parent)
    assert main(["logs", str(yaml), "--raylet", "--json"]) == 0
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["source"] == "raylet on local" and error["node"] == "local"
    assert error["error"].startswith("local: no Ray session logs under") and error["error"].endswith(f" {session.parent}")


def tgkill(pid: int, tid: int, sig: int) -> None:
    """Send ``sig`` to one thread of another process (Linux tgkill(2))."""
    import ctypes
    import platform

    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


# "process": Ctrl-C as a terminal sends it. "thread": the kernel may hand a process-wide SIGINT to
# any of its threads; here it lands on one that is not the main thread (a line reader blocked in
# its read), which is how a fresh-clone CI run once saw `orch logs --follow` ignore Ctrl-C.
@pytest.mark.parametrize("ctrl_c", ["process", "thread"])
def test_follow_prints_what_is_written_next_until_ctrl_c(local_cluster, tmp_path, ctrl_c):
    yaml, session = local_cluster
    argv = [sys.executable, "-m", "orchestrator", "--state-dir", str(tmp_path / "state"), "logs", str(yaml), "--raylet", "--tail", "1", "--follow"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=sigint_default)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.rstrip("\n")) for ln in proc.stdout], daemon=True).start()
    seen: list[str] = []

    def saw(line: str) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return line in seen

    try:
        wait_until(lambda: saw("[raylet] line 500"), what="the last line of raylet.out", timeout=60)

        def write_mark() -> bool:  # tail -F starts a moment after the tail is printed: write until seen
            with open(session / "logs" / "raylet.out", "a") as f:
                f.write("[raylet] written next\n")
            return saw("[raylet] written next")

        wait_until(write_mark, what="the line written to raylet.out", timeout=60, interval=0.5)
        assert seen[:3] == [f"==> raylet on local: local:{session}/logs/raylet.err <==",
                            f"==> raylet on local: local:{session}/logs/raylet.out <==", "[raylet] line 500"]  # fmt: skip
        # then only what was written since (tail -F's own headers name each file, a blank line between)
        assert {ln for ln in seen[3:] if ln and not ln.startswith("==> ")} == {"[raylet] written next"}, seen[3:]
        if ctrl_c == "process":
            proc.send_signal(signal.SIGINT)
        else:
            threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
            tgkill(proc.pid, threads[0], signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_dashboard_of_a_cluster_that_is_not_up(local_cluster, capsys):
    yaml, _ = local_cluster
    assert main(["dashboard", str(yaml)]) == 5
    err = capsys.readouterr().err
    assert err.startswith("error: cluster 'logtest' is not up") and f"hint: run `orch up {yaml}` first" in err
    assert main(["dashboard"]) == 5
    assert "error: no cluster is up in" in capsys.readouterr().err
