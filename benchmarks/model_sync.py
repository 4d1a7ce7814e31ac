"""`orch model sync` time against the number of hosts, on the multi-host test bed. Prints JSON.

    .venv/bin/python benchmarks/model_sync.py [--hosts 1,2,4] [--mb 256] [--repeat 1]

A generated model folder (``--mb`` MiB of random shards, 64 MiB each, and a config.json) on this
machine is distributed to N fresh test hosts (each with its own model store) in two ways:

- ``chain``: `orch model sync --from local` (the workflow, in process): the control machine sends
  the model once, over SSH, into the first host's agent, which writes it and relays every chunk
  to the next host over the bed's network, and so on (a pipelined chain);
- ``ssh-each``: the control machine sends the model to each host in turn over SSH (the same agent,
  one host at a time: what copying host by host from one machine does).

One JSON row per run: ``{"hosts", "mode", "seconds", "mib", "mib_s"}`` with the CPU the hosts'
processes used (``host_cpu_s``, from each host's pid namespace, as benchmarks/bring_up.py does)
and this process's own (``control_cpu_s``: SSH encryption, reading the files); ``cpu_floor_s`` is
their sum divided by this machine's cores: every host runs on the same few cores here, so no
fan-out can end sooner. The last rows compare chain(max)/chain(1) (the issue's goal: at most
1.5x on a bed whose links are not shared) and ssh-each(max)/chain(max).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from bring_up import host_cpu_seconds

from orchestrator.manifest.load import load_manifest
from orchestrator.remote.connect import open_runners
from orchestrator.remote.local import LocalRunner
from orchestrator.workflows.model_sync import SyncDeps, SyncOptions, sync_model
from tests.testbed import HostSpec, TestbedFactory, check_capabilities

TARGET_RATIO = 1.5
SHARD_MIB = 64
STORE = "bench-models"


def make_model(root: Path, mib: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    left, i = mib, 1
    while left > 0:
        size = min(SHARD_MIB, left)
        with open(root / f"model-{i:05d}.safetensors", "wb") as f:
            for _ in range(size):
                f.write(os.urandom(1 << 20))
        left -= size
        i += 1
    return root


def manifest_for(bed, hosts) -> object:
    doc = bed.manifest_dict(accelerator="cpu", model_store=str(bed.ray_temp_dir / STORE))
    doc["nodes"] = [n for n in doc["nodes"] if n["name"] in {h.name for h in hosts}]
    doc["nodes"][0]["role"] = "head"
    for n in doc["nodes"]:
        n["interface"] = "eth0"
    return load_manifest(yaml.safe_dump(doc), str(bed.dir / "cluster.yaml"))


def timed_sync(bed, hosts, src: Path) -> tuple[float, int]:
    manifest = manifest_for(bed, hosts)
    deps = SyncDeps(open_runners=lambda m: open_runners(m, bed.known_hosts), local=LocalRunner("local"), local_python=sys.executable)
    t0 = time.monotonic()
    result = sync_model(manifest, deps, SyncOptions(model=str(src)))
    seconds = time.monotonic() - t0
    if not result.ok:
        raise RuntimeError(json.dumps(result.to_dict()))
    return seconds, result.sent_bytes


def cpu_now(bed) -> tuple[float, float]:
    t = os.times()
    return sum(host_cpu_seconds(bed).values()), t.user + t.system + t.children_user + t.children_system


def one_run(factory: TestbedFactory, n: int, src: Path, mib: int) -> list[dict]:
    bed = factory.make([HostSpec("none", name=f"b{i}") for i in range(n)], name=f"bench-sync{n}")
    rows = []
    try:
        for mode in ("chain", "ssh-each"):
            for h in bed.hosts:
                shutil.rmtree(h.ray_dir / STORE, ignore_errors=True)
                (h.ray_dir / STORE).mkdir()
            host0, ctl0 = cpu_now(bed)
            if mode == "chain":
                seconds, sent = timed_sync(bed, bed.hosts, src)
            else:
                seconds, sent = 0.0, 0
                for h in bed.hosts:
                    s, b = timed_sync(bed, [h], src)
                    seconds, sent = seconds + s, sent + b
            host1, ctl1 = cpu_now(bed)
            host_cpu, ctl_cpu = host1 - host0, ctl1 - ctl0
            rows.append({
                "hosts": n, "mode": mode, "seconds": round(seconds, 2), "mib": mib, "sent_mib": round(sent / (1 << 20), 1),
                "mib_s": round(mib * n / seconds, 1),
                "host_cpu_s": round(host_cpu, 1), "control_cpu_s": round(ctl_cpu, 1),
                "cpu_floor_s": round((host_cpu + ctl_cpu) / (os.cpu_count() or 1), 1),
                "load1": round(os.getloadavg()[0], 1),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    finally:
        bed.close()
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="1,2,4", help="comma-separated host counts")
    p.add_argument("--mb", type=int, default=256, help="model size in MiB")
    p.add_argument("--repeat", type=int, default=1, help="runs per count")
    args = p.parse_args()
    counts = [int(x) for x in args.hosts.split(",") if x.strip()]
    reason = check_capabilities()
    if reason:
        print(json.dumps({"error": reason}))
        return 1
    factory = TestbedFactory()
    times: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="orch-bench-sync-") as tmp:
        src = make_model(Path(tmp) / "bench-model", args.mb)
        try:
            for _ in range(args.repeat):
                for n in counts:
                    for row in one_run(factory, n, src, args.mb):
                        times.setdefault((row["mode"], n), []).append(row["seconds"])
        finally:
            factory.close_all()
    lo, hi = min(counts), max(counts)
    if lo != hi:
        chain = statistics.median(times[("chain", hi)]) / statistics.median(times[("chain", lo)])
        print(json.dumps({"compare": f"chain {hi} vs {lo} hosts", "ratio": round(chain, 2), "target": TARGET_RATIO, "met": chain <= TARGET_RATIO}))
    each = statistics.median(times[("ssh-each", hi)]) / statistics.median(times[("chain", hi)])
    print(json.dumps({"compare": f"ssh-each vs chain, {hi} hosts", "ratio": round(each, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
