"""The argv that reads a node's Ray session logs, and the pure parser of what it prints.

No I/O here. ``scan_argv`` builds ``python -c SCRIPT CONFIG_JSON``: the script runs on the node
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

# Runs on the node. Plain stdlib, Python >= 3.8. Configuration comes as one JSON argument.
SCAN_SCRIPT = r"""
import fnmatch, json, os, sys, time
cfg = json.loads(sys.argv[1])
out = {"session_dir": None, "temp_dir": None, "files": [], "skipped_files": 0, "now": time.time()}
logs = None
for t in cfg["temp_dirs"]:
    cand = os.path.join(t, "session_latest", "logs")
    if os.path.isdir(cand):
        logs = cand
        out["temp_dir"] = t
        out["session_dir"] = os.path.realpath(os.path.join(t, "session_latest"))
        break
if logs is None:
    print(json.dumps(out))
    sys.exit(0)
groups = cfg["groups"]
picked = {}
for root, dirs, files in os.walk(logs):
    dirs.sort()
    for name in files:
        full = os.path.join(root, name)
        rel = os.path.relpath(full, logs)
        rank = None
        for i, pats in enumerate(groups):
            if any(fnmatch.fnmatch(rel, p) for p in pats):
                rank = i
                break
        if rank is None:
            continue
        try:
            st = os.stat(full)
        except OSError:
            continue
        if cfg.get("since_s") is not None and st.st_mtime < out["now"] - cfg["since_s"]:
            continue
        picked[rel] = (rank, -st.st_mtime, full, st.st_size, st.st_mtime)
order = sorted(picked.items(), key=lambda kv: (kv[1][0], kv[1][1], kv[0]))
out["skipped_files"] = max(0, len(order) - cfg["max_files"])
keys = [k.encode() for k in cfg["keywords"]]
for rel, (rank, _, full, size, mtime) in order[: cfg["max_files"]]:
    entry = {"path": rel, "group": rank, "size": size, "mtime": mtime, "first_line": None, "lines": 0, "matches": [],
             "error": None}
    try:
        with open(full, "rb") as f:
            start = max(0, size - cfg["max_bytes"])
            skipped_nl = 0
            if start:
                if start <= cfg["count_prefix_bytes"]:
                    left = start
                    while left > 0:
                        chunk = f.read(min(left, 1 << 20))
                        if not chunk:
                            break
                        skipped_nl += chunk.count(b"\n")
                        left -= len(chunk)
                else:
                    skipped_nl = None
                f.seek(start)
            data = f.read(cfg["max_bytes"])
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        first = 1
        if start:
            lines = lines[1:]  # the first line of a tail is a fragment
            first = None if skipped_nl is None else skipped_nl + 2
        if len(lines) > cfg["tail_lines"]:
            drop = len(lines) - cfg["tail_lines"]
            lines = lines[drop:]
            first = None if first is None else first + drop
        entry["first_line"] = first
        entry["lines"] = len(lines)
        for i, raw in enumerate(lines):
            if any(k in raw for k in keys):
                text = raw.decode("utf-8", "replace")[: cfg["max_line_chars"]]
                entry["matches"].append([None if first is None else first + i, text])
                if len(entry["matches"]) >= cfg["max_matches_per_file"]:
                    break
    except OSError as exc:
        entry["error"] = "%s: %s" % (type(exc).__name__, exc)
    out["files"].append(entry)
print(json.dumps(out))
"""

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
    return [python, "-c", SCAN_SCRIPT, json.dumps(cfg, separators=(",", ":"))]


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
