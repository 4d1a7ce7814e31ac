"""known_hosts handling for the SSH adapter: verify a node's host key, record a new one.

Does I/O: reads and appends to ONE known_hosts file (orch's own, ``<state_dir>/known_hosts`` by
default, or ``ssh.known_hosts`` of cluster.yaml), never the user's system files. Formats follow
OpenSSH: ``host`` for port 22, ``[host]:port`` otherwise, optionally hashed (``|1|salt|hash``);
fingerprints print as ``SHA256:<base64 without padding>`` like ``ssh-keygen -lf``.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import paramiko

from orchestrator.errors import HostKeyChangedError, HostKeyUnknownError

_APPEND_LOCK = threading.Lock()


def host_entry_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def load(path: Path) -> paramiko.HostKeys:
    """The keys recorded in ``path`` (an empty set when the file does not exist yet)."""
    keys = paramiko.HostKeys()
    if path.exists():
        keys.load(str(path))
    return keys


def recorded_key_types(path: Path, host: str, port: int) -> list[str]:
    entry = load(path).lookup(host_entry_name(host, port))
    return list(entry.keys()) if entry else []


def append(path: Path, host: str, port: int, key: paramiko.PKey, hashed: bool = False) -> None:
    """Record ``key`` for host:port at the end of ``path`` (created 0600 in a 0700 folder)."""
    name = host_entry_name(host, port)
    if hashed:
        name = paramiko.HostKeys.hash_host(name)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _APPEND_LOCK:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            # Another orch process may have recorded the same key meanwhile: don't duplicate.
            current = load(path).lookup(host_entry_name(host, port))
            if current is not None and current.get(key.get_name()) == key:
                return
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(f.tell() - 1)
                if f.read(1) != "\n":
                    f.write("\n")
            f.write(line)


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Decides on every server key (the SSHClient is given no keys of its own, so paramiko asks
    this policy each time): a recorded match passes, a different key is always refused, an
    unknown host is refused unless ``accept_new`` (then recorded)."""

    def __init__(self, node: str, host: str, port: int, known_hosts: Path, accept_new: bool, hashed: bool) -> None:
        self.node, self.host, self.port = node, host, port
        self.known_hosts, self.accept_new, self.hashed = known_hosts, accept_new, hashed
        self.accepted_new_key: str | None = None  # fingerprint recorded by this connection
        self.verified = False  # the host key passed: a later failure is in authentication

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = load(self.known_hosts).lookup(host_entry_name(self.host, self.port))
        where = f"{self.host}:{self.port}"
        if entry:
            recorded = entry.get(key.get_name())
            if recorded == key:
                self.verified = True
                return
            old = recorded if recorded is not None else next(iter(entry.values()))
            raise HostKeyChangedError(
                f"{self.node}: the host key of {where} has CHANGED: {self.known_hosts} records "
                f"{old.get_name()} {old.fingerprint}, the host now offers {key.get_name()} "
                f"{key.fingerprint}. Someone may be intercepting the connection "
                "(man-in-the-middle), or the host was reinstalled or its keys regenerated. "
                "orch refuses to connect.",
                hint=(
                    "check with the machine's owner which key is right; if the change is expected, "
                    f"remove the old key with `ssh-keygen -R '{host_entry_name(self.host, self.port)}' "
                    f"-f {self.known_hosts}` and re-run with --accept-new-host-keys"
                ),
                node=self.node,
            )
        if not self.accept_new:
            raise HostKeyUnknownError(
                f"{self.node}: {where} is not in {self.known_hosts} (it offers {key.get_name()} "
                f"{key.fingerprint}); orch does not trust hosts it has never seen",
                hint="verify the fingerprint with the machine's owner, then re-run with --accept-new-host-keys "
                "to record it",
                node=self.node,
            )
        append(self.known_hosts, self.host, self.port, key, hashed=self.hashed)
        self.accepted_new_key = key.fingerprint
        self.verified = True
