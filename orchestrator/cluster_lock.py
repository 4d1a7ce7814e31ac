"""One advisory lock per cluster: `orch up`, `down`, `rollout` and `rollback` of a cluster never
interleave. Does I/O: ``<state_dir>/clusters/<name>/lock``.

``fcntl.flock`` on the lock file, taken without waiting: a second command on the same cluster is
refused at once with the holder's pid, command and start time (written into the file by the
holder). The kernel drops the lock when the holder exits, however it ends (Ctrl-C, SIGKILL,
a crash), so a stale lock never needs cleaning; the text left in the file is then only a record
of the last holder. Advisory: it orders orch commands, it does not stop anyone else.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import StateError

LOCK_NAME = "lock"


class ClusterBusy(StateError):
    """Another orch command holds the cluster's lock."""

    exit_code = 1


@dataclass(frozen=True)
class Holder:
    pid: int | None
    command: str
    since: float | None
    host: str | None = None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since)) if self.since is not None else "an unknown time"
        return f"`orch {self.command}` (pid {self.pid if self.pid is not None else '?'}" + (f" on {self.host}" if self.host else "") + f", since {when})"


def _read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data:
        return None
    pid = data.get("pid")
    since = data.get("since")
    return Holder(pid if isinstance(pid, int) else None, str(data.get("command") or "?"),
                  float(since) if isinstance(since, (int, float)) else None, data.get("host"))


@contextmanager
def hold(cluster_dir: Path, cluster: str, command: str, clock: Callable[[], float] = time.time) -> Iterator[Holder]:
    """Hold ``cluster``'s lock for the ``with`` block; ClusterBusy when another command holds it."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    path = cluster_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(path)
            who = holder.describe() if holder else "another orch command"
            raise ClusterBusy(
                f"cluster {cluster!r} is busy: {who} holds its lock ({path})",
                hint="wait for that command to finish (the lock is released when it exits, even if it is killed)",
            ) from None
        me = Holder(os.getpid(), command, clock(), socket.gethostname())
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": me.pid, "command": me.command, "since": me.since, "host": me.host}).encode(), 0)
        yield me
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def holder(cluster_dir: Path) -> Holder | None:
    """Who holds the lock now (None: nobody), without taking it for longer than a probe."""
    path = cluster_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or Holder(None, "?", None)
        return None
    finally:
        os.close(fd)
