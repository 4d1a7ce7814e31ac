#!/usr/bin/env python3
"""Capture the collective check's job output on the 3-host test bed (root), for the unit tests'
data (tests/data/collective/job-<case>-rank<r>.out, see SOURCES.md there).

    /work/bin/heavy .venv/bin/python scripts/capture_collective_jobs.py [--out DIR] [--cases CASE ...]

One bed of 3 hosts (c0, c1, c2). The job (orchestrator/remote/node_programs/collective_job.py) runs inside each
host directly (nsenter, not SSH: only the job's own output is wanted), Gloo over eth0, with the
spec `orch up` gives it (orchestrator/collective/plan.py: job_spec, the all-to-all included).
Cases:
- ``mesh-pass``: nothing in the way;
- ``mesh-blocked-pair``: c1 drops its TCP to c2 (tests/testbed: block_peer), so c1 and c2 reach
  the head and not each other;
- ``mesh-slow-pair``: c1 and c2 drop what they send each other above 8 MB/s (throttle_peer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.collective.plan import CollectivePlan, job_argv, job_spec
from tests.testbed import HostSpec, TestbedFactory, check_capabilities

REPO = Path(__file__).resolve().parent.parent
SLOW_KBYTES_S = 8000
CASES = ("mesh-pass", "mesh-blocked-pair", "mesh-slow-pair")


def run_case(bed, name: str, out: Path, port: int) -> None:
    hosts = bed.hosts
    ranks = tuple(h.name for h in hosts)
    plan = CollectivePlan("gloo", ranks, hosts[0].address, {h.name: "eth0" for h in hosts},
                          {h.name: h.address for h in hosts}, alltoall=True)  # fmt: skip
    procs = []
    for i, h in enumerate(hosts):
        argv = job_argv(sys.executable, job_spec(plan, i, port))
        env = ["env", "GLOO_SOCKET_IFNAME=eth0", f"VLLM_HOST_IP={h.address}"]
        procs.append(subprocess.Popen(h.ns_exec + env + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for i, p in enumerate(procs):
        stdout, stderr = p.communicate(timeout=plan.deadline_s + 30)
        (out / f"job-{name}-rank{i}.out").write_text(stdout)
        print(json.dumps({"case": name, "rank": i, "exit": p.returncode, "stderr_tail": stderr.strip()[-200:]}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "collective")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    factory = TestbedFactory()
    try:
        bed = factory.make([HostSpec("none", name=f"c{i}") for i in range(3)], name="capture-collective")
        c1, c2 = bed.hosts[1], bed.hosts[2]
        for port, case in enumerate(CASES, start=29611):
            if case not in args.cases:
                continue
            if case == "mesh-blocked-pair":
                bed.block_peer(c1, c2.address)
            if case == "mesh-slow-pair":
                bed.throttle_peer(c1, c2.address, SLOW_KBYTES_S)
                bed.throttle_peer(c2, c1.address, SLOW_KBYTES_S)
            try:
                run_case(bed, case, args.out, port)
            finally:
                bed.clear_faults(c1)
                bed.clear_faults(c2)
    finally:
        factory.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
