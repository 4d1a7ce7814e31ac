"""Serving overhead: bare vLLM vs Ray Serve LLM (as orch deploys it), same model, same load.

    ip netns add orch-so-bench && ip netns exec orch-so-bench ip link set lo up
    ip netns exec orch-so-bench .venv/bin/python benchmarks/serve_overhead.py [--rounds 7]
        [--levels 16,64,128] [--variants orch,llmrouter] [--replica] [--cpu]
    ip netns del orch-so-bench

(In a network namespace of its own: it binds ports for Ray, HAProxy and vLLM.)

Starts, on this machine, a bare ``python -m vllm.entrypoints.openai.api_server`` and one local
Ray cluster per Serve variant running the same tiny model through ``ray.serve.llm`` with the
config orch renders (``serve.config.render_app``, CPU layout, vLLM's api_key on). Both servers
are up at once and measured in alternating rounds, so both see the same cores (the idle one does
not compete) and the same machine noise. Each measurement first waits until the engine
processes of both servers are quiet (``settle``: vLLM's workers spin for 1 s after their last
request). One round runs every concurrency level (16, 64, 128 by default) against each
endpoint, bare first in even rounds and Serve first in odd ones. Each measurement sends
``max(64, 2 x level)`` streamed completions of 64 output tokens (ignore_eos, short prompts) with
orch's own load generator (``orchestrator.bench.loadgen``), ``level`` in flight. Prints one JSON
object: per variant and level, per endpoint the output tok/s, TTFT p50 and p95 and the time to
the response headers of every round, their medians, the ratios serve/bare and whether the
issue's targets hold (>= 0.9x tok/s, <= 1.2x TTFT p50 and p95).

Where the time goes:
  --replica  also measures the Serve replica's own HTTP port (vLLM's app inside the LLMServer
             replica), skipping HAProxy and the request router: serve - replica is their cost.
  --cpu      CPU seconds per process role (bare API server, engine, Serve replica, router,
             HAProxy, Ray's own processes, this client) for every measurement, from /proc.
  --router   during each Serve measurement, asks Serve LLM's router for a replica every 0.25 s
             the way HAProxy does before every request, and reports that hop's latency.
The processes' nice values are always reported (``ps -o ni``: Ray starts its workers at nice 15).

Variants (the environment of `ray start`, i.e. the Serve controller/proxies/replicas):
  orch      orch's settings (cluster.ray_nodes.SERVE_ENV_DEFAULTS + the rendered runtime env)
  defaults  Ray Serve defaults (Python proxy -> OpenAiIngress replica -> LLMServer replica)
  haproxy   RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=1, no direct streaming
  nice15    orch's, with Ray's workers at Ray's default nice 15 (RAY_worker_niceness=15)
  nice0     orch's, with RAY_worker_niceness=0
  throughput  orch's + RAY_SERVE_THROUGHPUT_OPTIMIZED=1
  oneloop   orch's, with user code and Serve's router on the replica's own event loop
            (RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0, RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0)
  nice0oneloop  both of the above
  omp       orch's, but OMP_NUM_THREADS = all the node's cores (orch's former setting)
  llmrouter orch's, but Serve LLM's build_openai_app: HAProxy asks LLMRouter for a replica before
            every POST (orch's default before its own builder, serve/node_hooks.py)
  hapthreads  orch's, HAProxy with one thread per core (RAY_SERVE_HAPROXY_NBTHREAD; Ray's default 4)
  hapnometrics  orch's, without HAProxy's per-request metrics log (RAY_SERVE_HAPROXY_METRICS_ENABLED=0)
  hapnice0  orch's, with HAProxy's processes moved to nice 0 before every measurement (Ray starts
            them at its workers' 15; root only)
  bind      orch's, but vLLM's own OpenMP binding for the engine (VLLM_CPU_OMP_THREADS_BIND left unset)
  noaccesslog  orch's, with Serve's per-request access log off in the replica (logging_config)
  twomodels orch's, serving two models as `orch rollout --served-name` does (the same tiny model
            again as 'tiny-b' on its own route, and orch's front on /v1, serve/front.py): the
            load's requests for 'tiny' go through the front's Python hop (OpenAiIngress, a Serve
            handle to tiny's engine deployment); the second engine is idle
The API key needs direct streaming (vLLM's own app): for defaults/haproxy it is left out.

Servers already running: ``--bare-url URL --serve-url URL [--api-key-env VAR]`` measures those two
endpoints (the same model behind each, served as ``tiny``) the same way, and starts and stops
nothing; --replica, --router, --cpu and the engines' settle need the processes this script
starts and are off there. The suite's smoke run uses it on its own bare vLLM server and served
model (tests/integration/test_benchmark_smokes.py).

Everything started is stopped at the end (process groups, then any process carrying this run's
marker in its environment). Ports are picked free; Ray and HAProxy get their own temp dirs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.bench.latency import percentile  # noqa: E402
from orchestrator.bench.loadgen import ClientPool, Prompt, RequestSpec, run_concurrency  # noqa: E402
from orchestrator.manifest.sections import RAY_TEMP_DIR_MAX_BYTES  # noqa: E402

# Extra environment of `ray start` per variant; None: orch's own (SERVE_ENV_DEFAULTS) alone.
VARIANT_ENV: dict[str, dict | None] = {
    "orch": None,
    "defaults": {},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "nice15": {"RAY_worker_niceness": "15"},
    "nice0": {"RAY_worker_niceness": "0"},
    "throughput": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    "oneloop": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"},
    "nice0oneloop": {"RAY_worker_niceness": "0", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
                     "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0"},
    "omp": None,
    "llmrouter": None,
    "hapthreads": {"RAY_SERVE_HAPROXY_NBTHREAD": str(os.cpu_count() or 1)},
    "hapnometrics": {"RAY_SERVE_HAPROXY_METRICS_ENABLED": "0"},
    "bind": None,
    "hapnice0": None,
    "noaccesslog": None,
    "twomodels": None,
}
SECOND_MODEL = "tiny-b"  # the twomodels variant's second served name
NOT_ORCH_BASED = ("defaults", "haproxy")  # variants that replace orch's env instead of adding to it
MARK = "ORCH_SERVE_OVERHEAD_RUN"
# --fast-start (the suite's smoke run): both engines eager (no torch.compile) with a 0.25 GiB KV
# cache, the test engines' settings (tests/fixtures/serving.py, docs/testing.md): about 40 s less
# per engine start. Their figures are not comparable with the default runs'.
FAST_KV_CACHE_BYTES = 1 << 28
TARGET_TOK_S, TARGET_TTFT = 0.9, 1.2
# vLLM's CPU backend batches 128 sequences per worker for its API server (vllm/engine/arg_utils.py
# get_batch_defaults; Serve LLM starts the engine with that usage context): what orch's plan says.
CPU_MAX_NUM_SEQS = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, headers=None, proc: subprocess.Popen | None = None) -> bool:
    """True once ``url`` answers; False when ``proc`` exits first."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5, headers=headers or {}).status_code < 500:
                return True
        except httpx.HTTPError:
            pass
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


