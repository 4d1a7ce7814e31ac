"""What a host's port said when it was expected to speak SSH: the first bytes paramiko received.

``TappedSocket`` wraps the TCP socket handed to paramiko's transport and keeps the first bytes
it receives (and whether the peer closed); ``not_ssh_reason`` turns them into words for the
error, so that a port that is not sshd's (an HTTP server, a database, a port that closes at once)
is reported as such and not as a handshake that "failed within 10s". No I/O of its own beyond
passing ``recv`` through.
"""

from __future__ import annotations

import socket
from typing import Any

KEEP_BYTES = 256  # enough for the first line of any server's greeting


class TappedSocket:
    """A socket that records the first ``KEEP_BYTES`` it receives; everything else passes through."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.received = b""
        self.eof = False

    def recv(self, n: int) -> bytes:
        data = self._sock.recv(n)
        if not data:
            self.eof = True
        elif len(self.received) < KEEP_BYTES:
            self.received += data[: KEEP_BYTES - len(self.received)]
        return data

    def __getattr__(self, name: str) -> Any:  # send, settimeout, close, getpeername, _closed ...
        return getattr(self._sock, name)


def not_ssh_reason(received: bytes, eof: bool) -> str | None:
    """Why the peer is not an SSH server, from what it sent before the handshake failed; None when
    it did send an SSH banner (``SSH-...``, RFC 4253 section 4.2): then the failure is SSH's own."""
    if any(line.startswith(b"SSH-") for line in received.splitlines()):
        return None
    if received:
        lines = [line for line in received.splitlines() if line.strip()]
        text = (lines[0] if lines else received).decode("utf-8", errors="replace").strip()
        shown = text[:80] + ("..." if len(text) > 80 else "")
        return f"it answered {shown!r} instead of an SSH banner"
    if eof:
        return "it accepted the connection and closed it without sending an SSH banner"
    return "it accepted the connection but sent no SSH banner"
