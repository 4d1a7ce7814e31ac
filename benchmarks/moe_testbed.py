"""MoE on the test bed: the tiny MoE served TP=2, DP=2 and DP=2 + EP, same load, one run (needs root).

What this hardware cannot do (vLLM 0.32's CPU build on CPU test hosts): the ``dp2_ep`` layout never
serves (expert parallelism segfaults in the CPU MoE kernel at the first request, docs/moe.md), so
its entry is the rollout's error, not figures; ``dp2`` serves only through the test bed's collective
stand-in (tests/testbed/vllm_gpu_standin); and no figure here is a GPU figure: both "GPUs" are the
machine's two shared cores. ``--layouts tp2`` (the suite's smoke run,
tests/integration/test_benchmark_smokes.py) is the part that runs everywhere.

    .venv/bin/python benchmarks/moe_testbed.py [--requests 32] [--concurrency 8] [--output-tokens 32]
        [--layouts tp2,dp2,dp2_ep] [--dp-timeout 420] [--keep-logs DIR]
    .venv/bin/python benchmarks/moe_layouts.py --part testbed     # the same, inside moe_layouts' JSON

Part (b) of ``benchmarks/moe_layouts.py`` (issue 23 item 7b). Makes a 2-host test bed (one
described H100 per host, the vLLM device-key stand-in of tests/testbed so vLLM's CPU build runs
its Ray executor), brings it up with orch's `up` workflow, then in one run, with the tiny
Qwen3-MoE-shaped model of ``orchestrator.plan.tinymodel.build_tiny_moe`` (8 experts, 2 per token):

  1. `orch rollout --tp 2 --no-expert-parallel`: one replica, its two tensor-parallel workers on
     the two hosts (vLLM's Ray executor, Gloo over eth0), every expert split over both;
  2. the load below against it (orch's load generator, streamed completions);
  3. `orch rollout --dp 2 --no-expert-parallel --allow-downtime` (a switch between the two
     builders is never side by side): Ray Serve LLM's build_dp_openai_app, one rank per host, the
     experts split over both (vLLM's AllGather + ReduceScatter MoE path), and the same load;
  4. `orch rollout --dp 2 --expert-parallel --allow-downtime`: 4 of the 8 experts on each rank,
     and the same load when it serves.

Prints one JSON object: per layout the rollout's outcome and seconds and, when it served, output
tok/s and TTFT p50/p95, and each DP layout's tok/s over TP=2's. On vLLM 0.32's CPU backend a DP
group serves only with the test bed's collective stand-in (tests/testbed/vllm_gpu_standin, which
the bed's hosts carry), and the EP layout not at all: its first request segfaults in the CPU MoE
kernel (docs/moe.md), so its entry carries the rollout's error instead of figures; it is measured
on a GPU cluster with the same script. Nothing to meet on CPU: both "GPUs" are the same two
shared cores. Torn down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bed_serving import roll_and_measure, served_on_bed  # noqa: E402

from orchestrator.errors import OrchError  # noqa: E402
from orchestrator.plan.tinymodel import build_tiny_moe  # noqa: E402
from orchestrator.workflows.rollout import RolloutOptions  # noqa: E402
from tests.testbed import HostSpec, TestbedFactory, check_capabilities  # noqa: E402

LAYOUTS = (
    ("tp2", {"tp": 2, "dp": 1, "expert_parallel": False}),
    ("dp2", {"dp": 2, "expert_parallel": False}),
    ("dp2_ep", {"dp": 2, "expert_parallel": True}),
)


def run_layouts(served, layouts, requests: int, concurrency: int, output_tokens: int, dp_timeout_s: float = 420.0) -> dict:
    """Roll out each layout of ``layouts`` (in LAYOUTS' order) on ``served`` (a ServedTiny of an up
    cluster whose model is the tiny MoE) and measure the ones that serve: label -> the rollout's
    outcome, seconds and action, and the load's figures (or the rollout's error). The suite's smoke
    run calls this on tests/integration/test_moe_dp.py's DP group, whose rollout matches ``dp2``
    (a no-op rollout, then the load)."""
    out: dict = {}
    for label, layout in [(label, layout) for label, layout in LAYOUTS if label in layouts]:
        timeout = dp_timeout_s if "dp" in layout else 900.0
        options = RolloutOptions(timeout_s=timeout, allow_downtime=True)
        t0 = time.monotonic()
        try:
            out[label] = {"served": True, **roll_and_measure(served, options, (concurrency, requests, output_tokens),
                                                              replicas=1, max_model_len=1024, **layout)}  # fmt: skip
        except OrchError as exc:
            out[label] = {"served": False, "rollout_s": round(time.monotonic() - t0, 1), "error": exc.message[:1500]}
    return out


def testbed_part(requests: int = 32, concurrency: int = 8, output_tokens: int = 32, dp_timeout_s: float = 420.0,
                 layouts: tuple[str, ...] = tuple(label for label, _ in LAYOUTS), keep_logs: Path | None = None) -> dict:  # fmt: skip
    """Both layouts on one fresh 2-host bed, the same load; see the module docstring. ``layouts``:
    the labels to run (in LAYOUTS' order); ``keep_logs``: a folder that gets each host's Ray logs
    (replicas, engine workers) before the bed goes."""
    reason = check_capabilities()
    if reason:
        return {"status": "not run", "why": reason}
    load = {"requests": requests, "concurrency": concurrency, "output_tokens": output_tokens}
    factory = TestbedFactory()
    work = Path(tempfile.mkdtemp(prefix="orch-moe-testbed-"))
    model = build_tiny_moe(work / "models" / "tiny-moe")
    out: dict = {"model": "tiny-moe (orchestrator.plan.tinymodel.build_tiny_moe, qwen3_moe)", "load": load}
    bed = None
    try:
        bed = factory.make([HostSpec("1xH100-80GB", vllm_gpu=True) for _ in range(2)])
        with served_on_bed(bed, work, model) as (_, served):
            out.update(run_layouts(served, layouts, requests, concurrency, output_tokens, dp_timeout_s))
        a = out.get("tp2", {})
        for label in ("dp2", "dp2_ep"):
            b = out.get(label, {})
            both = a.get("served") and b.get("served") and a.get("output_tok_s")
            out[f"{label}_over_tp2_tok_s"] = round(b["output_tok_s"] / a["output_tok_s"], 3) if both else None
    finally:
        if keep_logs is not None and bed is not None:
            for h in bed.hosts:
                # session_latest links to the session by its path inside the host's mount namespace
                link = h.ray_dir / "session_latest"
                logs = h.ray_dir / Path(os.readlink(link)).name / "logs" if link.is_symlink() else link / "logs"
                if logs.is_dir():
                    shutil.copytree(logs, keep_logs / h.name, dirs_exist_ok=True)
            out["logs"] = str(keep_logs)
        factory.close_all()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--dp-timeout", type=float, default=420.0, help="seconds the DP rollout may take before it counts as failed")
    p.add_argument("--layouts", default=",".join(label for label, _ in LAYOUTS), help="which layouts to run (comma-separated labels)")
    p.add_argument("--keep-logs", type=Path, help="copy each host's Ray logs here before the bed is torn down")
    args = p.parse_args()
    out = testbed_part(args.requests, args.concurrency, args.output_tokens, args.dp_timeout,
                       tuple(args.layouts.split(",")), args.keep_logs)  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0 if out.get("status") != "not run" else 1


if __name__ == "__main__":
    sys.exit(main())
