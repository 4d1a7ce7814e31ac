"""The open channels of an SSH connection (paramiko): a running command with its streams open
(``SshProcess``, from ``SshRunner.start``) and a local port tunnelled through the connection
(``Forward``, from ``SshRunner.forward``).

Does I/O: SSH channels, a local TCP listener per forward, one thread per stream or tunnelled
connection. Every paramiko/socket failure leaves as a typed ``RemoteError`` naming the node.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import paramiko

from orchestrator.errors import CommandTimeoutError, RemoteError, UnreachableError


def drain(recv, sink: list[bytes]) -> None:
    try:
        while True:
            data = recv(65536)
            if not data:
                return
            sink.append(data)
    except (OSError, EOFError, paramiko.SSHException):
        return


def wait_exit(chan: paramiko.Channel, deadline: float) -> bool:
    # After EOF on both streams the exit status follows at once; wait for it within the deadline.
    while not chan.exit_status_ready():
        if time.monotonic() >= deadline or chan.closed:
            return chan.exit_status_ready()
        time.sleep(0.005)
    return True


class SshProcess:
    """One running command over an SSH channel (``SshRunner.start``)."""

    def __init__(self, node: str, where: str, chan: paramiko.Channel) -> None:
        self.node, self.where, self._chan = node, where, chan
        self._out = chan.makefile("rb")
        self._err: list[bytes] = []
        self._err_reader = threading.Thread(target=drain, args=(chan.recv_stderr, self._err), daemon=True, name=f"ssh-err-{node}")
        self._err_reader.start()

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise UnreachableError(f"{self.node}: the command on {self.where} stopped reading: {exc}", node=self.node) from exc

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # already gone

    def readline(self) -> str:
        try:
            return self._out.readline().decode("utf-8", "replace")
        except (OSError, EOFError, paramiko.SSHException):
            return ""

    def wait(self, timeout: float) -> int:
        if not wait_exit(self._chan, time.monotonic() + timeout):
            raise CommandTimeoutError(f"{self.node}: the command on {self.where} did not end within {timeout:g}s", node=self.node)
        return self._chan.recv_exit_status()

    def stderr(self) -> str:
        return b"".join(self._err).decode("utf-8", "replace")

    def kill(self) -> None:
        self._chan.close()


class Forward:
    """One local listener whose connections are tunnelled through the runner's SSH transport."""

    def __init__(
        self, node: str, transport: Callable[[], paramiko.Transport], connect_timeout: float, remote_host: str, remote_port: int
    ) -> None:
        # transport(): the runner's live SSH transport (re-dialled when the connection dropped).
        self.node, self._live_transport, self.connect_timeout = node, transport, connect_timeout
        self.remote = (remote_host, remote_port)
        self.transport = transport()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.closed = threading.Event()
        self.pumps: list[tuple[socket.socket, paramiko.Channel]] = []
        threading.Thread(target=self._accept_loop, daemon=True, name=f"ssh-fwd-{node}-{self.port}").start()

    def _accept_loop(self) -> None:
        while not self.closed.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.2)
                if not ready:
                    continue
                conn, peer = self.sock.accept()
            except (OSError, ValueError):  # ValueError: select on a socket closed meanwhile
                return
            try:
                # The runner's live transport, not the one the forward started on: when the SSH
                # connection dropped since (sshd restarted, a network blip), this re-dials, so a
                # caller polling through the tunnel (a rollout watching Serve) gets through again.
                self.transport = self._live_transport()
                chan = self.transport.open_channel("direct-tcpip", self.remote, peer, timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError, RemoteError):
                conn.close()  # the client sees the connection close, as with ssh -L
                continue
            self.pumps.append((conn, chan))
            threading.Thread(target=self._pump, args=(conn, chan), daemon=True).start()

    def _pump(self, conn: socket.socket, chan: paramiko.Channel) -> None:
        try:
            while not self.closed.is_set():
                watched: list[Any] = [conn, chan]
                ready, _, _ = select.select(watched, [], [], 0.5)
                if conn in ready:
                    data = conn.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(65536)
                    if not data:
                        break
                    conn.sendall(data)
        except (OSError, ValueError, EOFError, paramiko.SSHException):
            pass  # either side closed (or the forward was closed): end this tunnelled connection
        finally:
            try:
                chan.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the SSH transport is already gone: nothing left to close on its side
            conn.close()

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for conn, chan in self.pumps:
            chan.close()
            conn.close()
