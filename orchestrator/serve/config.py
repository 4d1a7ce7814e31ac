"""Plan + manifest + facts -> the Ray Serve LLM application config. Pure.

Owns the rendering of ``cluster-templates/serve-app.yaml.j2`` (package data:
``orchestrator.resources``; one Serve application running one model through
``ray.serve.llm:build_openai_app``, or ``build_dp_openai_app`` for a data-parallel (+ expert
parallel) plan: one Serve replica per DP rank, gang-scheduled per group): the engine arguments, the runtime env (collective
interfaces, RAY_ADDRESS, the CPU engine's threads), the deployment settings (``ServeDefaults``)
and the body of the deploy request. The rendered config carries an API-key placeholder; the real
key only exists in the body of the PUT (``RenderedApp.with_api_key``).

Beside it: ``shapes`` (the registry of application shapes: builder, where the llm config sits, placement,
capacity unit), ``placement`` (bundles, stage pins), ``engine_args`` (--engine-arg, dtype),
``fingerprint`` (what makes two configs the same revision; the key masked), ``validate`` (Ray
Serve LLM's own ``LLMConfig``), ``node_hooks`` (the callback that skips Serve LLM's per-node
model task, and the PYTHONPATH that finds it on the nodes).

No I/O except reading the template (through ``orchestrator.resources``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ServeConfigError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.capacity import cpu_kv_cache_bytes
from orchestrator.resources import read_text
from orchestrator.serve import node_hooks
from orchestrator.serve.engine_args import check_engine_arg_key, vllm_dtype
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, config_fingerprint
from orchestrator.serve.in_flight import SOURCE_FLAG, InFlight, in_flight
from orchestrator.serve.routing import router_class
from orchestrator.serve.shapes import (
    OPENAI_IMPORT_PATH,
    engine_deployment_name,
    llm_config_of,
    shape_of_plan,
    with_engine_option,
)

TEMPLATE_NAME = "serve-app.yaml.j2"
IMPORT_PATH = OPENAI_IMPORT_PATH
PUBLIC_ROUTE = "/"
# Serve LLM's direct streaming makes the LLMServer replica the ingress and serves vLLM's own
# FastAPI app, whose `api_key` is what guards the endpoint (stack notes). It needs HAProxy and
# direct ingress in the Ray processes' environment (cluster.ray_nodes.ray_process_env).
DIRECT_STREAMING_ENV = {"RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1"}
# Serve LLM's router under direct streaming: HAProxy asks it which LLMServer replica takes each
# request (ray.llm core/ingress/builder.py). See ServeDefaults.router_drain_s.
ROUTER_DEPLOYMENT = "LLMRouter"
@dataclass(frozen=True)
class ServingPlan:
    """What the serve config needs from the planner's ParallelPlan (adapter: from_parallel_plan)."""

    tp: int
    pp: int
    max_model_len: int
    replicas: int = 1
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    max_concurrency: float | None = None
    kv_cache_gib: float | None = None
    reasons: tuple[str, ...] = ()
    gpus_per_node: int | None = None  # of the planned cluster shape; None: unknown
    # Data parallel: ranks per group (each one engine, one Serve replica of build_dp_openai_app);
    # `replicas` then counts groups. Expert parallel: the routed experts spread over DP x TP.
    dp: int = 1
    expert_parallel: bool = False
    engine_env: tuple[tuple[str, str], ...] = ()  # the plan's engine environment (ParallelPlan.engine_env)
    max_num_seqs: int | None = None  # per engine: the plan's (flag or the vLLM version's default)

    @property
    def workers(self) -> int:
        """vLLM workers of one engine (a DP rank's, or the whole replica's without DP)."""
        return self.tp * self.pp

    @property
    def tp_spans_nodes(self) -> bool:
        """A tensor-parallel group larger than a node (only when asked for explicitly)."""
        return bool(self.gpus_per_node) and self.tp > int(self.gpus_per_node or 0)

    @classmethod
    def from_parallel_plan(cls, plan: Any, **overrides: Any) -> ServingPlan:
        """Read a planner ParallelPlan (or any object/dict with the same names)."""

        def get(name: str, default: Any = None) -> Any:
            if isinstance(plan, Mapping):
                return plan.get(name, default)
            return getattr(plan, name, default)

        values = {
            "tp": int(get("tp", 1)),
            "pp": int(get("pp", 1)),
            "max_model_len": int(get("max_model_len", 0) or 0) or 2048,
            "replicas": max(1, int(get("replicas", 1) or 1)),
            "dtype": str(get("dtype", "bf16") or "bf16"),
            "gpu_memory_utilization": float(get("gpu_memory_utilization", 0.9) or 0.9),
            "kv_cache_dtype": str(get("kv_cache_dtype", "auto") or "auto"),
            "max_concurrency": get("max_concurrency"),
            "kv_cache_gib": get("kv_cache_gib_per_gpu", get("kv_cache_gib")),
            "reasons": tuple(str(r) for r in (get("reasons") or ())),
            "gpus_per_node": int(get("gpus_per_node", 0) or 0) or None,
            "dp": max(1, int(get("dp", 1) or 1)),
            "expert_parallel": bool(get("expert_parallel", False)),
            "engine_env": tuple(sorted((str(k), str(v)) for k, v in dict(get("engine_env") or {}).items())),
            "max_num_seqs": int(get("max_num_seqs", 0) or 0) or None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass(frozen=True)
class ServeDefaults:
    """Deployment settings orch applies unless told otherwise (documented in docs/rollout.md)."""

    health_check_period_s: float = 10
    # A CPU engine busy with a batch can take seconds to answer its health check.
    health_check_timeout_s: float = 30
    graceful_shutdown_timeout_s: float = 30
    # When the live application's config changes (the switch of a side-by-side rollout), Serve
    # starts the new replicas beside the old ones and stops an old one only once its replacement
    # is healthy: 100 = a whole second copy, which `orch rollout` checked has room.
    max_surge_percent: int = 100
    # ROUTER_DEPLOYMENT is replaced on every config change. Serve's default stops the old router
    # as the new one starts and lets it exit after 2 s, before HAProxy's reload drops it (12 ms
    # before, measured; a CI run lost a request to "router_unreachable"). So it gets the surge and
    # waits this long before it exits. (LLMServer, the direct ingress, is held 30 s by Serve.)
    router_drain_s: float = 10
    # Serve's max_ongoing_requests per replica; None: the engine's batch with headroom (in_flight).
    max_ongoing_requests: int | None = None
    max_ongoing_source: str = SOURCE_FLAG  # who set max_ongoing_requests (the flag or the manifest)
    cpus_per_cpu_worker: float = 1
    cpu_kv_cache_gib: float = 1  # VLLM_CPU_KVCACHE_SPACE when the plan gives none
    autoscaling_max_replicas: int | None = None  # set: autoscale between the minimum and this
    autoscaling_min_replicas: int | None = None  # None: the plan's replicas (serve/scaling.py sets both)
    autoscaling_target_ongoing: int | None = None  # per replica; None: the batch, 80% of max_ongoing_requests (in_flight)
    # The LLMServer deployment's request router (serve/routing.py; docs/rollout.md, "Request routing").
    request_router: str = "default"


@dataclass(frozen=True)
class AppTarget:
    """Which application to render: its name, route and the model it serves."""

    app_name: str
    route_prefix: str
    model_id: str
    model_source: str


@dataclass(frozen=True)
class RenderedApp:
    """One rendered Serve application. ``app`` holds the key placeholder: safe to print and store."""

    app: dict
    stage_nodes: tuple[str, ...] | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def llm_config(self) -> dict:
        return llm_config_of(self.app)

    @property
    def name(self) -> str:
        return self.app["name"]

    def fingerprint(self, api_key: str | None = None) -> str:
        return config_fingerprint(self.app, api_key)

    def with_api_key(self, api_key: str) -> dict:
        """A deep copy with the real key in engine_kwargs.api_key: only for the body of the PUT."""
        app = copy.deepcopy(self.app)
        llm_config_of(app)["engine_kwargs"]["api_key"] = [api_key]
        return app

    def renamed(self, app_name: str, route_prefix: str) -> RenderedApp:
        app = copy.deepcopy(self.app)
        app["name"], app["route_prefix"] = app_name, route_prefix
        return RenderedApp(app=app, stage_nodes=self.stage_nodes, notes=self.notes)


# ----------------------------------------------------------------------------------------------
# Pure helpers


CPU_KV_VAR = "VLLM_CPU_KVCACHE_SPACE"  # whole GiB (vllm/platforms/cpu.py)


def serving_env(manifest: Manifest, plan: ServingPlan, defaults: ServeDefaults, node_cores: int | None = None) -> dict[str, str]:
    """runtime_env env_vars: the cluster env, NCCL/Gloo interfaces when uniform, CPU KV space."""
    env: dict[str, str] = dict(DIRECT_STREAMING_ENV)
    nodes = list(manifest.nodes)
    if manifest.accelerator != "cpu":
        ray_address = cluster_ray_address(manifest)
        if ray_address:
            env["RAY_ADDRESS"] = ray_address
        env.update(dict(plan.engine_env))  # e.g. the sampler the plan's reserve assumed
    interfaces = {n.interface for n in nodes}
    # Per-node values (different NIC names, VLLM_HOST_IP) live in each node's Ray process env
    # (orch up); a runtime_env value would override them on every node alike.
    if len(interfaces) == 1 and None not in interfaces:
        nic = interfaces.pop()
        env["NCCL_SOCKET_IFNAME"] = nic
        env["GLOO_SOCKET_IFNAME"] = nic
    cpu = manifest.accelerator == "cpu"
    gib = cpu_kv_gib(plan, defaults)
    whole_gib = cpu_kv_cache_bytes(gib) is None  # else the engine's kv_cache_memory_bytes (render_app)
    if cpu:
        if whole_gib:
            env[CPU_KV_VAR] = str(int(gib))
        # vLLM's CPU backend pins its compute threads to cores it picks on its own ("auto"),
        # unaware of other engines on the node. A side-by-side rollout runs two engines on a
        # node (the candidate beside the serving copy): both were pinned to the same core and
        # the serving one's busy loop starved the candidate (its worker got 1% of a core for
        # 9 minutes while importing, on the test bed). Unpinned, the kernel shares the cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        if node_cores:
            # The engine's compute threads: the node's cores minus one, as vLLM's own binding
            # reserves one core for the engine's scheduler process (it busy-polls its worker) and
            # the front end. Measured on 2 cores (tiny model, 64 x 64 tokens, 16 streams): with
            # OMP_NUM_THREADS=2 the worker's threads fought the scheduler and the replica at every
            # barrier (3.3-4.1 CPU-s per round, 1,200-1,600 tok/s); with 1 it used 0.9-1.5 CPU-s
            # and served 2,100-3,150 tok/s (bare vLLM: 2,400-3,700).
            env["OMP_NUM_THREADS"] = str(max(1, int(node_cores) - 1))
    env.update({str(k): str(v) for k, v in manifest.env.items()})
    if cpu and not whole_gib:
        _refuse_a_whole_gib_beside(manifest, gib)
    return env


def cpu_kv_gib(plan: ServingPlan, defaults: ServeDefaults) -> float:
    """A CPU engine's KV cache in GiB: the plan's size, else orch's default."""
    return plan.kv_cache_gib or defaults.cpu_kv_cache_gib


def _refuse_a_whole_gib_beside(manifest: Manifest, gib: float) -> None:
    """A KV cache of a fraction of a GiB is the engine's kv_cache_memory_bytes, which vLLM's CPU
    platform replaces with VLLM_CPU_KVCACHE_SPACE whenever that is set (vllm/platforms/cpu.py);
    a runtime env cannot unset a variable the nodes' Ray processes carry, and an empty value stops
    the engine (vllm/envs.py reads it with int()). So a manifest that sets it is refused."""
    where = [("env", manifest.env)] + [(f"nodes[{n.name}].env", n.env) for n in manifest.nodes]
    for field_name, env in where:
        if CPU_KV_VAR in env:
            raise ServeConfigError(
                f"{field_name}.{CPU_KV_VAR} is {env[CPU_KV_VAR]!r}: vLLM would take that many GiB of KV cache instead of the "
                f"{gib:g} GiB planned (a fraction of a GiB is passed as kv_cache_memory_bytes, which the variable replaces)",
                hint=f"remove {CPU_KV_VAR} from the manifest's {field_name} (then `orch up` again), or ask a whole number of GiB with --kv-cache-gib",
            )


def cluster_ray_address(manifest: Any) -> str | None:
    """The head's GCS address (``host:port``) for the GPU layout's runtime env.

    vLLM's Ray executor runs in the EngineCore process that the replica spawns, and that
    process calls ``ray.init()`` itself. Without ``RAY_ADDRESS`` Ray looks for the cluster under
    its default temp dir; orch starts Ray with the manifest's ``ray.temp_dir``, so it finds none
    and starts a second, private Ray that never gets the placement group (measured on the test
    bed, docs/rollout.md)."""
    host = manifest.head.host
    port = manifest.ray.port
    if not host or not port:
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def serve_in_flight(plan: ServingPlan, defaults: ServeDefaults) -> InFlight:
    """Serve's max_ongoing_requests for the engine deployment (serve.in_flight): the engine's batch
    with headroom unless set. The plan's shape says how many DP ranks the engine behind one Serve
    replica holds: one for ``build_dp_openai_app`` (each DPServer replica is one rank, so its batch
    is that engine's max_num_seqs and the group takes dp x that)."""
    ranks = shape_of_plan(plan).ranks_per_serve_replica(plan)
    return in_flight(plan.max_num_seqs, dp=plan.dp, ranks_per_serve_replica=ranks,
                     override=defaults.max_ongoing_requests, override_source=defaults.max_ongoing_source)  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Rendering


def render_app(
    manifest: Manifest,
    plan: ServingPlan,
    target: AppTarget,
    *,
    node_resource: Callable[[str], str],
    accelerator_type: str | None = None,
    stage_nodes: Sequence[str] | None = None,
    defaults: ServeDefaults = ServeDefaults(),
    extra_engine_kwargs: Mapping[str, Any] | None = None,
    node_cores: int | None = None,
) -> RenderedApp:
    """Render one application through the jinja2 template. Pure (reads the template file)."""
    import jinja2
    import yaml

    accelerator = manifest.accelerator
    if plan.tp < 1 or plan.pp < 1:
        raise ServeConfigError(f"invalid plan: tp={plan.tp} pp={plan.pp}", hint="tp and pp are at least 1")
    if plan.dp < 1:
        raise ServeConfigError(f"invalid plan: dp={plan.dp}", hint="a data-parallel group has at least 1 rank")
    shape = shape_of_plan(plan)
    shape.check_plan(plan)
    if stage_nodes is not None and len(stage_nodes) != plan.pp:
        raise ServeConfigError(f"{len(stage_nodes)} stage nodes given for pp={plan.pp}",
                               hint="give one node per pipeline stage (stage_nodes_for picks them)")  # fmt: skip
    bundles, strategy = shape.placement(plan, accelerator, stage_nodes, node_resource, defaults.cpus_per_cpu_worker)
    dtype = vllm_dtype(plan.dtype)
    engine_extra: dict[str, Any] = {}
    if plan.kv_cache_dtype and plan.kv_cache_dtype != "auto":
        engine_extra["kv_cache_dtype"] = plan.kv_cache_dtype
    if accelerator == "cpu" and (kv_bytes := cpu_kv_cache_bytes(cpu_kv_gib(plan, defaults))) is not None:
        engine_extra["kv_cache_memory_bytes"] = kv_bytes
    engine_extra.update(dict(extra_engine_kwargs or {}))
    for key in engine_extra:
        check_engine_arg_key(key)
    hooks = node_hooks.uses_hooks(target.model_source)
    if accelerator == "cpu" and hooks:
        # vLLM's CPU attention uses AMX tiles that its worker never asks Linux for: orch's module
        # asks, in each worker, when vLLM resolves it (node_hooks.AmxTileData). A class the
        # manifest names itself is kept (vLLM takes one).
        engine_extra.setdefault("worker_extension_cls", node_hooks.AMX_CLASS)
    requests = serve_in_flight(plan, defaults)
    autoscaling = None
    low = defaults.autoscaling_min_replicas or plan.replicas
    if defaults.autoscaling_max_replicas and defaults.autoscaling_max_replicas > low:
        autoscaling = {
            "min_replicas": low,
            "initial_replicas": low,
            "max_replicas": defaults.autoscaling_max_replicas,
            "target_ongoing_requests": defaults.autoscaling_target_ongoing or requests.autoscaling_target,
        }
    request_router = router_class(defaults.request_router)
    env_vars = serving_env(manifest, plan, defaults, node_cores)
    if hooks:  # the callback that skips Serve LLM's per-node model task imports from orch's folder
        env_vars["PYTHONPATH"] = node_hooks.pythonpath(manifest.name, env_vars.get("PYTHONPATH"))
    import_path = shape.import_path(hooks=hooks, request_router=request_router)
    context = {
        "import_path": import_path,
        "shape_engine_kwargs": shape.engine_kwargs(plan),
        "args_key": shape.args_key,
        "args_is_list": shape.args_is_list,
        "expert_parallel": plan.expert_parallel,
        "app_name": target.app_name,
        "route_prefix": target.route_prefix,
        "model_id": target.model_id,
        "model_source": target.model_source,
        "accelerator": accelerator,
        "accelerator_type": accelerator_type if accelerator != "cpu" else None,
        "tp": plan.tp,
        "pp": plan.pp,
        "max_model_len": plan.max_model_len,
        "dtype": dtype,
        "gpu_memory_utilization": plan.gpu_memory_utilization,
        "extra_engine_kwargs": engine_extra,
        "api_key_placeholder": API_KEY_PLACEHOLDER,
        "bundles": bundles,
        "strategy": strategy,
        "env_vars": env_vars,
        "callback_class": node_hooks.CALLBACK_CLASS if hooks else None,
        "num_replicas": low,
        "request_router_class": request_router,
        "autoscaling": autoscaling,
        "max_ongoing_requests": requests.max_ongoing_requests,
        "health_check_period_s": defaults.health_check_period_s,
        "health_check_timeout_s": defaults.health_check_timeout_s,
        "graceful_shutdown_timeout_s": defaults.graceful_shutdown_timeout_s,
        "max_surge_percent": defaults.max_surge_percent,
        # orch's builder attaches no LLMRouter, so there is none to give the surge and the drain.
        "router_deployment": None if import_path == node_hooks.BUILDER_IMPORT_PATH else ROUTER_DEPLOYMENT,
        "router_drain_s": defaults.router_drain_s,
    }
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    text = env.from_string(read_text("templates", TEMPLATE_NAME)).render(**context)
    try:
        app = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # every value goes through tojson: this is a bug, said as one
        raise ServeConfigError(f"the rendered Serve config is not valid YAML: {exc}", hint="report it with --debug output") from exc
    notes = []
    if accelerator != "cpu" and plan.tp_spans_nodes:
        notes.append(
            f"warning: tensor parallel {plan.tp} spans nodes of {plan.gpus_per_node} GPU(s): every layer's all-reduce "
            "crosses the network between them (placement PACK); the automatic plan keeps TP inside a node"
        )
    if stage_nodes:
        notes.append("pipeline stages pinned to nodes: " + ", ".join(f"stage {i}: {n}" for i, n in enumerate(stage_nodes)))
    elif accelerator != "cpu" and plan.pp > 1:
        notes.append("replicas > 1: pipeline stages are not pinned to nodes (PACK fills one node first)")
    return RenderedApp(app=app, stage_nodes=tuple(stage_nodes) if stage_nodes else None, notes=tuple(notes))


def deploy_body(apps: Sequence[Mapping[str, Any]], manifest: Manifest) -> dict:
    """The body of ``PUT /api/serve/applications/``: every application that should exist."""
    # A manifest's serve section has no host: Serve's proxy listens on every interface. Only a
    # stand-in manifest (benchmarks/serve_overhead.py) names one.
    host = getattr(manifest.serve, "http_host", None) or "0.0.0.0"
    port = manifest.serve.http_port
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [dict(app) for app in apps],
    }


