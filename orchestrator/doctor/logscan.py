"""The argv that reads a node's Ray session logs, and the pure parser of what it prints.

No I/O here. ``scan_argv`` builds ``python -c SCRIPT CONFIG_JSON``: the script
(``orchestrator/remote/node_programs/log_scan.py``) runs on the node
(with the interpreter that runs Ray there), finds ``<temp_dir>/session_latest/logs`` among the
given temp dirs, picks the log files that matter (raylet, GCS, Serve, worker and core-worker
logs, every ``*.err``), reads a bounded tail of each (bytes and lines), and prints one JSON
object. To keep the transfer small it sends back only lines holding one of the given keywords
(the signatures' cheap prefilter), with their line numbers; the regular expressions run here,
in ``orchestrator.doctor.signatures``. ``parse_scan`` turns the JSON into ``NodeScan``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.doctor.matching import LogLine
from orchestrator.remote.node_programs import python_argv

# Which files to read, most telling first; within a group, most recently written first.
DEFAULT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err"),
    ("serve/*.log",),
    ("*.err", "*/*.err"),
    ("worker-*.out",),
    ("python-core-worker-*.log", "python-core-driver-*.log", "monitor.log", "monitor.out"),
)


@dataclass(frozen=True)
class ScanLimits:
    """Bounds of what is read on each node."""

    max_files: int = 80
    tail_lines: int = 20000
    max_bytes: int = 4 * 1024 * 1024
    count_prefix_bytes: int = 256 * 1024 * 1024
    max_line_chars: int = 2000
    max_matches_per_file: int = 500


@dataclass(frozen=True)
class ScannedFile:
    path: str
    size: int
    lines: int
    first_line: int | None
    matches: int
    error: str | None = None
    group: int | None = None  # index of the first of the scan's ``groups`` whose patterns it matched


@dataclass(frozen=True)
class NodeScan:
    """What the scan found on one node: the session read, the files and the candidate lines."""

    node: str
    session_dir: str | None
    temp_dir: str | None
    files: tuple[ScannedFile, ...] = ()
    lines: tuple[LogLine, ...] = ()
    skipped_files: int = 0

    @property
    def lines_scanned(self) -> int:
        return sum(f.lines for f in self.files)


class ScanParseError(ValueError):
    """The scan script printed something that is not its JSON."""


def scan_argv(
    python: str,
    temp_dirs: list[str],
    keywords: list[str],
    limits: ScanLimits = ScanLimits(),
    since_s: float | None = None,
    groups: tuple[tuple[str, ...], ...] = DEFAULT_GROUPS,
) -> list[str]:
    cfg = {
        "temp_dirs": temp_dirs,
        "keywords": sorted(set(keywords)),
        "groups": [list(g) for g in groups],
        "since_s": since_s,
        "max_files": limits.max_files,
        "tail_lines": limits.tail_lines,
        "max_bytes": limits.max_bytes,
        "count_prefix_bytes": limits.count_prefix_bytes,
        "max_line_chars": limits.max_line_chars,
        "max_matches_per_file": limits.max_matches_per_file,
    }
    return python_argv(python, "log_scan", json.dumps(cfg, separators=(",", ":")))


def parse_scan(node: str, stdout: str) -> NodeScan:
    """Parse the script's JSON (the last line that parses, so a stray warning does no harm)."""
    data = None
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if not isinstance(data, dict) or "files" not in data:
        raise ScanParseError(f"{node}: log scan printed no JSON result: {stdout.strip()[-200:]!r}")
    files: list[ScannedFile] = []
    lines: list[LogLine] = []
    for entry in data["files"]:
        path = f"logs/{entry['path']}"
        files.append(
            ScannedFile(
                path=path,
                size=int(entry.get("size") or 0),
                lines=int(entry.get("lines") or 0),
                first_line=entry.get("first_line"),
                matches=len(entry.get("matches") or []),
                error=entry.get("error"),
                group=entry.get("group"),
            )
        )
        for line_no, text in entry.get("matches") or []:
            lines.append(LogLine(node=node, file=path, line_no=line_no, text=text))
    return NodeScan(
        node=node,
        session_dir=data.get("session_dir"),
        temp_dir=data.get("temp_dir"),
        files=tuple(files),
        lines=tuple(lines),
        skipped_files=int(data.get("skipped_files") or 0),
    )