# ---- processes: roles, nice values, CPU time -------------------------------------------------


def _proc(pid: str) -> tuple[str, int, float] | None:
    """(cmdline, nice, CPU seconds) of a process, None when it is gone."""
    try:
        cmd = (Path("/proc") / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = (Path("/proc") / pid / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return cmd, int(fields[16]), (int(fields[11]) + int(fields[12])) / ticks


def role_of(cmd: str, group: str) -> str:
    """vLLM names its processes (VLLM::EngineCore, the scheduler; VLLM::Worker, the model runner
    of the mp executor); Ray names its workers after the actor (ray::ServeReplica:APP:DEPLOYMENT)."""
    engine = "engine worker" if "VLLM::Worker" in cmd else "engine core" if "EngineCore" in cmd else None
    if group == "bare":
        return f"bare {engine}" if engine else "bare API server"
    if engine:
        return f"Serve {engine}"
    for needle, role in (("haproxy", "HAProxy"), ("LLMRouter", "Serve router"), ("OrchFront", "orch front"), ("ServeReplica", "Serve replica"),
                         ("raylet", "raylet"), ("gcs_server", "GCS")):  # fmt: skip
        if needle in cmd:
            return role
    return "other Ray processes"


def processes(bare_pgid: int, serve_marker: str | None) -> dict[str, tuple[str, int, float]]:
    """pid -> (role, nice, CPU s) of the bare server's group, this variant's Ray processes and this client."""
    out: dict[str, tuple[str, int, float]] = {}
    me = str(os.getpid())
    for pid_dir in Path("/proc").iterdir():
        pid = pid_dir.name
        if not pid.isdigit():
            continue
        group = None
        if pid == me:
            group = "client"
        else:
            try:
                if os.getpgid(int(pid)) == bare_pgid:
                    group = "bare"
                elif serve_marker and serve_marker.encode() in (pid_dir / "environ").read_bytes():
                    group = "serve"
            except OSError:
                continue
        info = _proc(pid) if group else None
        if info is not None:
            out[pid] = ("load generator (this client)" if group == "client" else role_of(info[0], group), info[1], info[2])
    return out


def cpu_by_role(before: dict, after: dict) -> dict[str, float]:
    roles: dict[str, float] = {}
    for pid, (role, _, cpu) in after.items():
        roles[role] = roles.get(role, 0.0) + cpu - (before[pid][2] if pid in before else 0.0)
    return {r: round(s, 2) for r, s in sorted(roles.items())}


def nice_by_role(table: dict) -> dict[str, list[int]]:
    roles: dict[str, set[int]] = {}
    for role, nice, _ in table.values():
        roles.setdefault(role, set()).add(nice)
    return {r: sorted(n) for r, n in sorted(roles.items())}


# ---- servers ---------------------------------------------------------------------------------


def start_bare(model: Path, port: int, env: dict, log: Path, fast: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
            "--max-model-len", "1024", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    if fast:  # VLLM_CPU_KVCACHE_SPACE, when set, replaces the byte count (vllm/platforms/cpu.py)
        argv += ["--enforce-eager", "--kv-cache-memory-bytes", str(FAST_KV_CACHE_BYTES)]
        env = {k: v for k, v in env.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    return subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def serve_env_for(variant: str) -> dict[str, str]:
    from orchestrator.cluster.ray_nodes import NODE_DEATH_ENV_DEFAULTS, SERVE_ENV_DEFAULTS

    if variant in NOT_ORCH_BASED:
        return dict(VARIANT_ENV[variant] or {})
    return {**SERVE_ENV_DEFAULTS, **NODE_DEATH_ENV_DEFAULTS, **(VARIANT_ENV[variant] or {})}


def start_serve(variant: str, model: Path, http_port: int, env: dict, workdir: Path, key: str | None,
                fast: bool = False) -> tuple[subprocess.Popen, str]:  # fmt: skip
    from orchestrator.cluster.ray_nodes import node_resource
    from orchestrator.serve import node_hooks
    from orchestrator.serve.config import (
        IMPORT_PATH,
        ROUTER_DEPLOYMENT,
        AppTarget,
        ServeDefaults,
        ServingPlan,
        deploy_body,
        render_app,
    )
    from orchestrator.serve.ray_io.client import ServeApiError, ServeClient

    ports = {k: free_port() for k in ("gcs", "dash", "client", "metrics", "stats", "fb_http", "fb_grpc", "agent", "agent_grpc")}
    haproxy_dir = haproxy_dir_for(workdir, variant)
    env = {**env, **serve_env_for(variant), "ORCH_SERVE_OVERHEAD_RAY": f"{env[MARK]}-{variant}",
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["metrics"]), "RAY_SERVE_HAPROXY_STATS_PORT": str(ports["stats"]),
           "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(ports["fb_http"]), "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(ports["fb_grpc"]),
           "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(haproxy_dir / "haproxy.cfg"),
           "RAY_SERVE_HAPROXY_SOCKET_PATH": str(haproxy_dir / "admin.sock"),
           "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(haproxy_dir), "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(haproxy_dir / "server-state")}  # fmt: skip
    # Token auth like orch's clusters (and needed anyway: Ray turns it on by itself when
    # ~/.ray/auth_token exists): this run's own token file.
    token = secrets.token_hex(32)
    token_file = workdir / f"token-{variant}"
    token_file.write_text(token)
    token_file.chmod(0o600)
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)})
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(ports["gcs"]),
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dash"]), "--ray-client-server-port", str(ports["client"]),
            "--dashboard-agent-listen-port", str(ports["agent"]), "--dashboard-agent-grpc-port", str(ports["agent_grpc"]),
            "--num-cpus", "8", "--temp-dir", str(ray_dir_for(workdir, variant)), "--disable-usage-stats",
            "--resources", json.dumps({node_resource("bench"): 1000})]  # fmt: skip
    dash = f"http://127.0.0.1:{ports['dash']}"
    for attempt in range(3):
        # `ray start` gives its raylet a fixed 30 s to register with the GCS (ray/_private/node.py):
        # on a machine shared by other sessions' engines it sometimes misses that; start again.
        log = (workdir / f"ray-{variant}-{attempt}.log").open("w")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        if wait_http(dash + "/api/version", 300, headers={"Authorization": f"Bearer {token}"}, proc=proc):
            break
        stop_all([proc], env["ORCH_SERVE_OVERHEAD_RAY"])
        shutil.rmtree(ray_dir_for(workdir, variant), ignore_errors=True)
    else:
        raise RuntimeError(f"ray start failed 3 times: see {workdir}/ray-{variant}-*.log")
    manifest = SimpleNamespace(name=f"serve-overhead-{variant}", accelerator="cpu", nodes=[SimpleNamespace(interface=None)],
                               env={"VLLM_CPU_KVCACHE_SPACE": "1"}, serve=SimpleNamespace(http_port=http_port, http_host="127.0.0.1"))  # fmt: skip
    # orch's render gives the engine the node's cores but one (OMP_NUM_THREADS), and Serve the
    # engine's batch with headroom (max_ongoing_requests).
    plan = ServingPlan(tp=1, pp=1, max_model_len=1024, max_num_seqs=CPU_MAX_NUM_SEQS)
    rendered = render_app(manifest, plan, AppTarget("orch-r1", "/", "tiny", str(model)), node_resource=node_resource, node_cores=os.cpu_count() or 1)
    app = rendered.with_api_key(key) if key else rendered.app
    if not key:
        app["args"]["llm_configs"][0]["engine_kwargs"].pop("api_key")
    # orch's module (its builder and its callback) where `orch up` would put it on a node: this
    # run's own folder, first on the application's PYTHONPATH.
    hooks = workdir / f"hooks-{variant}"
    hooks.mkdir(exist_ok=True)
    (hooks / f"{node_hooks.MODULE}.py").write_text(node_hooks.source())
    app["runtime_env"]["env_vars"]["PYTHONPATH"] = str(hooks)
    if variant == "llmrouter":  # Serve LLM's builder, with the router override render_app gives it
        defaults = ServeDefaults()
        app["import_path"] = IMPORT_PATH
        app["deployments"] = [{"name": ROUTER_DEPLOYMENT, "max_surge_percent": defaults.max_surge_percent,
                               "graceful_shutdown_wait_loop_s": defaults.router_drain_s,
                               "graceful_shutdown_timeout_s": defaults.graceful_shutdown_timeout_s}]  # fmt: skip
    if fast:  # eager, and the cache as bytes (the variable would replace them, in the engine's env and Ray's)
        app["args"]["llm_configs"][0]["engine_kwargs"].update(enforce_eager=True, kv_cache_memory_bytes=FAST_KV_CACHE_BYTES)
        app["runtime_env"]["env_vars"].pop("VLLM_CPU_KVCACHE_SPACE", None)
    if variant == "bind":  # vLLM's own thread binding (auto: the engine worker pinned to cores but one)
        app["runtime_env"]["env_vars"].pop("VLLM_CPU_OMP_THREADS_BIND")
    if variant == "noaccesslog":  # no access-log line per request in the replica
        app["logging_config"] = {"enable_access_log": False}
    if variant == "omp":
        app["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    if variant in NOT_ORCH_BASED:
        app["runtime_env"]["env_vars"].pop("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", None)
        app["import_path"] = IMPORT_PATH  # orch's builder needs direct streaming
        app.pop("deployments", None)  # LLMRouter exists under direct streaming only
    apps = [app] + (two_models(app, key, hooks) if variant == "twomodels" else [])
    with ServeClient(dash, token, timeout=300) as serve:  # a loaded machine answers the PUT slowly
        for attempt in range(3):
            try:  # the PUT is declarative: sending it again is harmless
                serve.apply(deploy_body(apps, manifest))
                break
            except ServeApiError:
                if attempt == 2:
                    raise
                wait_http(dash + "/api/version", 300, headers={"Authorization": f"Bearer {token}"}, proc=proc)
        deadline = time.monotonic() + 900
        while True:
            states = [serve.status().app(a["name"]) for a in apps]
            if all(st is not None and st.status == "RUNNING" for st in states):
                break
            failed = [st for st in states if st is not None and st.failed]
            if failed:
                raise RuntimeError(f"Serve app failed: {failed[0].message[-500:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("Serve app not RUNNING after 900 s")
            time.sleep(3)
    return proc, f"http://127.0.0.1:{http_port}"


def two_models(first: dict, key: str | None, hooks: Path) -> list[dict]:
    """The applications orch adds for a second model beside ``first`` (the public one on ``/``):
    the same config as its own application on its own route (``decisions.public_app_name``,
    ``model_route``), and orch's front on ``/v1`` with a handle to each engine deployment (what
    ``workflows/front_steps.settle_front`` leaves running)."""
    from orchestrator.serve.decisions import PUBLIC_APP, model_route, public_app_name
    from orchestrator.serve.front import FRONT_ROUTE, front_app
    from orchestrator.serve.shapes import engine_deployment_name, model_id_of

    second = copy.deepcopy(first)
    second["name"] = public_app_name(SECOND_MODEL, {PUBLIC_APP})  # the first model holds orch's first name
    second["route_prefix"] = model_route(SECOND_MODEL, {first["route_prefix"]})
    second["args"]["llm_configs"][0]["model_loading_config"]["model_id"] = SECOND_MODEL
    models = {model_id_of(first): (first["name"], engine_deployment_name(first)), SECOND_MODEL: (second["name"], engine_deployment_name(second))}
    front = front_app("serve-overhead", models, FRONT_ROUTE, **({"api_key": key} if key else {}))
    front["runtime_env"]["env_vars"]["PYTHONPATH"] = str(hooks)
    return [second, front]


def ray_dir_for(workdir: Path, variant: str) -> Path:
    """Ray's temp dir for a variant: short (``r<index>``). Under a longer one (``ray-hapnometrics``,
    44 bytes) Ray's dashboard socket paths passed the 107-byte AF_UNIX limit and `ray start` failed
    with "Module MetricsHead failed to start" (docs/manifest.md, ray.temp_dir)."""
    path = workdir / f"r{list(VARIANT_ENV).index(variant)}"
    if len(str(path).encode()) > RAY_TEMP_DIR_MAX_BYTES:
        raise RuntimeError(f"{path} is over {RAY_TEMP_DIR_MAX_BYTES} bytes: Ray's sockets under it would not fit")
    return path


def haproxy_dir_for(workdir: Path, variant: str) -> Path:
    """A short folder for HAProxy's files: Ray puts them under <folder>/<node id>/ and HAProxy
    refuses an admin socket path over 97 bytes. A link in the workdir points at it."""
    link = workdir / f"haproxy-{variant}"
    if not link.exists():
        link.symlink_to(tempfile.mkdtemp(prefix="hp", dir="/tmp"))
    return link.resolve()


def replica_url(workdir: Path, variant: str) -> str | None:
    """The LLMServer replica's own HTTP port, from the HAProxy config Ray wrote (its backend's
    ``server NAME HOST:PORT check`` lines; the fallback proxy is the ``backup`` one)."""
    for cfg in haproxy_dir_for(workdir, variant).glob("*/haproxy.cfg"):
        for match in re.finditer(r"^\s*server (\S+) ([\d.]+):(\d+) check(?!.*backup)", cfg.read_text(), re.M):
            return f"http://{match.group(2)}:{match.group(3)}"
    return None


def router_address(workdir: Path, variant: str) -> tuple[str, int] | None:
    """Serve LLM's LLMRouter, from the Lua script Ray wrote for HAProxy (its ROUTERS table)."""
    for lua in haproxy_dir_for(workdir, variant).glob("*/ingress_request_router.lua"):
        match = re.search(r'host = "([^"]+)", port = (\d+)', lua.read_text())
        if match:
            return match.group(1), int(match.group(2))
    return None


class RouterProbe(threading.Thread):
    """Asks the router for a replica every 0.25 s the way HAProxy's Lua does for each request
    (a new connection, ``POST /internal/route`` HTTP/1.0, empty body, read to EOF); keeps the
    latency of each answer."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.address, self.latencies, self.errors = address, [], 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        host, port = self.address
        request = (f"POST /internal/route HTTP/1.0\r\nHost: {host}:{port}\r\nConnection: close\r\n"
                   "Content-Type: application/json\r\nContent-Length: 0\r\n\r\n").encode()  # fmt: skip
        while not self._stop_event.wait(0.25):
            t0 = time.perf_counter()
            try:
                with socket.create_connection(self.address, timeout=10) as sock:
                    sock.sendall(request)
                    answer = b""
                    while chunk := sock.recv(65536):
                        answer += chunk
                ok = answer.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))
            except OSError:
                ok = False
            if ok:
                self.latencies.append(time.perf_counter() - t0)
            else:
                self.errors += 1

    def result(self) -> dict:
        self._stop_event.set()
        self.join()
        lat = self.latencies
        return {"count": len(lat), "errors": self.errors, "p50_ms": round(percentile(lat, 50) * 1000, 1) if lat else None,
                "p95_ms": round(percentile(lat, 95) * 1000, 1) if lat else None}  # fmt: skip


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


# ---- measurement -----------------------------------------------------------------------------


def measure(base_url: str, key: str | None, concurrency: int, requests: int, output_tokens: int) -> dict:
    spec = RequestSpec(base_url=base_url, model="tiny", output_tokens=output_tokens, api_key=key, timeout_s=300, token_ids=False)
    prompts = [Prompt(f"Request {i}: the quick brown fox jumps over the lazy dog.") for i in range(requests)]

    async def run():
        async with ClientPool(spec) as pool:
            return await run_concurrency(pool, spec, prompts, concurrency, requests, time.monotonic)

    records, seconds = asyncio.run(run())
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    heads = [r.headers_at for r in ok if r.headers_at is not None]

    def pct(values, q):
        return round(percentile(values, q), 4) if values else None

    return {
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "seconds": round(seconds, 3),
        "output_tok_s": round(sum(r.output_tokens for r in ok) / seconds, 1) if seconds else 0.0,
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p95_s": pct(ttfts, 95),
        "headers_p50_s": pct(heads, 50),
        # what the failed requests got (the first distinct answers), so a failed run says why
        "errors": sorted({str(r.error)[:300] for r in records if not r.ok})[:3],
    }


def summarize(rounds: list[dict]) -> dict:
    def med(key):
        values = [r[key] for r in rounds if r.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    out = {k: med(k) for k in ("output_tok_s", "ttft_p50_s", "ttft_p95_s", "headers_p50_s")}
    out["failed"] = sum(r["failed"] for r in rounds)
    routed = [r["router"] for r in rounds if r.get("router", {}).get("count")]
    if routed:
        out["router_p50_ms"] = round(statistics.median(r["p50_ms"] for r in routed), 1)
        out["router_p95_ms"] = round(statistics.median(r["p95_ms"] for r in routed), 1)
    if any("cpu_s" in r for r in rounds):
        roles = sorted({role for r in rounds for role in r.get("cpu_s", {})})
        out["cpu_s"] = {role: round(statistics.median(r.get("cpu_s", {}).get(role, 0.0) for r in rounds), 2) for role in roles}
    out["rounds"] = rounds
    return out


def ratios(serve: dict, bare: dict) -> dict:
    def ratio(key):
        return round(serve[key] / bare[key], 3) if serve.get(key) and bare.get(key) else None

    r = {"output_tok_s": ratio("output_tok_s"), "ttft_p50": ratio("ttft_p50_s"), "ttft_p95": ratio("ttft_p95_s")}
    r["targets_met"] = bool(r["output_tok_s"] and r["output_tok_s"] >= TARGET_TOK_S and r["ttft_p50"] and r["ttft_p50"] <= TARGET_TTFT
                            and r["ttft_p95"] and r["ttft_p95"] <= TARGET_TTFT and not serve["failed"])  # fmt: skip
    return r


# vLLM's mp executor keeps its engine processes spinning on their shared-memory queue for
# ``busy_loop_s`` (1 s) after the last read (SpinCondition, vllm/distributed/device_communicators/
# shm_broadcast.py). Measured straight after the other server, that spin ran on into the
# measurement: 0.4-0.9 CPU-s of the idle bare worker (nice 0) inside Serve's 1.5-3 s measurements,
# where it outweighs Ray's nice-15 engine, against 0.3-0.6 CPU-s of the idle Serve worker (nice 15)
# inside bare's. Each measurement starts once every engine process is quiet.
QUIET_WINDOW_S, QUIET_ENGINE_CPU_S, SETTLE_MAX_S = 0.25, 0.01, 5.0


def settle(bare_pgid: int, marker: str) -> float:
    """Waits until the engine processes of both servers use under QUIET_ENGINE_CPU_S in a window of
    QUIET_WINDOW_S (at most SETTLE_MAX_S); returns the seconds waited."""
    start = time.monotonic()
    before = processes(bare_pgid, marker)
    while time.monotonic() - start < SETTLE_MAX_S:
        time.sleep(QUIET_WINDOW_S)
        after = processes(bare_pgid, marker)
        busy = sum(cpu for role, cpu in cpu_by_role(before, after).items() if "engine" in role)
        if busy < QUIET_ENGINE_CPU_S:
            break
        before = after
    return round(time.monotonic() - start, 2)


def run_variant(variant: str, endpoints: dict[str, tuple[str, str | None]], args, bare_pgid: int | None, marker: str,
                router: tuple[str, int] | None = None) -> dict:  # fmt: skip
    """Alternating rounds over every level and endpoint; medians and ratios per level."""
    levels = [int(x) for x in args.levels.split(",")]
    rounds: dict[int, dict[str, list[dict]]] = {c: {name: [] for name in endpoints} for c in levels}
    for url, key in endpoints.values():  # warm-up: every endpoint, one wave
        measure(url, key, 16, 16, args.output_tokens)
    for i in range(args.rounds):
        for c in levels:
            order = list(endpoints) if i % 2 == 0 else list(reversed(endpoints))
            for name in order:
                url, key = endpoints[name]
                if variant == "hapnice0":
                    for pid, (role, _, _) in processes(bare_pgid, marker).items():
                        if role == "HAProxy":
                            os.setpriority(os.PRIO_PROCESS, int(pid), 0)
                settled = settle(bare_pgid, marker) if bare_pgid is not None else 0.0
                before = processes(bare_pgid, marker) if args.cpu and bare_pgid is not None else None
                probe = RouterProbe(router) if router and name == "serve" else None
                if probe:
                    probe.start()
                result = measure(url, key, c, max(64, 2 * c), args.output_tokens)
                if probe:
                    result["router"] = probe.result()
                if before is not None:
                    result["cpu_s"] = cpu_by_role(before, processes(bare_pgid, marker))
                result["settle_s"] = settled
                result["load_avg_1m"] = round(os.getloadavg()[0], 2)
                rounds[c][name].append(result)
    out: dict = {"nice": nice_by_role(processes(bare_pgid, marker)) if bare_pgid is not None else {}, "levels": {}}
    for c in levels:
        per = {name: summarize(rounds[c][name]) for name in endpoints}
        level = {**per, "serve_over_bare": ratios(per["serve"], per["bare"])}
        if "replica" in per:
            level["replica_over_bare"] = ratios(per["replica"], per["bare"])
        out["levels"][str(c)] = level
    out["targets_met"] = all(v["serve_over_bare"]["targets_met"] for v in out["levels"].values())
    return out


def run_header(args, **load) -> dict:
    """The printed object's head: the load every measurement sends, the machine, the start time."""
    return {"load": {"levels": args.levels, "requests": "max(64, 2 x level)", "output_tokens": args.output_tokens, "ignore_eos": True,
                     "rounds": args.rounds, "order": "bare first in even rounds, Serve first in odd", **load},
            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "variants": {}}  # fmt: skip


def measure_running(args) -> int:
    """Measure two servers that run already (``--bare-url``, ``--serve-url``): no start, no stop."""
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not key:
        print(f"error: {args.api_key_env} is not set", file=sys.stderr)
        return 2
    out = run_header(args, servers="running (not started here)")
    endpoints = {"bare": (args.bare_url.rstrip("/"), None), "serve": (args.serve_url.rstrip("/"), key)}
    out["variants"]["running"] = run_variant("running", endpoints, args, None, "")
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(json.dumps(out, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--levels", default="16,64,128", help="concurrency levels, comma-separated")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--variants", default="orch", help="comma list of: " + ", ".join(VARIANT_ENV))
    parser.add_argument("--replica", action="store_true", help="also measure the Serve replica's own port (no HAProxy, no router)")
    parser.add_argument("--cpu", action="store_true", help="CPU seconds per process role for every measurement")
    parser.add_argument("--router", action="store_true", help="time the request router's answer (as HAProxy asks it) during Serve measurements")
    parser.add_argument("--keep-logs", action="store_true", help="keep the server logs and Ray temp dirs (printed as workdir)")
    parser.add_argument("--fast-start", action="store_true",
                        help="both engines eager with a 0.25 GiB KV cache (quick to start; figures not comparable with default runs)")
    parser.add_argument("--bare-url", help="a running bare vLLM server: measure it, start nothing (needs --serve-url)")
    parser.add_argument("--serve-url", help="a running Serve endpoint of the same model (needs --bare-url)")
    parser.add_argument("--api-key-env", help="environment variable holding the Serve endpoint's API key (with --serve-url)")
    args = parser.parse_args()
    if bool(args.bare_url) != bool(args.serve_url):
        parser.error("--bare-url and --serve-url go together")
    if args.bare_url:
        return measure_running(args)

    from orchestrator.plan.tinymodel import build_tiny_model

    model = build_tiny_model()
    marker = secrets.token_hex(8)
    env = {**os.environ, MARK: marker, "VLLM_CPU_KVCACHE_SPACE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    if args.fast_start:  # the Ray nodes' env reaches the engine: the bytes, not the variable
        env.pop("VLLM_CPU_KVCACHE_SPACE")
    env.pop("RAY_ADDRESS", None)
    workdir = Path(tempfile.mkdtemp(prefix="orch-overhead-"))
    key = "bench-" + secrets.token_hex(16)
    procs: list[subprocess.Popen] = []
    out = run_header(args, fast_start=args.fast_start)
    out["model"] = "tiny (orchestrator.plan.tinymodel)"
    failed = True
    try:
        bare_port = free_port()
        procs.append(start_bare(model, bare_port, env, workdir / "bare.log", fast=args.fast_start))
        bare_url = f"http://127.0.0.1:{bare_port}"
        wait_http(bare_url + "/health", 600)
        for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
            vkey = None if variant in NOT_ORCH_BASED else key
            proc, serve_url = start_serve(variant, model, free_port(), env, workdir, vkey, fast=args.fast_start)
            procs.append(proc)
            endpoints = {"bare": (bare_url, None), "serve": (serve_url, vkey)}
            direct = replica_url(workdir, variant) if args.replica else None
            if direct:
                endpoints["replica"] = (direct, vkey)
            router = router_address(workdir, variant) if args.router else None
            measured = run_variant(variant, endpoints, args, procs[0].pid, f"ORCH_SERVE_OVERHEAD_RAY={marker}-{variant}", router)
            out["variants"][variant] = {"ray_start_env": serve_env_for(variant), **measured}
            # One Serve cluster at a time: stop this one before the next variant.
            stop_all([proc], f"ORCH_SERVE_OVERHEAD_RAY={marker}-{variant}")
            procs.remove(proc)
        failed = False
    finally:
        stop_all(procs, f"{MARK}={marker}")
        if failed:
            print(f"failed: the logs are kept in {workdir}", file=sys.stderr)
        elif args.keep_logs:
            out["workdir"] = str(workdir)
        else:
            for link in workdir.glob("haproxy-*"):
                shutil.rmtree(link.resolve(), ignore_errors=True)
            shutil.rmtree(workdir, ignore_errors=True)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
