"""Runs one scenario of the stop script inside a PID namespace of its own (the test starts this
file under `unshare --pid --fork --mount-proc`): the stop script there sees only the scenario's
processes, so neither a regression nor a planted bug can kill anything outside the test.

argv[1]: JSON {"stop_argv": [...], "run_as": uid|null, "run_env": {...}|null,
               "procs": {label: {"argv": [...], "env": {...}, "user": uid|null}}}
Each process must print one line (its own "ready", or a child's pid then "ready") before the
stop script runs. Prints JSON {"returncode", "stdout", "stderr", "pids": {label: pid},
"alive": {label: bool}} (children reported by a process appear as "<label>/child")."""

from __future__ import annotations

import json
import subprocess
import sys


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main() -> None:
    spec = json.loads(sys.argv[1])
    procs: dict[str, subprocess.Popen] = {}
    pids: dict[str, int] = {}
    for label, p in spec["procs"].items():
        user = p.get("user")
        extra = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
        procs[label] = subprocess.Popen(p["argv"], env=p["env"], stdout=subprocess.PIPE, text=True, **extra)
        pids[label] = procs[label].pid
    for label, proc in procs.items():
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":  # a spawner: its child's pid first
            pids[f"{label}/child"] = int(line)
            line = proc.stdout.readline().strip()
        assert line == "ready", (label, line)
    run_as = spec.get("run_as")
    extra = {"user": run_as, "group": run_as, "extra_groups": []} if run_as is not None else {}
    out = subprocess.run(spec["stop_argv"], capture_output=True, text=True, timeout=120, env=spec.get("run_env"), **extra)
    for proc in procs.values():  # reap the killed ones (this process is the namespace's init)
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    print(json.dumps({"returncode": out.returncode, "stdout": out.stdout, "stderr": out.stderr, "pids": pids,
                      "alive": {label: alive(pid) for label, pid in pids.items()}}))  # fmt: skip
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()


if __name__ == "__main__":
    main()
