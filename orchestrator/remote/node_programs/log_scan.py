"""Reads a node's Ray session logs for `orch doctor` and `orch logs` (``doctor/logscan.py`` builds the
configuration, argv[1] as JSON, and parses what this prints). Finds ``<temp_dir>/session_latest/logs``
among the given temp dirs, picks the log files that matter, reads a bounded tail of each and prints
one JSON object with the lines that hold one of the given keywords. Python >= 3.8.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import fnmatch
import json
import os
import sys
import time
from typing import Any


def main() -> None:
    cfg = json.loads(sys.argv[1])
    out: dict[str, Any] = {"session_dir": None, "temp_dir": None, "files": [], "skipped_files": 0, "now": time.time()}
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
        entry: dict[str, Any] = {"path": rel, "group": rank, "size": size, "mtime": mtime, "first_line": None, "lines": 0, "matches": [],
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


if __name__ == "__main__":
    main()
