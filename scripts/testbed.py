#!/usr/bin/env python3
"""Manual use of the multi-host test bed (root): start hosts, list them, tear them down.

    .venv/bin/python scripts/testbed.py up --hosts 3 --gpus 8xH100-80GB [--gpus 4xA100-40GB ...]
        [--ib0] [--shm 1g] [--accelerator cpu]
    .venv/bin/python scripts/testbed.py list
    .venv/bin/python scripts/testbed.py down [RUN ...]      (no RUN: every bed made by `up`)
    .venv/bin/python scripts/testbed.py cleanup             (beds of crashed test runs)

`up` prints each host (name, address, how to ssh in) and writes a cluster.yaml for them; the
hosts keep running after the script exits, until `down`. See docs/remote-and-testbed.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.testbed import (
    HostSpec,
    Testbed,
    check_capabilities,
    cleanup_stale,
    list_runs,
    owner_alive,
    teardown_run,
)


def cmd_up(args: argparse.Namespace) -> int:
    reason = check_capabilities()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    profiles = args.gpus or ["8xH100-80GB"]
    specs = [
        HostSpec(
            gpus=profiles[i] if i < len(profiles) else profiles[-1],
            name=f"node{i}",
            nics=("ib0",) if args.ib0 else (),
            shm_size=args.shm,
            vllm_gpu=args.vllm_gpu,
        )
        for i in range(args.hosts)
    ]
    bed = Testbed(specs, name=args.name, manual=True).start()
    manifest = bed.write_manifest(accelerator=args.accelerator)
    if args.json:
        print(json.dumps({"run": bed.run_id, "manifest": str(manifest), "hosts": [
            {"name": h.name, "address": h.address, "ssh_port": h.ssh_port, "gpus": h.spec.gpus, "netns": h.netns,
             "ib0": h.ib_address} for h in bed.hosts]}, indent=2))
        return 0
    print(f"test bed {bed.run_id} ({bed.name}): {len(bed.hosts)} hosts")
    for h in bed.hosts:
        ssh = ["ssh", "-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={bed.known_hosts}", f"root@{h.address}"]
        print(f"  {h.name:8} {h.address:15} {h.spec.gpus:14} {shlex.join(ssh)}")
    print(f"cluster.yaml: {manifest}")
    print(f"  e.g. .venv/bin/orch validate {manifest}")
    print(f"tear down: .venv/bin/python scripts/testbed.py down {bed.run_id}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for run, owner in list_runs().items():
        state = "manual" if owner.get("manual") else ("live" if owner_alive(owner) else "stale")
        hosts = ", ".join(f"{h['name']}={h['address']}" for h in owner.get("hosts", []))
        print(f"{run}  {state:6}  {owner.get('name', '?')}  {hosts}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    runs = list_runs()
    targets = args.runs or [r for r, o in runs.items() if o.get("manual")]
    for run in targets:
        if run not in runs:
            print(f"error: no test bed {run}", file=sys.stderr)
            return 1
        if owner_alive(runs[run]) and not runs[run].get("manual"):
            print(f"error: {run} belongs to a running test session (pid {runs[run]['pid']})", file=sys.stderr)
            return 1
        teardown_run(run, runs[run])
        print(f"removed {run}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    for run in cleanup_stale():
        print(f"removed stale {run}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start hosts")
    up.add_argument("--hosts", type=int, default=3)
    up.add_argument("--gpus", action="append", help="GPU profile per host, in order (last one repeats)")
    up.add_argument("--ib0", action="store_true", help="give every host an ib0 NIC on a second network")
    up.add_argument("--shm", help="size of each host's /dev/shm, e.g. 1g")
    up.add_argument("--vllm-gpu", action="store_true",
                    help="every host's Python carries the vLLM device-key stand-in (vLLM's Ray executor runs on CPU)")
    up.add_argument("--name")
    up.add_argument("--accelerator", choices=["gpu", "cpu"], default="gpu")
    up.add_argument("--json", action="store_true")
    up.set_defaults(func=cmd_up)
    sub.add_parser("list", help="list test beds").set_defaults(func=cmd_list)
    down = sub.add_parser("down", help="tear down beds made by `up` (or the named runs)")
    down.add_argument("runs", nargs="*")
    down.set_defaults(func=cmd_down)
    sub.add_parser("cleanup", help="tear down beds of crashed test runs").set_defaults(func=cmd_cleanup)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
