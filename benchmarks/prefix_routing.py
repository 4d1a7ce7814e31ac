"""Request routers under the same shared-prefix load: vLLM's prefix-cache hit rate and TTFT (needs root).

    .venv/bin/python benchmarks/prefix_routing.py [--routers default,prefix_affinity,session_affinity]
        [--prefixes 16] [--turns 4] [--prefix-tokens 1024] [--turn-tokens 32] [--output-tokens 16]
        [--concurrency 4] [--no-forward-body] [--pages DIR]

Makes a 1-host test bed (a network namespace with its own sshd; see docs/remote-and-testbed.md),
brings it up with orch's `up` workflow (6 logical CPUs: two replicas fit, a second copy of them
does not, so each router is deployed in place), and for each router in turn:
  1. `orch rollout --replicas 2 --request-router R --allow-downtime` of the tiny model (two CPU
     engines, fresh: no prefix is cached when the load starts);
  2. 4 unmeasured requests with random prompts (the engines' first requests are slow);
  3. `orch bench`'s shared-prefix workload (``bench.prompts.shared_prefix_prompts``): --prefixes
     system prompts of --prefix-tokens tokens, each followed by --turns user turns of
     --turn-tokens tokens, shuffled, --concurrency in flight; the same seed for every router, so
     every router gets the same requests in the same order. Each request names its system prompt
     in Serve's session header (x-session-id), which only session_affinity reads;
  4. the engines' metrics as Ray exports them (the pages `orch bench` and `orch status` read),
     scraped before and after the load: per replica the requests it finished
     (``vllm:request_success``) and its prefix-cache queries and hits (``vllm:prefix_cache_*``,
     tokens); the hit rate is hits / queries summed over the replicas.
Prints one JSON object: per router the hit rate, TTFT p50/p95, TPOT p50/p95, output tok/s and the
per-replica figures.

Routers: ``default`` (Serve LLM's RoundRobinRouter), ``session_affinity`` (ConsistentHashRouter on
the session header) and ``prefix_affinity``, Ray Serve LLM's PrefixCacheAffinityRouter, which orch
refuses to render (serve/routing.py): this benchmark writes it into orch's config itself to show
why. For it, Ray runs with RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1 (HAProxy then sends
LLMRouter the request body, which the router needs to see the prompt at all);
``--no-forward-body`` leaves it unset.

This is CPU (both engines share the machine's two cores): TTFT figures show the shape, not GPU
speed. The prefix-cache figures are the engines' own counters and mean the same on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bed_serving import served_on_bed  # noqa: E402

from orchestrator import engine_metrics as prom  # noqa: E402
from orchestrator.bench.session import BenchOptions, run_bench  # noqa: E402
from orchestrator.bench.target import discover_metrics_urls  # noqa: E402
from orchestrator.plan.tinymodel import build_tiny_model  # noqa: E402
from orchestrator.remote.connect import open_runners  # noqa: E402
from orchestrator.serve.desired import RolloutRequest  # noqa: E402
from orchestrator.serve.routing import PREFIX_CACHE_AFFINITY_ROUTER  # noqa: E402
from orchestrator.workflows.desired import desired_for_model  # noqa: E402
from orchestrator.workflows.rollout import RolloutOptions, execute  # noqa: E402
from tests.fixtures.serving import ServedTiny  # noqa: E402
from tests.testbed import TestbedFactory, check_capabilities  # noqa: E402

FORWARD_BODY = "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY"


def per_replica(before: str, after: str, model: str) -> dict[str, dict]:
    """Each replica's finished requests and prefix-cache queries/hits between two scrapes."""
    b, a = prom.parse_text(before), prom.parse_text(after)
    ids = sorted({s.label(prom.REPLICA_LABEL) for s in a if s.label(prom.REPLICA_LABEL) and "prefix_cache" in s.name})
    out = {}
    for rid in ids:
        where = {prom.REPLICA_LABEL: rid, prom.MODEL_LABEL: model}

        def delta(name: str, where=where) -> float:
            return (prom.counter(a, name, where) or 0.0) - (prom.counter(b, name, where) or 0.0)

        row = {"requests": delta(prom.REQUEST_SUCCESS), "queries": delta(prom.PREFIX_CACHE_QUERIES), "hits": delta(prom.PREFIX_CACHE_HITS)}
        if row["queries"] or row["requests"]:
            row["hit_rate"] = round(row["hits"] / row["queries"], 4) if row["queries"] else None
            out[rid] = row
    return out


