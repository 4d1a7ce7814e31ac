"""A Ray cluster on test-bed hosts with the tiny model ready to roll out, for the benchmarks that
measure serving on the bed (multinode.py, moe_testbed.py, prefix_routing.py). Needs root."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