# Serve's own default (ray/serve/_private/config.py, DeploymentConfig.max_surge_percent).
SERVE_DEFAULT_SURGE_PERCENT = 0
# An in-place change (no room for a second copy): Serve's rolling update without a surge stops an
# old replica, then starts its replacement (deployment_state.py: `_surge_rollout_in_progress` is
# False when max_surge_percent <= 0). With a surge the replacement would wait for resources that
# the old replica holds, and the update would never finish.
IN_PLACE_SURGE_PERCENT = 0


def max_surge_of(app: Mapping[str, Any]) -> int:
    """The surge Serve rolls the application's engine deployment with: an app-level
    ``deployments`` entry overrides the llm_config's ``deployment_config``."""
    engine = engine_deployment_name(app)
    for entry in app.get("deployments") or []:
        if isinstance(entry, Mapping) and entry.get("name") == engine and "max_surge_percent" in entry:
            return int(entry["max_surge_percent"])
    return int((llm_config_of(app).get("deployment_config") or {}).get("max_surge_percent", SERVE_DEFAULT_SURGE_PERCENT))


def with_replicas(app: Mapping[str, Any], count: int) -> dict:
    """A copy of ``app`` whose engine deployment runs ``count`` replicas, set as an app-level
    ``deployments`` override of ``num_replicas`` (dropped when the model config already says
    ``count``). Like the surge, ``num_replicas`` is a LightWeight option outside ``args``: Serve's
    code version does not change, so it adds or stops replicas and the ones serving keep running
    (Ray 2.60 ``deploy_utils.py``, ``DeploymentVersion``). ``app`` must run a fixed count."""
    if count < 1:
        raise ValueError("an application runs at least one replica")
    own = (llm_config_of(app).get("deployment_config") or {}).get("num_replicas")
    return with_engine_option(app, "num_replicas", count, own)


def with_max_surge(app: Mapping[str, Any], percent: int) -> dict:
    """A copy of ``app`` that Serve rolls with ``percent`` surge, set as app-level ``deployments``
    overrides. ``max_surge_percent`` is a LightWeight option and the overrides are outside
    ``args``, so Serve's code version (import path, runtime env, args: ``deploy_utils.py``) does
    not change: replicas that already run this config keep running. The engine deployment gets an
    override only where its own ``deployment_config`` says otherwise; every other entry that sets a
    surge (the router) gets ``percent``."""
    own = int((llm_config_of(app).get("deployment_config") or {}).get("max_surge_percent", SERVE_DEFAULT_SURGE_PERCENT))
    return with_engine_option(app, "max_surge_percent", percent, own, others_too=True)


# ----------------------------------------------------------------------------------------------
# Secrets and fingerprints


