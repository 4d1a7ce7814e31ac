"""`orch up` bring-up time against the number of nodes, on the multi-host test bed. Prints JSON.

    .venv/bin/python benchmarks/bring_up.py [--nodes 1,2,4] [--repeat 1]

For each count N: a fresh test bed of N hosts (8 described H100-80GB each), then the `orch up`
workflow from nothing (real SSH, real Ray: preflight, `ray stop`, token, head, workers in
parallel, wait until every node is ALIVE with its GPUs), timed end to end; then `orch down`
and the bed is torn down. One JSON row per run: ``{"nodes", "seconds", "phases"}`` where
``phases`` gives the seconds from the start at which each progress step began. The last row
compares the median of the largest count with the median of one node (target: at most 1.3x).

Needs root (network namespaces). Every test host runs on this machine's cores: ``host_cpu_s``
is the CPU time the hosts' processes used up to "all ALIVE" (the `ray start` commands, raylets,
agents, the head's GCS and dashboard, the probes) and ``cpu_floor_s`` that divided by the cores,
the least wall time possible here however parallel the fan-out; ``load1`` is the machine's load
(other users included) when the run ended. On real machines each node has its own cores and
the bring-up of N nodes approaches the slowest single node.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.manifest.load import load_manifest
from orchestrator.remote.connect import open_runners
from orchestrator.state import StateStore
from orchestrator.workflows.cluster import ClusterDeps, UpOptions, up
from orchestrator.workflows.down import down
from tests.fixtures.cluster import testbed_manifest
from tests.testbed import HostSpec, TestbedFactory, check_capabilities

TARGET_RATIO = 1.3

# CPU seconds used by every process of a test host so far (its own pid namespace): utime+stime
# of the live processes plus cutime+cstime, which holds the reaped children (the `ray start`
# command, the probes). Clock ticks -> seconds.
HOST_CPU_SCRIPT = r"""
import os
tick = os.sysconf("SC_CLK_TCK")
total = 0
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            fields = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])
print(total / tick)
"""


def host_cpu_seconds(bed) -> dict[str, float]:
    return {h.name: float(bed.ns_exec(h, ["python3", "-c", HOST_CPU_SCRIPT]).stdout) for h in bed.hosts}


def one_run(factory: TestbedFactory, nodes: int, state_root: Path) -> dict:
    bed = factory.make([HostSpec("8xH100-80GB", name=f"n{i}") for i in range(nodes)], name=f"bench-up{nodes}")
    try:
        manifest = load_manifest(testbed_manifest(bed), bed.dir / "cluster.yaml")
        steps: list[tuple[float, str]] = []
        t0 = time.monotonic()
        deps = ClusterDeps(
            state=StateStore(state_root / bed.run_id),
            open_runners=lambda m: open_runners(m, bed.known_hosts),
            progress=lambda msg: steps.append((round(time.monotonic() - t0, 2), msg)),
        )
        # Ray's bring-up alone (stand-in GPUs: no NCCL); benchmarks/collective_check.py times the check.
        result = up(manifest, deps, UpOptions(timeout=600, collective_check=False))
        seconds = time.monotonic() - t0
        gpus = sum(s.gpus_total for s in result.nodes if s.alive)
        cpu = host_cpu_seconds(bed)
        down(manifest, deps)
    finally:
        bed.close()
    phases = {}
    for at, msg in steps:
        key = msg.split(":")[0].split(" (")[0]
        phases.setdefault(key, at)
    cpu_total = sum(cpu.values())
    return {
        "nodes": nodes,
        "seconds": round(seconds, 2),
        "gpus": gpus,
        "action": result.action,
        "phases": phases,
        # What the N hosts' processes burned on this machine's cores to get there: with every
        # host sharing the same few cores, the wall time cannot drop below cpu / cores.
        "host_cpu_s": round(cpu_total, 1),
        "cpu_floor_s": round(cpu_total / (os.cpu_count() or 1), 1),
        "load1": round(os.getloadavg()[0], 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="1,2,4", help="comma-separated node counts")
    p.add_argument("--repeat", type=int, default=1, help="runs per count")
    args = p.parse_args()
    counts = [int(x) for x in args.nodes.split(",") if x.strip()]
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    factory = TestbedFactory()
    runs: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="orch-bench-up-") as tmp:
        try:
            for _ in range(args.repeat):
                for n in counts:
                    row = one_run(factory, n, Path(tmp))
                    runs.setdefault(n, []).append(row["seconds"])
                    print(json.dumps(row), flush=True)
        finally:
            factory.close_all()
    lo, hi = min(runs), max(runs)
    if lo != hi:
        ratio = statistics.median(runs[hi]) / statistics.median(runs[lo])
        print(json.dumps({"compare": f"{hi} vs {lo} nodes", "ratio": round(ratio, 2), "target": TARGET_RATIO,
                          "met": ratio <= TARGET_RATIO}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
