"""Fan-out over the multi-host test bed: bring-up time, first-contact fan-out (connect + one
command on every host) and warm per-command latency over reused connections. Prints JSON.

    .venv/bin/python benchmarks/fanout.py [--hosts 8] [--dead 1] [--connect-timeout 3]

Needs root (network namespaces). ``--dead N`` makes N hosts drop every packet, to show that a
dead host costs the fan-out its connect timeout and nothing more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.remote.runner import fan_out
from orchestrator.remote.ssh import SshRunner
from tests.testbed import HostSpec, TestbedFactory, check_capabilities


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--dead", type=int, default=0)
    p.add_argument("--connect-timeout", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    factory = TestbedFactory()
    try:
        t0 = time.monotonic()
        bed = factory.make([HostSpec("8xH100-80GB", name=f"n{i}") for i in range(args.hosts)], name="bench-fanout")
        bring_up = time.monotonic() - t0
        for h in bed.hosts[: args.dead]:
            bed.drop_all(h)
        runners = [
            SshRunner(h.name, h.address, known_hosts=bed.known_hosts, identity_file=bed.identity_file,
                      allow_agent=False, connect_timeout=args.connect_timeout)
            for h in bed.hosts
        ]
        query = ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
        t0 = time.monotonic()
        outcomes = fan_out(runners, lambda r: r.run(query))
        first = time.monotonic() - t0
        live = [r for r, o in zip(runners, outcomes) if o.ok]
        warm = []
        for _ in range(args.repeat):
            t0 = time.monotonic()
            fan_out(live, lambda r: r.run(["true"]))
            warm.append(time.monotonic() - t0)
        single = []
        for _ in range(args.repeat):
            t0 = time.monotonic()
            live[0].run(["true"])
            single.append(time.monotonic() - t0)
        for r in runners:
            r.close()
        t0 = time.monotonic()
        factory.close_all()
        teardown = time.monotonic() - t0
    finally:
        factory.close_all()
    print(json.dumps({
        "hosts": args.hosts,
        "dead_hosts": args.dead,
        "connect_timeout_s": args.connect_timeout,
        "bring_up_seconds": round(bring_up, 3),
        "seconds": round(first, 3),
        "ok": sum(o.ok for o in outcomes),
        "errors": sorted({type(o.error).__name__ for o in outcomes if o.error}),
        "warm_fanout_p50_seconds": round(statistics.median(warm), 4),
        "warm_single_command_p50_seconds": round(statistics.median(single), 4),
        "teardown_seconds": round(teardown, 3),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
