"""Request routers under the same shared-prefix load: vLLM's prefix-cache hit rate and TTFT (needs root).

    .venv/bin/python benchmarks/prefix_routing.py [--routers default,session_affinity] [--replicas 2]
        [--prefixes 16] [--turns 4] [--prefix-tokens 1024] [--turn-tokens 32] [--output-tokens 16]
        [--concurrency 4] [--pages DIR] [--smoke]

Makes a 1-host test bed (a network namespace with its own sshd; see docs/remote-and-testbed.md),
brings it up with orch's `up` workflow (6 logical CPUs: two replicas fit, a second copy of them
does not, so each router is deployed in place), and for each router in turn:
  1. `orch rollout --replicas 2 --request-router R --allow-downtime` of the tiny model (two CPU
     engines, fresh: no prefix is cached when the load starts; the same engine settings as the
     suite's test engines, tests/fixtures/serving.py);
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

Routers: the ones `orch rollout --request-router` offers (serve/routing.py). ``default``: orch's
builder, no LLMRouter; HAProxy balances over the LLMServer replicas' own ports (leastconn).
``session_affinity``: Serve LLM's builder with LLMRouter asking Ray Serve's ConsistentHashRouter,
keyed on the session header. Ray Serve LLM's PrefixCacheAffinityRouter is not offered and not
measured: behind orch's ingress (HAProxy, direct streaming) LLMRouter picks replicas with
``choose_replica(..., _reserve=False)``, a path that never calls the router's
``on_request_routed``, the only place it learns which replica holds which prompt (Ray 2.60:
ray/serve/_private/router.py, ray/llm/_internal/serve/core/ingress/router.py), so every pick
falls to the same replica; configured on the ingress deployment without LLMRouter, Serve refuses
it outright when HAProxy is on.

--smoke: the smallest run (session_affinity only, one replica, a few short requests): one engine
start; the suite runs it (tests/integration/test_benchmark_smokes.py) so that a product change
that breaks this script fails the day it lands.

This is CPU (both engines share the machine's two cores): TTFT figures show the shape, not GPU
speed. The prefix-cache figures are the engines' own counters and mean the same on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
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
from orchestrator.bench.session import BenchOptions, multi_scraper, run_bench  # noqa: E402
from orchestrator.bench.target import discover_metrics_urls  # noqa: E402
from orchestrator.plan.tinymodel import build_tiny_model  # noqa: E402
from orchestrator.remote.connect import open_runners  # noqa: E402
from orchestrator.serve.desired import RolloutRequest  # noqa: E402
from orchestrator.serve.routing import REFUSED, REQUEST_ROUTER_CLASSES  # noqa: E402
from orchestrator.workflows.desired import desired_for_model  # noqa: E402
from orchestrator.workflows.rollout import RolloutOptions, execute  # noqa: E402
from tests.fixtures.serving import ENGINE_DEFAULTS, TEST_KV_CACHE_GIB, ServedTiny  # noqa: E402
from tests.testbed import TestbedFactory, check_capabilities  # noqa: E402

WARMUP_REQUESTS = 4
# One engine, one request at a time: each prompt's second turn finds its 256-token prefix (two
# whole blocks of vLLM's CPU block size, 128) in the cache.
SMOKE = {"routers": "session_affinity", "replicas": 1, "prefixes": 2, "turns": 2, "prefix_tokens": 256, "turn_tokens": 8,
         "output_tokens": 4, "concurrency": 1}  # fmt: skip


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
    """`orch rollout --replicas N --request-router ROUTER --allow-downtime` (the workflow)."""
    request = RolloutRequest(model=str(served.model_path), served_name="tiny", replicas=args.replicas, max_model_len=args.max_model_len,
                             request_router=router, kv_cache_gib=TEST_KV_CACHE_GIB, **ENGINE_DEFAULTS)  # fmt: skip
    build = desired_for_model(served.manifest, request)
    return execute(served.manifest, build, served.api_key, served.deps(), RolloutOptions(timeout_s=1200, allow_downtime=True))


def wait_for_counters(scrape, urls: list[str], before: str, expected: int, timeout_s: float) -> str:
    """Scrape until the engines' per-replica counters on the metrics pages count ``expected`` more
    finished requests than ``before``. Ray exports a new engine's metrics late (seen here: none on
    the page minutes after the replicas answered their first requests), and orch bench's settle
    step takes a page without vLLM metrics as nothing to wait for: the first router's "before"
    page then lacked the engines (its warm-up counted as its load) or its "after" page did (no
    per-replica figures at all)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = asyncio.run(scrape())
        counted = sum(r["requests"] for r in per_replica(before, page, "tiny").values())
        if counted >= expected:
            return page
        if time.monotonic() > deadline:
            raise RuntimeError(f"the engines' metrics pages did not count the {expected} warm-up requests in {timeout_s:.0f} s "
                               f"(counted {counted:g}); pages: {', '.join(urls)}")  # fmt: skip
        time.sleep(1.0)


