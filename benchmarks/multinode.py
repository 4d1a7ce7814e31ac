"""TP=2 across two hosts vs TP=1 on one host: the shape of the multi-node figure (needs root).

    .venv/bin/python benchmarks/multinode.py [--requests 32] [--concurrency 8] [--output-tokens 32]
        [--layouts tp1_one_host,tp2_two_hosts]

Makes a 2-host test bed (network namespaces, one described H100 per host, the vLLM device-key
stand-in of tests/testbed so vLLM's CPU build runs its Ray executor), brings it up with orch's
`up` workflow, then in one run:
  1. `orch rollout --tp 1 --replicas 1` of the tiny model: one engine on one host;
  2. the load below against it;
  3. `orch rollout --tp 2 --allow-downtime` (no room for a second copy on 2 GPUs): ONE replica
     whose two tensor-parallel workers run on the two hosts (vLLM's Ray executor, Gloo over eth0);
  4. the same load against it.
Load: orch's own load generator (``orchestrator.bench.loadgen``), streamed completions of
``--output-tokens`` tokens, ``--concurrency`` in flight. Prints one JSON object with output tok/s
and TTFT p50/p95 of both layouts and the ratio.

There is nothing to meet on CPU: both "GPUs" are the same two shared cores, and TP=2 adds an
all-reduce over a veth pair per layer. It is the shape of the figure a GPU cluster will show
(where TP splits the weights' memory bandwidth across GPUs). Everything is torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bed_serving import roll_and_measure, served_on_bed  # noqa: E402

from orchestrator.plan.tinymodel import build_tiny_model  # noqa: E402
from orchestrator.workflows.rollout import RolloutOptions  # noqa: E402
from tests.testbed import HostSpec, TestbedFactory, check_capabilities  # noqa: E402

# label -> TP of the tiny model's one replica; the second replaces the first in place (no room for both)
LAYOUTS = {"tp1_one_host": 1, "tp2_two_hosts": 2}


def run_layouts(served, labels, requests: int, concurrency: int, output_tokens: int, max_model_len: int = 2048) -> dict:
    """Roll out each layout of ``labels`` (in LAYOUTS' order) on ``served`` (a ServedTiny of an up
    cluster) and measure it: label -> rollout seconds, the rollout's action and the load's figures.
    The suite's smoke run calls this on tests/integration/test_gpu_path.py's spanning replica,
    whose TP=2 rollout matches ``tp2_two_hosts`` (a no-op rollout, then the load)."""
    out: dict = {}
    for label in [label for label in LAYOUTS if label in labels]:
        options = RolloutOptions(timeout_s=900, allow_downtime=True)
        out[label] = roll_and_measure(served, options, (concurrency, requests, output_tokens),
                                      tp=LAYOUTS[label], replicas=1, max_model_len=max_model_len)  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="which layouts to run (comma-separated labels)")
    args = p.parse_args()
    reason = check_capabilities()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    factory = TestbedFactory()
    work = Path(tempfile.mkdtemp(prefix="orch-multinode-"))
    model = build_tiny_model(work / "models" / "tiny")
    out: dict = {"load": vars(args)}
    try:
        bed = factory.make([HostSpec("1xH100-80GB", vllm_gpu=True) for _ in range(2)])
        with served_on_bed(bed, work, model) as (_, served):
            out.update(run_layouts(served, args.layouts.split(","), args.requests, args.concurrency, args.output_tokens))
        a, b = out.get("tp1_one_host", {}), out.get("tp2_two_hosts", {})
        out["tp2_over_tp1_tok_s"] = round(b["output_tok_s"] / a["output_tok_s"], 3) if a.get("output_tok_s") and b else None
    finally:
        factory.close_all()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
