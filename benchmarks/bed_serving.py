"""A Ray cluster on test-bed hosts with the tiny model ready to roll out, for the benchmarks that
measure serving on the bed (multinode.py, moe_testbed.py, prefix_routing.py). Needs root."""

from __future__ import annotations

import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serve_overhead import measure  # the same load and figures as the overhead benchmark

from orchestrator.workflows.cluster import UpOptions, up
from orchestrator.workflows.down import down
from tests.fixtures.cluster import RayTestbedCluster, testbed_manifest
from tests.fixtures.serving import ServedTiny


@contextmanager
def served_on_bed(bed, work: Path, model: Path, **manifest_overrides) -> Iterator[tuple[RayTestbedCluster, ServedTiny]]:
    """`orch up` of ``bed`` (manifest in ``work``, the model's folder as its model store), then
    (cluster, a ServedTiny to roll out with); `orch down` on the way out, whatever happened."""
    path = work / "cluster.yaml"
    path.write_text(testbed_manifest(bed, model_store=model.parent, **manifest_overrides))
    cluster = RayTestbedCluster(bed=bed, manifest_path=path, state_dir=work / "state")
    try:
        # No collective check: stand-in GPUs cannot run NCCL, and these measure serving.
        up(cluster.manifest, cluster.deps(), UpOptions(timeout=300, collective_check=False))
        yield cluster, ServedTiny(cluster=cluster, manifest_path=path, api_key="orch-bench-" + secrets.token_hex(16), model_path=model)
    finally:
        try:
            down(cluster.manifest, cluster.deps())
        except Exception as exc:  # the bed's teardown still kills what is left
            print(f"orch down: {exc}", file=sys.stderr)


def roll_and_measure(served: ServedTiny, options, load: tuple[int, int, int], **request) -> dict:
    """`orch rollout` of ``request`` on ``served``, a short warm-up, then ``load`` (concurrency,
    requests, output tokens) with the overhead benchmark's load generator: the rollout's seconds
    and action, and the load's figures (multinode.py and moe_testbed.py measure each layout so)."""
    t0 = time.monotonic()
    result = served.rollout(options, **request)
    ready_s = time.monotonic() - t0
    measure(served.endpoint, served.api_key, 2, 4, 8)  # warm-up
    return {"rollout_s": round(ready_s, 1), "action": result.action, **measure(served.endpoint, served.api_key, *load)}
