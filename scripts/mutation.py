"""Mutation testing of orch's pure core with mutmut 3 (`make mutation`; docs/testing.md).

For each module of the scope (pyproject.toml, ``[tool.mutmut] only_mutate``), one after another:
``mutmut run "<module>.*"`` with at most ``--children`` workers, then one JSON line with the counts
(killed, survived, timeout, no_tests, equivalent, accepted) and the score: caught mutants over the
non-equivalent ones. Survivors are explained in scripts/mutation_survivors.md's table (one row per
mutant or per brace group, ``x_f__mutmut_{1,4}``), marked ``equivalent`` (no test can tell it apart) or
``accepted`` (counts against the score). Then the issue's four planted mutants (bugs mutmut cannot
generate, e.g. in a class body) are applied to a copy of the tree, and the unit test named for each
must fail. The last line is the overall JSON; exit 1 when a module is under the target, a survivor
is unexplained or a planted mutant lives.

Not a test (a script: it may time itself). Run it niced; it takes tens of minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.85
CAUGHT = {"killed", "timeout", "segfault", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}

# The planted bugs (issue 17): (name, file, original text, mutated text, the unit test that must fail).
PLANTED = [
    ("quantized weights give a 1-byte KV cache", "orchestrator/plan/memory.py",
     'return 4 if model_dtype == "fp32" else 2',
     'return 1 if model_dtype in ("fp8", "int8", "int4") else (4 if model_dtype == "fp32" else 2)',
     "tests/unit/test_memory.py::test_quantized_weights_keep_a_16_bit_kv_cache"),
    ("parse_topo: NVLink with any instead of all", "orchestrator/nodes/smi.py",
     "nvlink = all(", "nvlink = any(",
     "tests/unit/test_probes.py::test_nvlink_islands_are_not_nvlink_everywhere"),
    ("targets accept unknown keys", "orchestrator/manifest/sections.py",
     "class Targets(_Frozen):\n",
     'class Targets(_Frozen):\n    model_config = ConfigDict(extra="ignore", frozen=True)\n',
     "tests/unit/test_manifest.py::test_a_typo_in_targets_is_an_error"),
    ("--allow-downtime replaces in place although there is room", "orchestrator/serve/decisions.py",
     "    if room_for_copy:\n", "    if room_for_copy and not allow_downtime:\n",
     "tests/unit/test_serve_decisions.py::test_allow_downtime_still_goes_side_by_side_when_there_is_room"),
]  # fmt: skip


def scope() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["only_mutate"])


def module_of(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def status_of(exit_code: int | None) -> str:
    from mutmut.stats import status_by_exit_code  # the tool's own mapping (mutmut is a test extra)

    return str(status_by_exit_code[exit_code])


def survivor_notes(doc: Path) -> dict[str, tuple[str, str]]:
    """``mutant name -> (equivalent|accepted, why)`` from the rows of scripts/mutation_survivors.md."""
    notes: dict[str, tuple[str, str]] = {}
    row = re.compile(r"^\|\s*`([\w.ǁ]+?)(?:\{([\d,\s]+)\})?`\s*\|\s*(equivalent|accepted)\s*\|\s*(.+?)\s*\|\s*$")
    for line in doc.read_text().splitlines():
        m = row.match(line)
        if not m:
            continue
        stem, group, verdict, why = m.groups()
        names = [stem + n.strip() for n in group.split(",")] if group else [stem]
        for name in names:
            notes[name] = (verdict, why)
    return notes


def results(path: str) -> dict[str, str]:
    meta = REPO / "mutants" / (path + ".meta")
    if not meta.exists():
        return {}
    by_key = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_of(code) for name, code in by_key.items()}


def summarize(path: str, notes: dict[str, tuple[str, str]], seconds: float | None) -> dict[str, object]:
    statuses = results(path)
    counts = Counter(statuses.values())
    undetected = sorted(n for n, s in statuses.items() if s in UNDETECTED)
    equivalent = [n for n in undetected if notes.get(n, ("",))[0] == "equivalent"]
    accepted = [n for n in undetected if notes.get(n, ("",))[0] == "accepted"]
    unexplained = [n for n in undetected if n not in notes]
    caught = sum(counts[s] for s in CAUGHT)
    judged = caught + len(undetected) - len(equivalent)
    return {
        "module": module_of(path),
        "mutants": len(statuses),
        "killed": counts["killed"] + counts["segfault"] + counts["caught by type check"],
        "timeout": counts["timeout"],
        "survived": counts["survived"] + counts["suspicious"],
        "no_tests": counts["no tests"],
        "not_checked": counts["not checked"] + counts["skipped"],
        "equivalent": len(equivalent),
        "accepted": len(accepted),
        "score": round(caught / judged, 4) if judged else None,
        "unexplained": unexplained,
        "seconds": None if seconds is None else round(seconds, 1),
    }


def survivors(path: str) -> list[str]:
    """The mutants of ``path`` that a test added since the last run may kill: the survivors, and
    any whose run was cut short."""
    retest = UNDETECTED | {"not checked", "check was interrupted by user"}
    return sorted(n for n, s in results(path).items() if s in retest)


def mutmut_run(names: list[str], children: int, log: Path) -> float:
    """``mutmut run`` on ``names`` (patterns; none: every mutant without a result)."""
    started = time.monotonic()
    argv = [sys.executable, "-m", "mutmut", "run", "--max-children", str(children), *names]
    with log.open("a") as out:
        subprocess.run(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - started


def run_module(path: str, children: int, log: Path) -> float:
    return mutmut_run([f"{module_of(path)}.*"], children, log)


def resume(paths: list[str], children: int, log: Path) -> float:
    """Bring the last run up to date in two mutmut runs (each maps new tests and runs the clean
    suite once): first every mutant without a result (new code; functions whose hash changed,
    which mutmut resets; a run cut short), then the survivors of ``paths`` against today's tests.
    Killed mutants of unchanged functions stand."""
    seconds = mutmut_run([], children, log)
    names = [n for p in paths for n in survivors(p)]
    return seconds + (mutmut_run(names, children, log) if names else 0.0)


def run_planted(name: str, file: str, old: str, new: str, test: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="orch-planted-") as tmp:
        copy = Path(tmp)
        for part in ("orchestrator", "tests", "cluster-templates", "runbooks"):
            shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        for part in ("conftest.py", "pyproject.toml", "setup.cfg"):
            shutil.copy2(REPO / part, copy / part)
        target = copy / file
        text = target.read_text()
        if text.count(old) != 1:
            return {"planted": name, "result": "does not apply", "file": file}
        target.write_text(text.replace(old, new))
        env = {**os.environ, "PYTHONPATH": str(copy)}
        argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test]
        proc = subprocess.run(argv, cwd=copy, env=env, capture_output=True, text=True, check=False)
    # pytest exit 1: tests ran and one failed (the mutant is killed); 0 lives; anything else is broken.
    verdict = {0: "survived", 1: "killed"}.get(proc.returncode, f"error (pytest exit {proc.returncode})")
    return {"planted": name, "test": test, "result": verdict}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--module", action="append", help="only this module (dotted or path); repeatable")
    ap.add_argument("--summary-only", action="store_true", help="do not run mutmut: summarize the last run")
    ap.add_argument("--no-planted", action="store_true", help="skip the planted mutants")
    ap.add_argument(
        "--resume", action="store_true",
        help="test only the mutants without a result (in the whole scope) and the survivors of the last run; "
        "killed ones stand unless their function changed (mutmut resets those by the function's hash)",
    )  # fmt: skip
    args = ap.parse_args(argv)

    paths = scope()
    if args.module:
        wanted = {m.removesuffix(".py").replace("/", ".") for m in args.module}
        paths = [p for p in paths if module_of(p) in wanted]
        if not paths:
            ap.error(f"not in the scope: {', '.join(sorted(wanted))}")
    notes = survivor_notes(REPO / "scripts" / "mutation_survivors.md")
    (REPO / "mutants").mkdir(exist_ok=True)
    log = REPO / "mutants" / "mutation.log"
    started = time.monotonic()
    summaries = []
    if args.resume and not args.summary_only:
        print(json.dumps({"resumed_seconds": round(resume(paths, args.children, log), 1)}), flush=True)
    for path in paths:
        seconds = None if args.summary_only or args.resume else run_module(path, args.children, log)
        summary = summarize(path, notes, seconds)
        summaries.append(summary)
        print(json.dumps(summary), flush=True)
    planted = [] if args.no_planted else [run_planted(*p) for p in PLANTED]
    for p in planted:
        print(json.dumps(p), flush=True)
    below = [s["module"] for s in summaries if s["score"] is None or s["score"] < TARGET]  # type: ignore[operator]
    unexplained = sum(len(s["unexplained"]) for s in summaries)  # type: ignore[arg-type]
    alive = [p["planted"] for p in planted if p["result"] != "killed"]
    overall = {
        "target": TARGET, "modules": len(summaries), "below_target": below, "unexplained_survivors": unexplained,
        "planted_alive": alive, "seconds": round(time.monotonic() - started, 1),
        "ok": not below and not unexplained and not alive,
    }  # fmt: skip
    print(json.dumps(overall), flush=True)
    return 0 if overall["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