def deploy(served: ServedTiny, router: str, args):
    """`orch rollout --replicas 2 --request-router ROUTER --allow-downtime`. orch refuses
    prefix_affinity (serve/routing.py); to measure what it would do, that variant is orch's
    default config with PrefixCacheAffinityRouter written into the LLMServer deployment."""
    fields = {"model": str(served.model_path), "served_name": "tiny", "replicas": 2, "max_model_len": args.max_model_len,
              "request_router": None if router == "prefix_affinity" else router}  # fmt: skip
    build = desired_for_model(served.manifest, RolloutRequest(**fields))

    def patched(nodes, cores):
        desired = build(nodes, cores)
        if router == "prefix_affinity":
            llm = desired.rendered.app["args"]["llm_configs"][0]
            llm["deployment_config"]["request_router_config"] = {"request_router_class": PREFIX_CACHE_AFFINITY_ROUTER}
        return desired

    return execute(served.manifest, patched, served.api_key, served.deps(), RolloutOptions(timeout_s=1200, allow_downtime=True))


def measure(served: ServedTiny, router: str, args, urls: list[str]) -> dict:
    t0 = time.monotonic()
    result = deploy(served, router, args)
    out: dict = {"rollout_s": round(time.monotonic() - t0, 1), "action": result.action, "revision": result.revision}
    common = {"base_url": served.endpoint, "model": "tiny", "api_key": served.api_key, "tokenizer": served.model_path, "warmup": 0,
              "output_tokens": args.output_tokens, "prompt_tokens": args.turn_tokens}  # fmt: skip
    run_bench(BenchOptions(**common, concurrency=(2,), requests=4, seed=1))  # warm-up: random prompts, nothing shared
    n = args.prefixes * args.turns
    bench, runs = run_bench(BenchOptions(**common, concurrency=(args.concurrency,), requests=n, seed=args.seed, metrics_urls=tuple(urls),
                                         workload="shared_prefix", prefixes=args.prefixes, prefix_tokens=args.prefix_tokens,
                                         settle_timeout_s=120))  # fmt: skip
    level, run = bench["levels"][0], runs[0]
    if args.pages:
        for when, page in (("before", run.metrics_before), ("after", run.metrics_after)):
            (Path(args.pages) / f"{router}-{when}.txt").write_text(page or "")
    replicas = per_replica(run.metrics_before or "", run.metrics_after or "", "tiny")
    queries = sum(r["queries"] for r in replicas.values())
    hits = sum(r["hits"] for r in replicas.values())
    out.update({
        "ok": level["succeeded"], "failed": level["failed"], "errors": level["errors"],
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "prefix_cache_queries": queries, "prefix_cache_hits": hits,
        "ttft_p50_ms": level["ttft_ms"]["p50"], "ttft_p95_ms": level["ttft_ms"]["p95"],
        "tpot_p50_ms": level["tpot_ms"]["p50"], "tpot_p95_ms": level["tpot_ms"]["p95"],
        "output_tok_s": level["output_tok_per_s"], "prompt_tokens": level.get("prompt_tokens"),
        "replicas": replicas,
    })  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", default="default,prefix_affinity,session_affinity")
    p.add_argument("--prefixes", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-forward-body", action="store_true")
    p.add_argument("--pages", help="Folder: keep the metrics pages scraped before and after each router's load.")
    args = p.parse_args()
    reason = check_capabilities()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    factory = TestbedFactory()
    work = Path(tempfile.mkdtemp(prefix="orch-prefix-routing-"))
    model = build_tiny_model(work / "models" / "tiny")
    out: dict = {"load": {k: v for k, v in vars(args).items() if k != "routers"}, "routers": {}}
    try:
        bed = factory.make(1)
        env = {"VLLM_CPU_KVCACHE_SPACE": "1", **({} if args.no_forward_body else {FORWARD_BODY: "1"})}
        with served_on_bed(bed, work, model, accelerator="cpu", ray={"num_cpus": 6}, env=env) as (cluster, served):
            manifest = cluster.manifest
            with open_runners(manifest, bed.known_hosts, nodes=[manifest.head.name]) as runners:
                urls = discover_metrics_urls(runners[manifest.head.name], manifest)
            out["metrics_urls"] = urls
            for router in args.routers.split(","):
                out["routers"][router] = measure(served, router, args, urls)
                print(json.dumps({router: out["routers"][router]}), file=sys.stderr, flush=True)
    finally:
        factory.close_all()
    rates = {r: v.get("prefix_cache_hit_rate") for r, v in out["routers"].items()}
    out["hit_rates"] = rates
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
