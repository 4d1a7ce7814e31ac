"""How long preflight probing takes for 1..N nodes over real SSH (the multi-host test bed).

Brings up a test bed of max(N) hosts (root: network namespaces, one sshd per host, stand-in
nvidia-smi with 8 H100s each), then for each N runs ``inventory.gather_all`` on the first N hosts
(every probe plus the head-port test from each worker) and prints one JSON row per N:
{"nodes": N, "seconds": ..., "runs": R}. With the parallel fan-out, 4 nodes should cost about
what one node costs plus the head-port test.

    python benchmarks/preflight.py --nodes 1,2,4 [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import inventory
from orchestrator.remote.connect import open_runners
from tests.testbed import HostSpec, TestbedFactory, check_capabilities


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,2,4", help="comma-separated node counts")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per count (median reported)")
    args = ap.parse_args()
    counts = sorted({int(x) for x in args.nodes.split(",")})
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": f"test bed unavailable: {reason}"}))
        return 1
    factory = TestbedFactory()
    try:
        bed = factory.make([HostSpec("8xH100-80GB", name=f"pb{i}") for i in range(max(counts))], name="bench-preflight")
        full = bed.manifest_dict()
        for n in counts:
            doc = dict(full, nodes=full["nodes"][:n])
            manifest = load_manifest(yaml.safe_dump(doc), str(bed.dir / f"cluster-{n}.yaml"))
            times = []
            with open_runners(manifest, bed.known_hosts) as runners:
                inventory.gather_all(runners, manifest)  # warm: SSH connections opened once
                for _ in range(args.runs):
                    start = time.perf_counter()
                    facts = inventory.gather_all(runners, manifest)
                    times.append(time.perf_counter() - start)
            errors = {k: getattr(v, "errors", str(v)) for k, v in facts.items() if getattr(v, "errors", True)}
            row = {"nodes": n, "seconds": round(statistics.median(times), 3), "runs": args.runs}
            if errors:
                row["errors"] = errors
            print(json.dumps(row), flush=True)
    finally:
        factory.close_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
