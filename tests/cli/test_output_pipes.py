"""Issue 25 item 1: orch's output in pipes and CI logs, and on a terminal.

The real commands run as a script runs them (a subprocess whose stdout and stderr are pipes):
nothing is wrapped or cut, every finding code and every hint is whole on its line, no escape
code is written. On a terminal (a pseudo-terminal of 40 columns) tables fit the window but a
finding code is never cut, and `error`/`ok` are coloured unless NO_COLOR is set.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from tests.cli.unreachable import REPO, closed_port, orch_env, orch_piped, unreachable_manifest

__all__ = ["closed_port"]  # the fixture, imported for pytest

WORKER = "worker-with-a-long-name"


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _plain(text: str) -> str:
    """Terminal output without its escape sequences (bold, the spinner's cursor moves)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_up_findings_are_whole_in_a_pipe(tmp_path, closed_port):
    manifest = unreachable_manifest(tmp_path, closed_port)
    as_json = orch_piped(tmp_path, "up", str(manifest), "--check-only", "--json")
    findings = json.loads(as_json.stdout)["findings"]
    assert {f["code"] for f in findings} == {"NODE_UNREACHABLE"}
    text = orch_piped(tmp_path, "up", str(manifest), "--dry-run")
    out = text.stdout + text.stderr
    assert "\x1b[" not in out  # no escape code in a pipe
    lines = _lines(text.stdout)
    for f in findings:
        # each finding: one line with its code, node and whole message, then its whole hint
        at = lines.index(f"{f['severity']} {f['code']} on {f['node']}: {f['message']}")
        assert lines[at + 1] == f"  hint: {f['hint']}"
    assert not any(line != line.rstrip() for line in _lines(text.stdout))  # no padded titles


def test_doctor_codes_and_hints_are_whole_in_a_pipe(tmp_path, closed_port):
    manifest = unreachable_manifest(tmp_path, closed_port)
    report = json.loads(orch_piped(tmp_path, "doctor", str(manifest), "--json").stdout)
    text = orch_piped(tmp_path, "doctor", str(manifest)).stdout
    assert report["findings"]
    for f in report["findings"]:
        assert any(f["code"] in line and f["node"] in line for line in _lines(text)), text
        assert f"  hint: {f['hint']}" in _lines(text)
        assert f"runbooks/{f['code']}.md" in text


def test_long_lines_stay_whole_in_a_pipe(tmp_path, closed_port):
    name = "w" * 60
    manifest = unreachable_manifest(tmp_path, closed_port, worker=name)
    res = orch_piped(tmp_path, "doctor", str(manifest))
    (line,) = [line for line in _lines(res.stdout) if line.startswith(f"{name}: not reachable: ")]
    assert len(line) > 120 and line.endswith("connection refused"), line
    res = orch_piped(tmp_path, "up", str(manifest))
    (error,) = [line for line in _lines(res.stderr) if line.startswith("error: ")]
    assert f"NODE_UNREACHABLE@{name}" in error


def _on_a_terminal(tmp_path, args: list[str], columns: int = 40, **env: str) -> tuple[int, str]:
    """Run `orch ARGS` with stdout and stderr on a pseudo-terminal of ``columns`` columns."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL,
                            env=orch_env(tmp_path, TERM="xterm-256color", **env), cwd=tmp_path)  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def test_on_a_narrow_terminal_a_finding_code_is_never_cut(tmp_path, closed_port):
    manifest = unreachable_manifest(tmp_path, closed_port)
    _, text = _on_a_terminal(tmp_path, ["doctor", str(manifest)], columns=40, NO_COLOR="1")
    text = _plain(text)
    rows = [line for line in _lines(text) if line.startswith("│") and line.count("│") > 3]
    assert len(rows) == 2 and all("│ NODE_LOGS_UNAVAILABLE │" in row for row in rows), text
    _, text = _on_a_terminal(tmp_path, ["up", str(manifest), "--dry-run"], columns=40, NO_COLOR="1")
    text = _plain(text)
    assert text.count("fail NODE_UNREACHABLE on") == 2 and text.count("runbooks/NODE_UNREACHABLE.md") == 2, text


def test_colour_on_a_terminal_only_and_never_with_no_color(tmp_path):
    template = str(REPO / "cluster-templates" / "local.yaml")
    green_ok = "\x1b[32m\x1b[1mok\x1b[0m"
    rc, text = _on_a_terminal(tmp_path, ["validate", template], columns=120)
    assert rc == 0 and green_ok in text, repr(text)
    rc, text = _on_a_terminal(tmp_path, ["validate", template], columns=120, NO_COLOR="1")
    assert rc == 0 and "\x1b[3" not in text and _plain(text).startswith("ok  ")  # no colour (bold is not one)
    rc, text = _on_a_terminal(tmp_path, ["validate", str(tmp_path / "missing.yaml")], columns=120)
    assert rc == 2 and "\x1b[31m\x1b[1merror:\x1b[0m" in text
    piped = orch_piped(tmp_path, "validate", template)
    assert piped.stdout.startswith("ok  ") and "\x1b[" not in piped.stdout
