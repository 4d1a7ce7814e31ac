"""A cluster whose nodes nobody answers: manifests pointing at loopback ports that refuse every
connection (a socket bound to the port, never listening, so that no other process can take it).
SSH to them fails at once with "connection refused", the real error path of an unreachable node.
Nothing outside loopback is ever contacted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A loopback TCP port that refuses connections for the length of the module."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # bound, never listening: a connect gets RST (ECONNREFUSED)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


class NotSshServer:
    """A real TCP server on 127.0.0.1 that is not sshd: it reads what the client sends first
    (paramiko's 'SSH-2.0-paramiko_...' banner) and answers ``reply`` (empty: closes at once),
    as a web server does on a port mistaken for SSH's."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                if self.reply:
                    conn.settimeout(5)
                    try:
                        conn.recv(256)
                        conn.sendall(self.reply)
                    except OSError:
                        pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def http_port() -> Iterator[int]:
    """A loopback port where an HTTP server answers: 400 to anything that is not HTTP."""
    server = NotSshServer(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    try:
        yield server.port
    finally:
        server.close()


@pytest.fixture
def closing_port() -> Iterator[int]:
    """A loopback port that accepts a connection and closes it without a word."""
    server = NotSshServer(b"")
    try:
        yield server.port
    finally:
        server.close()


def unreachable_manifest(folder: Path, port: int, name: str = "gone", worker: str = "worker-with-a-long-name") -> Path:
    """A CPU cluster of two nodes on loopback addresses whose SSH port refuses connections."""
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\naccelerator: cpu\n"
        f"ssh:\n  user: orch-test\n  port: {port}\n  connect_timeout: 2\n"
        f"nodes:\n  - name: head\n    host: 127.0.0.1\n    role: head\n  - name: {worker}\n    host: 127.0.0.2\n"
    )
    return path


def orch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of an `orch` subprocess: a private state dir and HOME (no user keys, no
    ~/.orch), no colour settings inherited from the caller."""
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "TERM", "CI")}
    env.update(ORCH_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def orch_piped(tmp_path: Path, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`orch ARGS` as a script runs it: stdout and stderr are pipes."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          timeout=timeout, env=orch_env(tmp_path, **env), cwd=tmp_path)  # fmt: skip
