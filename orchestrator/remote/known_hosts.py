"""known_hosts handling for the SSH adapter: verify a node's host key, record a new one.

Does I/O: reads (line by line: ``parse``) and appends to ONE known_hosts file (orch's own, ``<state_dir>/known_hosts`` by
default, or ``ssh.known_hosts`` of cluster.yaml), never the user's system files. Formats follow
OpenSSH: ``host`` for port 22, ``[host]:port`` otherwise, optionally hashed (``|1|salt|hash``);
fingerprints print as ``SHA256:<base64 without padding>`` like ``ssh-keygen -lf``.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hmac
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.pkey import UnknownKeyType

from orchestrator.errors import HostKeyChangedError, HostKeyUnknownError, KnownHostsError

_APPEND_LOCK = threading.Lock()


def host_entry_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


@dataclass
class KnownHosts:
    """What a known_hosts file says: the trusted keys, and the keys marked ``@revoked`` (with the
    host patterns they apply to and their line)."""

    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: list[tuple[list[str], paramiko.PKey, int]] = field(default_factory=list)

    def revoked_line(self, host: str, port: int, key: paramiko.PKey) -> int | None:
        """The line that revokes ``key`` for host:port, if any."""
        name = host_entry_name(host, port)
        for patterns, revoked, line in self.revoked:
            if revoked == key and any(_pattern_matches(p, name) for p in patterns):
                return line
        return None


def parse(text: str, path: Path | str) -> KnownHosts:
    """Parse known_hosts text line by line, as OpenSSH reads it. ``@cert-authority`` lines are
    skipped (orch verifies plain host keys, not certificates), ``@revoked`` keys are collected,
    key types paramiko cannot use are skipped; anything else unreadable raises KnownHostsError
    naming ``path:line`` (one bad line used to break every command with "internal error")."""
    out = KnownHosts()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker == "@cert-authority":
                continue
            if marker != "@revoked":
                raise _bad(path, lineno, f"unknown marker {marker!r} (OpenSSH knows @cert-authority and @revoked)")
        fields = line.split()
        if len(fields) < 3:
            raise _bad(path, lineno, "expected 'HOSTS KEY-TYPE BASE64-KEY'")
        names, key_type, blob = fields[0].split(","), fields[1], fields[2]
        if key_type.isdigit():
            continue  # an SSH-1 RSA line (BITS EXPONENT MODULUS): no SSH-2 client uses it
        try:
            key = paramiko.PKey.from_type_string(key_type, base64.b64decode(blob, validate=True))
        except UnknownKeyType:
            continue  # a key type paramiko cannot verify (e.g. a security-key type): not usable here
        except (binascii.Error, ValueError, paramiko.SSHException) as exc:
            raise _bad(path, lineno, f"the {key_type} key does not decode ({exc})") from exc
        if marker == "@revoked":
            out.revoked.append((names, key, lineno))
        else:
            for name in names:
                out.keys.add(name, key.get_name(), key)
    return out


def _bad(path: Path | str, line: int, what: str) -> KnownHostsError:
    return KnownHostsError(
        f"{path}:{line}: cannot read this known_hosts line: {what}",
        hint=f"fix or delete line {line} of {path} (orch trusts only the keys recorded there)",
    )


def _pattern_matches(pattern: str, name: str) -> bool:
    """OpenSSH host pattern (``*``, ``?``, hashed ``|1|...``; a ``!`` negation never matches)."""
    if pattern.startswith("!"):
        return False
    if pattern.startswith("|1|"):
        return hmac.compare_digest(paramiko.HostKeys.hash_host(name, pattern), pattern)
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name) is not None


def read(path: Path) -> KnownHosts:
    """The known_hosts file at ``path`` (empty when it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return KnownHosts()
    return parse(text, path)


def load(path: Path) -> paramiko.HostKeys:
    """The keys recorded in ``path`` (an empty set when the file does not exist yet)."""
    return read(path).keys


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
        known = read(self.known_hosts)
        where = f"{self.host}:{self.port}"
        revoked = known.revoked_line(self.host, self.port, key)
        if revoked is not None:
            raise HostKeyChangedError(
                f"{self.node}: {where} offers {key.get_name()} {key.fingerprint}, a key marked @revoked at "
                f"{self.known_hosts}:{revoked}; orch refuses to connect",
                hint="the key was revoked on purpose: ask the machine's owner for its new host key",
                node=self.node,
            )
        entry = known.keys.lookup(host_entry_name(self.host, self.port))
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
