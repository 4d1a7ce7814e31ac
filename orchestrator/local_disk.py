"""orch's own files on this machine: private folders, and what a full disk means.

Does I/O (stat, mkdir, chmod, statvfs). Used by ``state`` for the database, the token and the
facts: a full disk becomes a DiskFullError (exit 5) that names the file and the filesystem's
mount point, instead of SQLite's "cannot rollback - no transaction is active" or a raw OSError.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from orchestrator.errors import DiskFullError, StateError


def make_private_dir(path: Path) -> None:
    """Create ``path`` 0700 if it is missing. An existing folder (a --state-dir the user chose,
    say their home) keeps its mode: orch only tightens what it creates."""
    if path.is_dir():
        return
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)  # the umask may have narrowed the mode given to mkdir; make it exact


def is_disk_full(exc: BaseException, path: Path | None = None) -> bool:
    """Whether ``exc`` is a write refused for lack of space. SQLite reports a full disk as
    SQLITE_FULL, or (seen with WAL on a full tmpfs) as a plain "disk I/O error": an I/O error
    counts when the filesystem holding ``path`` has (almost) no space left."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code == sqlite3.SQLITE_FULL or "disk is full" in str(exc):
            return True
        return code == sqlite3.SQLITE_IOERR and path is not None and 0 <= free_bytes(path) < LOW_SPACE_BYTES
    return False


LOW_SPACE_BYTES = 64 * 1024  # below this, an I/O error on a write is taken for a full disk


def free_bytes(path: Path) -> int:
    try:
        st = os.statvfs(mount_point(path))
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem that holds ``path`` (or would hold it)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def disk_full(path: Path, exc: BaseException) -> DiskFullError:
    """The error for a write to ``path`` that its full filesystem refused."""
    where = mount_point(path)
    try:
        st = os.statvfs(where)
        free = f"{st.f_bavail * st.f_frsize // 1024} KiB free of {st.f_blocks * st.f_frsize // (1 << 20)} MiB"
    except OSError:
        free = "free space unknown"
    return DiskFullError(
        f"the disk holding {path} is full: no space left on the filesystem mounted at {where} ({free}); "
        f"nothing was written ({exc})",
        hint=f"free space on {where} (or point --state-dir / ORCH_STATE_DIR at another disk) and re-run",
    )


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that it is never readable by others, not even briefly.
    The folder is orch's own (``<state>/clusters/<name>``): made 0700. A full disk raises
    DiskFullError naming the file and its filesystem, and leaves no partial file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            data = (text + "\n").encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full(path, exc) from exc
        raise StateError(f"cannot write {path}: {exc.strerror or exc}", hint="check the state folder's permissions") from exc