def measure(served: ServedTiny, router: str, args, urls_before: list[str], discover) -> dict:
    t0 = time.monotonic()
    result = deploy(served, router, args)
    out: dict = {"rollout_s": round(time.monotonic() - t0, 1), "action": result.action, "revision": result.revision}
    urls = discover() or urls_before  # after the rollout: every node's export address is listed by now
    common = {"base_url": served.endpoint, "model": "tiny", "api_key": served.api_key, "tokenizer": served.model_path, "warmup": 0,
              "output_tokens": args.output_tokens, "prompt_tokens": args.turn_tokens}  # fmt: skip
    # warm-up: random prompts, nothing shared (the engines' first requests are slow); then wait
    # until the pages count it, so that the load's "before" page holds every engine's counters
    scrape = multi_scraper(urls, served.api_key, key_origin=served.endpoint)
    before = asyncio.run(scrape())
    warm, _ = run_bench(BenchOptions(**common, concurrency=(2,), requests=WARMUP_REQUESTS, seed=1))
    wait_for_counters(scrape, urls, before, warm["levels"][0]["succeeded"], 180)
    n = args.prefixes * args.turns
    bench, runs = run_bench(BenchOptions(**common, concurrency=(args.concurrency,), requests=n, seed=args.seed, metrics_urls=tuple(urls),
                                         workload="shared_prefix", prefixes=args.prefixes, prefix_tokens=args.prefix_tokens,
                                         settle_timeout_s=180))  # fmt: skip
    level, run = bench["levels"][0], runs[0]
    if args.pages:
        for when, page in (("before", run.metrics_before), ("after", run.metrics_after)):
            (Path(args.pages) / f"{router}-{when}.txt").write_text(page or "")
    replicas = per_replica(run.metrics_before or "", run.metrics_after or "", "tiny")
    queries = sum(r["queries"] for r in replicas.values())
    hits = sum(r["hits"] for r in replicas.values())
    counted = sum(r["requests"] for r in replicas.values())
    out.update({
        "ok": level["succeeded"], "failed": level["failed"], "errors": level["errors"],
        "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
        "prefix_cache_queries": queries, "prefix_cache_hits": hits,
        "ttft_p50_ms": level["ttft_ms"]["p50"], "ttft_p95_ms": level["ttft_ms"]["p95"],
        "tpot_p50_ms": level["tpot_ms"]["p50"], "tpot_p95_ms": level["tpot_ms"]["p95"],
        "output_tok_s": level["output_tok_per_s"], "prompt_tokens": level.get("prompt_tokens"),
        # the engines' own count of the load's requests: equal to "ok" when the figures are this load's, all of it
        "counted_requests": counted, "replicas": replicas, "metrics_urls": urls,
    })  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--routers", default="default,session_affinity", help="comma-separated: " + ", ".join(REQUEST_ROUTER_CLASSES))
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--prefixes", type=int, default=16)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--turn-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pages", help="Folder: keep the metrics pages scraped before and after each router's load.")
    p.add_argument("--smoke", action="store_true", help="the smallest run: " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    args = p.parse_args()
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    for router in routers:
        if router in REFUSED or router not in REQUEST_ROUTER_CLASSES:
            why = REFUSED[router][0] if router in REFUSED else "unknown request router"
            print(f"error: --routers: {router}: {why}\nhint: use " + " or ".join(REQUEST_ROUTER_CLASSES), file=sys.stderr)
            return 2
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
        with served_on_bed(bed, work, model, accelerator="cpu", ray={"num_cpus": 6}) as (cluster, served):
            manifest = cluster.manifest

            def discover() -> list[str]:
                with open_runners(manifest, bed.known_hosts, nodes=[manifest.head.name]) as runners:
                    return discover_metrics_urls(runners[manifest.head.name], manifest)

            urls = discover()
            for router in routers:
                out["routers"][router] = measure(served, router, args, urls, discover)
                print(json.dumps({router: out["routers"][router]}), file=sys.stderr, flush=True)
    finally:
        factory.close_all()
    rates = {r: v.get("prefix_cache_hit_rate") for r, v in out["routers"].items()}
    out["hit_rates"] = rates
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
