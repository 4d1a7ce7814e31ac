"""Serving overhead: bare vLLM vs Ray Serve LLM (as orch deploys it), same model, same load.

    .venv/bin/python benchmarks/serve_overhead.py [--rounds 3] [--variants orch]

Starts, on this machine, a bare ``python -m vllm.entrypoints.openai.api_server`` and one local
Ray cluster per Serve variant running the same tiny model through ``ray.serve.llm`` with the
config orch renders (``serve.config.render_app``, CPU layout, vLLM's api_key on). Both servers
are up at once and measured in alternating rounds (bare, serve, bare, serve, ...), so both see
the same cores (the idle one does not compete) and the same machine noise. Each round sends the
same load with orch's own load generator (``orchestrator.bench.loadgen``): 64 streamed completions of 64
output tokens (ignore_eos), 16 in flight. Prints one JSON object: per server the output tok/s and
TTFT p50/p95 of every round and their medians, and the ratios serve/bare.

Variants (the environment of `ray start`, i.e. the Serve controller/proxies/replicas):
  defaults  Ray Serve defaults (Python proxy -> OpenAiIngress replica -> LLMServer replica)
  haproxy   RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=1
  orch      haproxy + RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 (orch's default: ray_cluster.SERVE_ENV_DEFAULTS)
  nice0     orch's, with Ray's workers (the replica, the vLLM engine) at nice 0 instead of Ray's 15
The API key needs direct streaming (vLLM's own app): for defaults/haproxy it is left out.

Everything started is stopped at the end (process groups, then any process carrying this run's
marker in its environment). Ports are picked free; Ray gets its own temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.bench.latency import percentile  # noqa: E402
from orchestrator.bench.loadgen import ClientPool, Prompt, RequestSpec, run_concurrency  # noqa: E402

VARIANT_ENV = {
    "defaults": {},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "orch": None,  # ray_cluster.SERVE_ENV_DEFAULTS
    "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},  # added to orch's
    "omp": None,  # orch's, but OMP_NUM_THREADS = all the node's cores (orch's former setting)
    "raw1": None,  # orch's env but OMP_NUM_THREADS left to Ray (1 for the replica)
    "nice0": {"RAY_worker_niceness": "0"},  # orch's, with Ray's workers at nice 0 instead of 15
}
# Ray sets OMP_NUM_THREADS to an actor's CPU count (1 for the LLMServer replica) when it is not
# set; orch gives a CPU engine the node's cores but one (the other is left to vLLM's scheduler
# process and the front end); the "omp" variant measures what giving it every core changes.
DIRECT_STREAMING_VARIANTS = ("orch", "throughput", "omp", "raw1", "nice0")
MARK = "ORCH_SERVE_OVERHEAD_RUN"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, headers=None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5, headers=headers or {}).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def measure(base_url: str, key: str | None, args) -> dict:
    spec = RequestSpec(base_url=base_url, model="tiny", output_tokens=args.output_tokens, api_key=key, timeout_s=300, token_ids=False)
    prompts = [Prompt(f"Request {i}: the quick brown fox jumps over the lazy dog.") for i in range(args.requests)]

    async def run():
        async with ClientPool(spec) as pool:
            return await run_concurrency(pool, spec, prompts, args.concurrency, args.requests, time.monotonic)

    records, seconds = asyncio.run(run())
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    return {
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "seconds": round(seconds, 3),
        "output_tok_s": round(sum(r.output_tokens for r in ok) / seconds, 1) if seconds else 0.0,
        "ttft_p50_s": round(percentile(ttfts, 50), 4) if ttfts else None,
        "ttft_p95_s": round(percentile(ttfts, 95), 4) if ttfts else None,
    }


def start_bare(model: Path, port: int, env: dict, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
            "--max-model-len", "1024", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def start_serve(variant: str, model: Path, http_port: int, env: dict, workdir: Path, key: str | None) -> tuple[subprocess.Popen, str]:
    from orchestrator.cluster.ray_nodes import SERVE_ENV_DEFAULTS, node_resource
    from orchestrator.serve.client import ServeClient
    from orchestrator.serve.config import AppTarget, ServingPlan, deploy_body, render_app

    serve_env = dict(SERVE_ENV_DEFAULTS if variant in DIRECT_STREAMING_VARIANTS else VARIANT_ENV[variant])
    if variant in DIRECT_STREAMING_VARIANTS and VARIANT_ENV[variant]:
        serve_env.update(VARIANT_ENV[variant])
    ports = {k: free_port() for k in ("gcs", "dash", "client", "metrics", "stats", "fb_http", "fb_grpc", "agent", "agent_grpc")}
    env = {**env, **serve_env, "ORCH_SERVE_OVERHEAD_RAY": f"{env[MARK]}-{variant}", "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["metrics"]), "RAY_SERVE_HAPROXY_STATS_PORT": str(ports["stats"]),
           "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(ports["fb_http"]), "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(ports["fb_grpc"])}  # fmt: skip
    # Token auth like orch's clusters (and needed anyway: Ray turns it on by itself when
    # ~/.ray/auth_token exists): this run's own token file.
    token = secrets.token_hex(32)
    token_file = workdir / f"token-{variant}"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)})
    temp = workdir / f"ray-{variant}"
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(ports["gcs"]),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dash"]), "--ray-client-server-port", str(ports["client"]),
            "--dashboard-agent-listen-port", str(ports["agent"]), "--dashboard-agent-grpc-port", str(ports["agent_grpc"]),
            "--num-cpus", "8", "--temp-dir", str(temp), "--disable-usage-stats", "--resources", json.dumps({node_resource("bench"): 1000})]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=(workdir / f"ray-{variant}.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    dash = f"http://127.0.0.1:{ports['dash']}"
    wait_http(dash + "/api/version", 300, headers={"Authorization": f"Bearer {token}"})
    manifest = SimpleNamespace(accelerator="cpu", nodes=[SimpleNamespace(interface=None)], env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                               serve=SimpleNamespace(http_port=http_port, http_host="127.0.0.1"))  # fmt: skip
    # orch's render gives the engine the node's cores but one (OMP_NUM_THREADS); "raw1" keeps Ray's 1.
    cores = None if variant == "raw1" else (os.cpu_count() or 1)
    rendered = render_app(manifest, ServingPlan(tp=1, pp=1, max_model_len=1024), AppTarget("orch-r1", "/", "tiny", str(model)),
                          node_resource=node_resource, node_cores=cores)  # fmt: skip
    app = rendered.with_api_key(key) if key else rendered.app
    if not key:
        app["args"]["llm_configs"][0]["engine_kwargs"].pop("api_key")
    if variant == "omp":
        app["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    if variant not in DIRECT_STREAMING_VARIANTS:
        app["runtime_env"]["env_vars"].pop("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", None)
    with ServeClient(dash, token) as serve:
        serve.apply(deploy_body([app], manifest))
        deadline = time.monotonic() + 900
        while True:
            st = serve.status().app("orch-r1")
            if st is not None and st.status == "RUNNING":
                break
            if st is not None and st.failed:
                raise RuntimeError(f"Serve app failed: {st.message[-500:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("Serve app not RUNNING after 900 s")
            time.sleep(3)
    return proc, f"http://127.0.0.1:{http_port}"


def stop_all(procs: list[subprocess.Popen], marker: str) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(3)
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Ray workers and vLLM engine processes may sit in other process groups: the marker finds them.
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if marker.encode() in (pid_dir / "environ").read_bytes():
                os.kill(int(pid_dir.name), signal.SIGKILL)
        except (OSError, PermissionError):
            pass


def summarize(rounds: list[dict]) -> dict:
    def med(key):
        values = [r[key] for r in rounds if r.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    return {"rounds": rounds, "median_output_tok_s": med("output_tok_s"), "median_ttft_p50_s": med("ttft_p50_s"), "median_ttft_p95_s": med("ttft_p95_s")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--variants", default="orch", help="comma list of: " + ", ".join(VARIANT_ENV))
    parser.add_argument("--keep-logs", action="store_true", help="keep the server logs and Ray temp dirs (printed as workdir)")
    args = parser.parse_args()

    from orchestrator.plan.tinymodel import build_tiny_model

    model = build_tiny_model()
    marker = secrets.token_hex(8)
    env = {**os.environ, MARK: marker, "VLLM_CPU_KVCACHE_SPACE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    workdir = Path(tempfile.mkdtemp(prefix="orch-overhead-"))
    key = "bench-" + secrets.token_hex(16)
    procs: list[subprocess.Popen] = []
    out: dict = {"load": {"requests": args.requests, "output_tokens": args.output_tokens, "concurrency": args.concurrency, "ignore_eos": True},
                 "cpus": os.cpu_count(), "model": "tiny (orchestrator.plan.tinymodel)", "variants": {}}  # fmt: skip
    try:
        bare_port = free_port()
        procs.append(start_bare(model, bare_port, env, workdir / "bare.log"))
        bare_url = f"http://127.0.0.1:{bare_port}"
        wait_http(bare_url + "/health", 600)
        for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
            vkey = key if variant in DIRECT_STREAMING_VARIANTS else None
            proc, serve_url = start_serve(variant, model, free_port(), env, workdir, vkey)
            procs.append(proc)
            measure(bare_url, None, argparse.Namespace(**{**vars(args), "requests": 16}))  # warm-up both
            measure(serve_url, vkey, argparse.Namespace(**{**vars(args), "requests": 16}))
            bare_rounds, serve_rounds = [], []
            for _ in range(args.rounds):
                bare_rounds.append(measure(bare_url, None, args))
                serve_rounds.append(measure(serve_url, vkey, args))
            bare, serve = summarize(bare_rounds), summarize(serve_rounds)
            ratio = {
                "output_tok_s": round(serve["median_output_tok_s"] / bare["median_output_tok_s"], 3) if bare["median_output_tok_s"] else None,
                "ttft_p95": round(serve["median_ttft_p95_s"] / bare["median_ttft_p95_s"], 3) if bare["median_ttft_p95_s"] else None,
            }
            out["variants"][variant] = {"bare": bare, "serve": serve, "ratio_serve_over_bare": ratio,
                                        "targets_met": bool(ratio["output_tok_s"] and ratio["output_tok_s"] >= 0.9 and ratio["ttft_p95"] and ratio["ttft_p95"] <= 1.2)}  # fmt: skip
            # One Serve cluster at a time: stop this one before the next variant.
            stop_all([proc], f"ORCH_SERVE_OVERHEAD_RAY={marker}-{variant}")
            procs.remove(proc)
    finally:
        stop_all(procs, f"{MARK}={marker}")
        if args.keep_logs:
            out["workdir"] = str(workdir)
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
