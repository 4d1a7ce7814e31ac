"""`orch logs` on the session's served tiny model (issue 25 item 10): the replica's log holds
vLLM's own start-up lines, a raylet's tail is the file's, the CPU layout has no engine worker to
show, and --follow prints what is written next until Ctrl-C (exit 0). Reuses ``served_tiny``: no
engine start of its own."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from orchestrator.cli import main
from tests.signals import sigint_default
from tests.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm]


def test_the_replicas_log_and_a_raylets_tail(served_tiny, capsys):
    s = served_tiny
    capsys.readouterr()
    assert main(s.cluster.cli("logs", s.manifest_path, "--tail", "100000")) == 0
    out = capsys.readouterr().out
    headers = [ln for ln in out.splitlines() if ln.startswith("==> replica ")]
    assert headers and all("/logs/worker-" in h for h in headers), headers
    # vLLM's own start-up lines are in the replica's log (the engine writes to its stdout)
    assert "KV cache size" in out and "Maximum concurrency" in out
    # orch's callback (serve/node_hooks.py) loaded from the folder `orch up` wrote, and Serve LLM's
    # per-node model task did not start (its own line, node_initialization_utils.py)
    assert "orch: Serve LLM's per-node model task skipped (the model is " in out
    assert "Running tasks to download model files on worker nodes" not in out

    # the CPU layout runs the engine in one process: no engine worker to show, and it says why
    assert main(s.cluster.cli("logs", s.manifest_path, "--rank", "0")) == 2
    assert "has no engine workers" in capsys.readouterr().err

    assert main(s.cluster.cli("logs", s.manifest_path, "--raylet", "--node", "host1", "--tail", "5")) == 0
    lines = capsys.readouterr().out.splitlines()
    (header,) = [ln for ln in lines if ln.startswith("==> raylet on host1: host1:") and ln.endswith("/logs/raylet.out <==")]
    path = header.removeprefix("==> raylet on host1: host1:").removesuffix(" <==")
    shown = lines[lines.index(header) + 1 : lines.index(header) + 6]
    assert len(shown) == 5
    # the 5 lines shown are 5 consecutive lines of the file on the host (the raylet may have written
    # more since; its periodic state dumps repeat lines, so the whole window is looked for)
    on_host = s.cluster.bed.ns_exec("host1", ["cat", path]).stdout.splitlines()
    assert any(on_host[i : i + 5] == shown for i in range(len(on_host))), shown


def test_follow_prints_new_lines_until_ctrl_c(served_tiny):
    s = served_tiny
    argv = [sys.executable, "-m", "orchestrator", *s.cluster.cli("logs", s.manifest_path, "--raylet", "--node", "host1",
                                                                  "--tail", "0", "--follow")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=sigint_default)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.rstrip("\n")) for ln in proc.stdout], daemon=True).start()
    seen: list[str] = []

    def saw(predicate) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return any(predicate(ln) for ln in seen)

    try:
        wait_until(lambda: saw(lambda ln: ln.endswith("/logs/raylet.out <==")), what="the raylet header", timeout=120)
        path = next(ln for ln in seen if ln.endswith("/logs/raylet.out <==")).split("host1:", 2)[-1].removesuffix(" <==")
        mark = f"orch-logs-follow-{os.getpid()}"

        def write_mark() -> bool:  # tail -F may start a moment after the header: write until it is seen
            s.cluster.bed.ns_exec("host1", ["sh", "-c", f"echo {mark} >> {path}"])
            return saw(lambda ln: ln == mark)

        wait_until(write_mark, what="the line written to the raylet log", timeout=120, interval=1.0)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
