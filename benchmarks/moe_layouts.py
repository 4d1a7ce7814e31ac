"""MoE layouts: TP x PP against DP x EP, at the plan level and on the test bed.

    .venv/bin/python benchmarks/moe_layouts.py [--max-model-len 32768] [--vllm-version 0.29.0]
    .venv/bin/python benchmarks/moe_layouts.py --part plan       # only (a)

Prints one JSON object.

(a) ``plan``: for DeepSeek-V3, Qwen3-235B-A22B and Mixtral-8x22B (orch's catalog entries) on
2 x 8 H100-80GB and 2 x 8 H200-141GB, the layout ``orch plan`` chooses by itself and the
best layout of each kind (``plan.layouts``: the TP x PP choice and the DP x EP one), each with its
weights and KV cache per GPU, GPUs per replica, replicas, KV tokens per rank, per replica and over
the cluster, and the maximum concurrency at ``max_model_len`` over the cluster. Pure planning: no
GPU, no network, a second or two.

(b) ``testbed``: output tok/s and TTFT p50/p95 of the tiny MoE served DP=2 + EP against TP=2 under
the same load, in one run, on the test bed (``benchmarks/moe_testbed.py``, which runs it; needs
root for the test bed, minutes). On vLLM 0.32's CPU backend the DP layout's entry carries the
rollout's error instead of figures (docs/moe.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.plan.capacity import PlanOptions  # noqa: E402
from orchestrator.plan.catalog import CATALOG  # noqa: E402
from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM  # noqa: E402
from orchestrator.plan.planner import plan_model  # noqa: E402
from orchestrator.plan.shape import make_shape  # noqa: E402

MODELS = ("deepseek-v3", "qwen3-235b-a22b", "mixtral-8x22b")
SHAPES = (("H100-80GB", 8, 2), ("H200-141GB", 8, 2))
FIELDS = (
    "tp", "pp", "dp", "ep_size", "gpus_per_replica", "replicas", "fits", "weights_gib_per_gpu", "kv_cache_gib_per_gpu",
    "kv_cache_tokens_per_rank", "kv_cache_tokens", "kv_cache_tokens_cluster", "max_concurrency_cluster",
)  # fmt: skip


def plan_part(max_model_len: int | None, vllm_version: str) -> list[dict]:
    rows = []
    for model in MODELS:
        spec = CATALOG[model]
        for gpu, per_node, nodes in SHAPES:
            shape = make_shape(gpu_type_name=gpu, gpus_per_node=per_node, nodes=nodes)
            length = min(max_model_len, spec.max_position) if max_model_len else None
            options = PlanOptions(max_model_len=length, vllm_version=vllm_version)
            plan = plan_model(spec, shape, options)
            layouts = {kind: {f: lay[f] for f in FIELDS} for kind, lay in (plan.layouts or {}).items()}
            rows.append({
                "model": model, "gpus": f"{nodes} x {per_node} {gpu}", "max_model_len": plan.max_model_len,
                "chosen": "dp_ep" if plan.dp > 1 else "tp_pp", "fits": plan.fits, "layouts": layouts,
                "why": next((r for r in plan.reasons if r.startswith("layout: ")), None),
            })  # fmt: skip
    return rows


def testbed_part() -> dict:
    """(b): the tiny MoE DP=2 + EP against TP=2 on the test bed (benchmarks/moe_testbed.py)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import moe_testbed  # a sibling script, imported only when (b) is asked for: it brings up a test bed

    return moe_testbed.testbed_part()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("plan", "testbed", "all"), default="all")
    ap.add_argument("--max-model-len", type=int, default=None, help="cap max_model_len [default: each model's own]")
    ap.add_argument("--vllm-version", default=GPU_EXTRA_VLLM)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    out: dict = {"vllm_version": args.vllm_version}
    if args.part in ("plan", "all"):
        out["plan"] = plan_part(args.max_model_len, args.vllm_version)
    if args.part in ("testbed", "all"):
        out["testbed"] = testbed_part()
    out["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
