"""Loading a manifest: ``load_manifest`` (text) and ``load_manifest_file`` (the one function that
reads a file). Every problem reads ``FILE:LINE: FIELD.PATH: what was wrong``; all travel in one ``ManifestError``."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from orchestrator.errors import ManifestError
from orchestrator.manifest.model import Manifest
from orchestrator.manifest.rules import check_manifest_text
from orchestrator.manifest.sections import HINT, MAX_MANIFEST_BYTES, MISSING_HINT


def load_manifest(text: str, path: Path | str) -> Manifest:
    """Parse and validate manifest text; ``path`` names it in errors and anchors relative paths.

    Raises ``ManifestError`` whose ``problems`` lists every problem found, sorted by line.
    """

    path = Path(path)
    base_dir = path.expanduser().absolute().parent
    manifest = check_manifest_text(text, str(path), {"base_dir": base_dir})
    return manifest.model_copy(update={"source_path": path.expanduser().absolute()})


def load_manifest_file(path: Path | str) -> Manifest:
    """Read and load a manifest file; unreadable files raise ``ManifestError`` like bad content."""
    path = Path(path)
    label = str(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; the
        # type is checked on the open file (no window between a stat and the open).
        fd = _open_for_reading(path.expanduser())
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise _file_error(label, "is a directory, not a manifest file")
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a device or socket"
            raise _file_error(label, f"is {kind}, not a regular file: give the manifest as a file")
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise _file_error(label, "no such file", MISSING_HINT) from None
    except PermissionError:
        raise _file_error(label, "permission denied") from None
    except OSError as exc:
        raise _file_error(label, f"cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise _file_error(label, f"larger than {MAX_MANIFEST_BYTES // 1024} KiB: not a cluster manifest")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problem = f"{label}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); is it a binary file?"
        raise ManifestError(problem, hint=HINT, problems=[problem]) from None
    return load_manifest(text, path)


def _open_for_reading(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def _file_error(label: str, what: str, hint: str = HINT) -> ManifestError:
    problem = f"{label}: {what}"
    return ManifestError(problem, hint=hint, problems=[problem])

