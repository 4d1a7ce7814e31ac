"""What the collective check adds to `orch up` on the 3-host test bed (Gloo, CPU manifest). Prints JSON.

    .venv/bin/python benchmarks/collective_check.py [--repeat 3] [--full]

One bed of 3 hosts. Each round runs the `orch up` workflow with --check-only three times: without
the collective check, with the check's all-reduce only, and with the whole check (the all-to-all
between every pair of nodes as well, what `orch up` runs) -- in a rotating order, so the
machine's load hits all alike -- over real SSH: the check is the only difference, and it runs
once, before Ray starts, in a full `up` as well. With --full each round also times a full `up`
(Ray started) with the check, then `down`. One JSON row per run (``seconds``, the check's own
``check_s``, its figures); the last row gives the medians, the seconds the check adds against the
issue's budget (15 s) and what the all-to-all adds to it. ``load1`` is the machine's load average
(other users included): every host shares this machine's cores.
"""

from __future__ import annotations

import argparse
import functools
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
from orchestrator.workflows.collective import run_collective_check
from orchestrator.workflows.down import down
from tests.fixtures.cluster import testbed_manifest
from tests.testbed import HostSpec, TestbedFactory, check_capabilities

BUDGET_S = 15.0
VARIANTS = ["none", "all-reduce", "all-reduce + all-to-all"]


def timed(manifest, deps, options) -> tuple[float, dict]:
    t0 = time.monotonic()
    result = up(manifest, deps, options)
    seconds = time.monotonic() - t0
    coll = result.collective.to_dict() if result.collective else None
    row = {"seconds": round(seconds, 2), "action": result.action, "load1": round(os.getloadavg()[0], 1)}
    if coll:
        row.update(check_s=coll["seconds"], ok=coll["ok"], all_busbw_gbps=coll["all"]["busbw_gbps"],
                   all_latency_us=coll["all"]["latency_us"], pairs_busbw_gbps=[p["busbw_gbps"] for p in coll["pairs"]])  # fmt: skip
        mesh = coll.get("mesh") or {}
        if mesh.get("pairs"):
            row.update(a2a_all_busbw_gbps=(mesh.get("all") or {}).get("busbw_gbps"),
                       a2a_pairs_busbw_gbps={p["name"]: p["busbw_gbps"] for p in mesh["pairs"]})  # fmt: skip
    return seconds, row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--full", action="store_true", help="also time a full `up` (Ray started) with the check")
    args = p.parse_args()
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    factory = TestbedFactory()
    runs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        bed = factory.make([HostSpec("none", name=f"b{i}") for i in range(3)], name="bench-collective")
        with tempfile.TemporaryDirectory(prefix="orch-bench-coll-") as tmp:
            eth0 = {h.name: {"interface": "eth0"} for h in bed.hosts}  # Gloo needs the interface named
            manifest = load_manifest(testbed_manifest(bed, accelerator="cpu", node_overrides=eth0), bed.dir / "cluster.yaml")

            def deps(alltoall: bool) -> ClusterDeps:
                return ClusterDeps(state=StateStore(Path(tmp)), open_runners=lambda m: open_runners(m, bed.known_hosts),
                                   collective=functools.partial(run_collective_check, alltoall=alltoall))  # fmt: skip

            for i in range(args.repeat):
                for variant in VARIANTS[i % 3:] + VARIANTS[: i % 3]:
                    # force: a COLLECTIVE_SLOW warning (true when this machine is loaded) must not stop a run
                    options = UpOptions(check_only=True, collective_check=variant != "none", force=True)
                    s, row = timed(manifest, deps(variant == "all-reduce + all-to-all"), options)
                    runs[variant].append(s)
                    print(json.dumps({"run": "check-only", "collective_check": variant, **row}), flush=True)
                if args.full:
                    s, row = timed(manifest, deps(True), UpOptions(timeout=300, force=True))
                    print(json.dumps({"run": "full up", "collective_check": VARIANTS[2], **row}), flush=True)
                    down(manifest, deps(True))
    finally:
        factory.close_all()
    med = {v: statistics.median(runs[v]) for v in VARIANTS}
    added = med[VARIANTS[2]] - med["none"]
    print(json.dumps({"median_s": {v: round(m, 2) for v, m in med.items()}, "added_s": round(added, 2),
                      "alltoall_added_s": round(med[VARIANTS[2]] - med[VARIANTS[1]], 2), "budget_s": BUDGET_S,
                      "met": added <= BUDGET_S, "runs": len(runs["none"]),
                      "load1_end": round(os.getloadavg()[0], 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
