"""orch's Serve LLM hooks, imported by Ray in every engine replica of an application orch renders:
the callback class (``callback_config``) that skips Serve LLM's per-node model task and its
telemetry push, orch's builder (the application's ``import_path``) whose replica class loads the
LoRA adapters of its ``user_config`` into its running engine (``reconfigure``), and the vLLM
worker extension that asks Linux for the AMX tile registers. Why each exists: ``orchestrator/serve/node_hooks.py``.

Runs on the nodes, not here: orch writes this file whole, as ``orch_serve_hooks.py``, into its own
folder on every node of the cluster (``orch up`` and every rollout, before the apply; `orch down`
removes it), first on the application's PYTHONPATH (``node_programs``; ``serve/node_hooks.py``
says where). It imports nothing of orch; Ray and vLLM are the node's.
"""

import hashlib
import logging
import os
import shutil
import sys
from typing import Any, cast

from ray.llm._internal.common.callbacks.base import CallbackBase

# The lines this module logs (tests and `orch logs` readers look for them; serve/node_hooks.py
# holds the same values and a test checks that they agree).
SKIPPED_LINE = "orch: Serve LLM's per-node model task skipped"
AMX_GRANTED_LINE = "orch: AMX tile data enabled for this vLLM worker"
AMX_REFUSED_LINE = "orch: the kernel refused AMX tile data to this vLLM worker"
ADAPTER_LINE = "orch: LoRA adapter downloaded"
ADAPTER_LOADED_LINE = "orch: LoRA adapter loaded"
ADAPTER_FAILED_LINE = "orch: LoRA adapter not loaded"
# The engine deployment's user_config key that lists the adapters its replicas load (serve/lora.py).
LORA_KEY = "lora_adapters"
# Where LLMServer._start_engine finds the telemetry push it calls after the engine started (Ray
# 2.60, ray/llm/_internal/serve/core/server/llm_server.py); the callback replaces it there.
LLM_SERVER_MODULE = "ray.llm._internal.serve.core.server.llm_server"
TELEMETRY_PUSH = "push_telemetry_report_for_all_models"


class SkipNodeInit(CallbackBase):
    """Skips Serve LLM's per-node model task: orch renders no cloud mirror, so the task would
    only return the model id, after a fresh worker imported torch on every node.

    And turns off Serve LLM's telemetry push in this replica. After its engine starts, every
    LLMServer waits, with no timeout, for a detached actor of Ray's (``llm_serve_telemetry``, made
    by the first replica that asks). A replica stopped while it was making that actor (a
    rollout interrupted at that moment) leaves it DEPENDENCIES_UNREADY for good, and every later
    engine replica of the cluster then hangs at start (measured on orch's test bed). The push
    only records usage tags, which a cluster started with --disable-usage-stats (orch's) never
    reports."""

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False
        _download_adapters(self.llm_config)
        loading = cast(Any, self.llm_config.model_loading_config)  # a ModelLoadingConfig once validated
        logging.getLogger("ray.serve").info(
            SKIPPED_LINE + " (the model is %s: no cloud mirror to download from)",
            loading.model_source or loading.model_id,
        )
        server = sys.modules.get(LLM_SERVER_MODULE)
        if server is not None and hasattr(server, TELEMETRY_PUSH):
            setattr(server, TELEMETRY_PUSH, _no_telemetry_push)


def _no_telemetry_push(*args, **kwargs) -> None:
    return None


def adapter_dir(uri: str, name: str) -> str:
    """Where an S3 adapter is put on this node: beside this module, under orch's folder of the
    cluster (``~/.orch/nodes/<cluster>/lora/``), one folder per adapter and URI."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lora", f"{name}-{digest}")


def fetch_adapter(uri: str, name: str) -> str:
    """An S3 adapter downloaded afresh into ``adapter_dir``; returns that folder."""
    from filelock import FileLock
    from ray.llm._internal.common.utils.cloud_utils import CloudFileSystem

    dest = adapter_dir(uri, name)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with FileLock(dest + ".lock"):  # two replicas on one node
        partial = f"{dest}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        CloudFileSystem.download_files(path=partial, bucket_uri="pyarrow-" + uri.rstrip("/"))
        if not os.path.isfile(os.path.join(partial, "adapter_config.json")):
            shutil.rmtree(partial, ignore_errors=True)
            raise ValueError(f"orch: LoRA adapter {name!r}: no adapter_config.json under {uri} "
                             "(check the prefix, AWS_ENDPOINT_URL_S3 and the credentials in the nodes' environment)")
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(partial, dest)
    logging.getLogger("ray.serve").info(ADAPTER_LINE + " (%s: %s -> %s)", name, uri, dest)
    return dest


def _download_adapters(llm_config: Any) -> None:
    """Each ``lora_modules`` entry whose path is ``s3://...`` is downloaded here, before the engine
    starts, and its path replaced by the local copy: vLLM loads adapters from local folders only.
    Serve LLM's cloud filesystem code downloads (``pyarrow-s3://``: pyarrow's S3 client, which
    reads ``AWS_ENDPOINT_URL_S3`` and the usual AWS credentials; Serve LLM's own ``s3://`` client
    needs boto3, which ``ray[llm]`` does not install). Downloaded afresh at every engine start, so a
    new upload under the same prefix is what a restarted engine serves."""
    modules = (llm_config.engine_kwargs or {}).get("lora_modules") or []
    remote = [m for m in modules if isinstance(m, dict) and str(m.get("path", "")).startswith("s3://")]
    if not remote:
        return
    local = {m["path"]: fetch_adapter(m["path"], str(m["name"])) for m in remote}
    # The same dicts are in the engine config Serve LLM may already have made from engine_kwargs
    # (its frontend_kwargs hold the same list): replacing the path in each dict covers both.
    frontend = llm_config.get_engine_config().frontend_kwargs.get("lora_modules") or []
    for module in [*modules, *frontend]:
        if isinstance(module, dict) and module.get("path") in local:
            module["path"] = local[module["path"]]


async def sync_adapters(server: Any, user_config: Any) -> None:
    """The replica's ``reconfigure``: its engine serves exactly the adapters of ``user_config``
    (``{LORA_KEY: [{"name", "source"}]}``). Each added one (or one whose source changed) is loaded,
    an S3 one downloaded first, with vLLM's ``OpenAIServingModels.load_lora_adapter`` (Serve LLM's
    ``VLLMEngine._oai_models``, the object vLLM's app serves ``/v1/models`` and the model check
    from); each removed one is unloaded. Serve calls it on every running replica when the
    user_config changes, and on each new replica after its engine started, before it is ready.
    An adapter that fails to load is logged (``ADAPTER_FAILED_LINE``), not raised: the replica
    keeps serving its base and the others, and orch's probe of each adapter fails the rollout."""
    import asyncio

    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    log = logging.getLogger("ray.serve")
    wanted = {str(a["name"]): str(a["source"]) for a in (user_config or {}).get(LORA_KEY) or [] if isinstance(a, dict)}
    held = server.__dict__.setdefault("_orch_adapters", {})  # name -> source, as loaded
    models = getattr(server.engine, "_oai_models", None)
    if models is None:
        log.warning(ADAPTER_FAILED_LINE + " (%s: this engine has no vLLM serving models)", ", ".join(sorted(wanted)) or "-")
        return
    for name in sorted(n for n in held if wanted.get(n) != held[n]):
        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        log.info("orch: LoRA adapter unloaded (%s)", held.pop(name))
    for name, source in sorted(wanted.items()):
        if held.get(name) == source:
            continue
        try:
            path = await asyncio.to_thread(fetch_adapter, source, name) if source.startswith("s3://") else source
            result = await models.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path),
                                                    base_model_name=server._llm_config.model_id)  # fmt: skip
        except Exception as exc:
            result = exc
        if isinstance(result, str):
            held[name] = source
            log.info(ADAPTER_LOADED_LINE + " (%s from %s)", name, source)
        else:
            log.warning(ADAPTER_FAILED_LINE + " (%s from %s: %s)", name, source, getattr(getattr(result, "error", None), "message", result))


def _with_runtime_adapters(cls):
    """``cls`` (Serve LLM's LLMServer or a subclass) with orch's ``reconfigure``."""

    class WithRuntimeAdapters(cls):
        async def reconfigure(self, user_config) -> None:
            await sync_adapters(self, user_config)

    WithRuntimeAdapters.__name__ = WithRuntimeAdapters.__qualname__ = cls.__name__
    return WithRuntimeAdapters


# The Ray release whose Serve LLM the light build below was compared with, field by field
# (tests/unit/test_serve_node_hooks.py builds both). Any other release, or any field orch does
# not render, builds through Serve LLM's own functions.
CHECKED_RAY = "2.60.0"
INGRESS_CLASS = "orch_serve_hooks.LLMServerIngress"
AMX_CLASS = "orch_serve_hooks.AmxTileData"
_LIGHT_KEYS = {"model_loading_config", "accelerator_config", "accelerator_type", "engine_kwargs", "callback_config",
               "placement_group_config", "deployment_config"}


def build_openai_app(builder_config: dict):
    """Ray Serve LLM's build_openai_app under direct streaming, without the LLMRouter hop: the
    LLMServer deployment (vLLM's own app) is the ingress and HAProxy balances over its replicas.

    Serve runs this in a build task at every apply. Serve LLM's builder imports vLLM there (10 s
    measured) only to compute the deployment's options; for what orch renders, the same options
    follow from the config alone (``_light_options``), and the replica class is named by its
    import path, so the task imports Ray Serve only and the replica imports vLLM as it would."""
    config = _light_config(builder_config)
    return _build_light(config) if config is not None else _build_with_serve_llm(builder_config)


def _light_config(builder_config: dict):
    """The one llm_config, when it is what orch renders (explicit bundles, CPU or GPU, no request
    router) on the checked Ray; else None."""
    import ray

    configs = builder_config.get("llm_configs")
    if ray.__version__ != CHECKED_RAY or set(builder_config) != {"llm_configs"} or not isinstance(configs, list):
        return None
    if len(configs) != 1 or not isinstance(configs[0], dict) or not set(configs[0]) <= _LIGHT_KEYS:
        return None
    config = configs[0]
    group, deployment = config.get("placement_group_config"), config.get("deployment_config") or {}
    if not isinstance(group, dict) or set(group) != {"strategy", "bundles"} or not group["bundles"]:
        return None
    if (config.get("accelerator_config") or {}).get("kind", "cpu") not in ("cpu", "gpu"):
        return None
    return None if not isinstance(deployment, dict) or "request_router_config" in deployment else config


def _direct_streaming_or_refuse() -> None:
    from ray.llm._internal.serve import constants

    if not constants.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING:
        raise ValueError("orch_serve_hooks:build_openai_app needs RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 in the "
                         "application's runtime_env (orch renders it); use ray.serve.llm:build_openai_app without it")


def _light_options(llm_config: dict, runtime_env: dict) -> dict:
    """LLMServer.get_deployment_options and build_llm_deployment's name and defaults
    (ray/llm/_internal/serve/core/server/llm_server.py and server/builder.py, Ray 2.60.0),
    for a CPU or GPU config with explicit placement bundles, as orch renders it."""
    import copy

    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve import constants
    from ray.llm._internal.serve.core.configs.accelerators import format_ray_accelerator_resource

    options = copy.deepcopy(llm_config.get("deployment_config") or {})
    actor_options = options.get("ray_actor_options", {})
    replica = {"CPU": actor_options.get("num_cpus", 1), "GPU": actor_options.get("num_gpus", 0),
               **actor_options.get("resources", {})}
    if "memory" in actor_options:
        replica["memory"] = actor_options["memory"]
    group = llm_config["placement_group_config"]
    bundles = [dict(b) for b in group["bundles"]]
    if llm_config.get("accelerator_type"):
        for bundle in bundles:
            bundle.setdefault(format_ray_accelerator_resource(llm_config["accelerator_type"]), 0.001)
    # the replica actor sits in the first bundle, beside the first engine worker
    first = bundles[0]
    bundles[0] = {k: first.get(k, 0) + replica.get(k, 0) for k in set(first) | set(replica)}
    options["placement_group_bundles"] = bundles
    options["placement_group_strategy"] = group["strategy"]
    default_env = dict(runtime_env)
    if constants.ENABLE_WORKER_PROCESS_SETUP_HOOK:
        default_env["worker_process_setup_hook"] = "ray.llm._internal.serve._worker_process_setup_hook"
    actor_options["runtime_env"] = {**default_env, **actor_options.get("runtime_env", {})}
    options["ray_actor_options"] = actor_options
    model_id = llm_config["model_loading_config"]["model_id"]
    options["name"] = "LLMServer:" + options.get("name", model_id.replace("/", "--").replace(".", "_"))
    defaults = {"max_ongoing_requests": constants.DEFAULT_MAX_ONGOING_REQUESTS,
                "health_check_period_s": constants.DEFAULT_HEALTH_CHECK_PERIOD_S,
                "health_check_timeout_s": constants.DEFAULT_HEALTH_CHECK_TIMEOUT_S,
                "autoscaling_config": {"target_ongoing_requests": constants.DEFAULT_MAX_TARGET_ONGOING_REQUESTS}}
    return maybe_apply_llm_deployment_config_defaults(defaults, options)


def _build_light(llm_config: dict):
    import ray
    from ray import serve

    _direct_streaming_or_refuse()
    options = _light_options(llm_config, ray.get_runtime_context().runtime_env)
    return serve.deployment(**options)(cast(Any, INGRESS_CLASS)).bind(llm_config=llm_config)  # a class named by import path


def _build_with_serve_llm(builder_config: dict):
    from ray import serve
    from ray.llm._internal.serve.core.ingress import builder
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    args = builder.LLMServingArgs.model_validate(builder_config)
    _direct_streaming_or_refuse()
    if len(args.llm_configs) != 1:
        raise ValueError(f"orch_serve_hooks:build_openai_app serves exactly one model, got {len(args.llm_configs)}")
    builder._validate_direct_streaming_ingress_config(args.ingress_deployment_config, cast(Any, args.ingress_cls_config))
    llm_config = cast(Any, args.llm_configs[0])  # an LLMConfig once validated
    # As _build_direct_streaming_llm_deployment, less the RoundRobinRouter it sets for LLMRouter's
    # picks: Serve refuses any request_router_class on an ingress deployment that HAProxy
    # balances itself ("A custom `request_router_config.request_router_class` is not supported
    # on the ingress deployment when HAProxy is enabled", ray/serve/_private/application_state.py).
    return build_llm_deployment(llm_config, deployment_cls=serve.ingress()(_with_runtime_adapters(llm_config.server_cls or LLMServer)))


def _ingress_class():
    """Serve LLM's LLMServer as the ingress, constructed from the config's dict (the light build
    passes the dict: building an LLMConfig needs torch and transformers)."""
    from ray import serve
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    class LLMServerFromDict(LLMServer):
        async def __init__(self, llm_config, **kwargs):
            if isinstance(llm_config, dict):
                llm_config = LLMConfig.model_validate(llm_config)
            await super().__init__(llm_config, **kwargs)

    LLMServerFromDict.__name__ = LLMServerFromDict.__qualname__ = "LLMServer"
    return serve.ingress()(_with_runtime_adapters(LLMServerFromDict))


def _amx_tile_data():
    """vLLM's worker extension for a CPU engine, resolved by name in the engine's worker process
    (``worker_extension_cls``; ``WorkerWrapperBase.init_worker`` in ``vllm/v1/worker/worker_base.py``)
    before the model loads. It adds no method: resolving it is the point.

    On a CPU with AMX (Intel Sapphire Rapids and later) vLLM's CPU attention picks its AMX kernels
    from the CPU's flags alone (``_get_attn_isa`` in ``vllm/v1/attention/backends/cpu_attn.py``:
    ``torch.cpu._is_amx_tile_supported()``), but Linux kills, with SIGILL, a process that uses the
    tile registers without first asking for them (``arch_prctl(ARCH_REQ_XCOMP_PERM)``; the
    permission is per process and a spawned process starts without it). vLLM 0.32 never asks: the
    worker gets the permission only when oneDNN happens to ask first, inside a linear layer of more
    than 4 tokens (``tinygemm_kernel`` through ``at::native::cpublas::brgemm``). An engine whose
    first forward pass is a prompt of up to 4 tokens (a user's "hi") dies at it: ``Worker proc
    VllmWorker-0 died unexpectedly (exit code: -4)``, and every later request gets a 500 from the
    dead engine. Measured with bare vLLM on such a CPU; docs/rollout.md, "AMX"."""
    import logging

    log = logging.getLogger("vllm")
    try:
        import torch

        supported = bool(torch.cpu._is_amx_tile_supported())
        granted = supported and bool(torch.cpu._init_amx())
    except (ImportError, AttributeError, RuntimeError) as exc:
        supported, granted = False, False
        log.warning("orch: could not check the CPU for AMX tiles (%s)", exc)
    if granted:
        log.info(AMX_GRANTED_LINE)
    elif supported:
        log.warning(AMX_REFUSED_LINE + ": vLLM's CPU attention will fail at its first AMX kernel "
                    "(a Linux kernel before 5.16, or a hypervisor without AMX state)")

    class AmxTileData:
        """orch's vLLM worker extension: the AMX tile registers were asked for when it was resolved."""

    return AmxTileData


FRONT_CLASS = "orch_serve_hooks.OrchFront"
FRONT_DEPLOYMENT = "OrchFront"
FRONT_ROUTE_SUFFIX = "/v1"  # the front's route prefix ends so (orchestrator/serve/front.py)
# The API key the front checks, set by OrchFront in its replica (the middleware reads it there).
_FRONT_KEYS: list = []


def build_front(args: dict):
    """The one endpoint in front of several models: Serve LLM's OpenAI ingress (``OpenAiIngress``,
    ray/llm/_internal/serve/core/ingress/ingress.py) with a handle to each model's engine
    deployment in that model's own application (``serve.get_deployment_handle(deployment, app)``).
    It picks the model by the request's ``model`` (``base:adapter`` too, through Serve's
    multiplexing), lists every model on ``/v1/models`` and answers 404 naming an unknown one.
    Which models, and the API key, come in the deployment's ``user_config`` (``reconfigure``: a
    change never restarts the replica; orchestrator/serve/front.py). ``args``: ``replicas``.
    The class is named by import path: the build task imports Ray Serve only."""
    from ray import serve

    options: dict[str, Any] = {"name": FRONT_DEPLOYMENT, "num_replicas": int(args.get("replicas") or 1),
                               "max_ongoing_requests": 1000, "ray_actor_options": {"num_cpus": 0}}  # fmt: skip
    return serve.deployment(**options)(cast(Any, FRONT_CLASS)).bind()


# vLLM's own rule (vllm/entrypoints/serve/middleware/authenticate.py, AuthenticationMiddleware):
# a request under these prefixes needs "Authorization: Bearer KEY"; OPTIONS and other paths
# (/health) pass; a refusal is 401 {"error": "Unauthorized"}.
GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")


class _KeyCheck:
    """vLLM's API-key check, in front: the handles to the engines do not pass through vLLM's
    HTTP app, so its own check would not run for requests the front forwards."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") in ("http", "websocket") and scope.get("method") != "OPTIONS":
            # The front answers under its route prefix ``/v1``: the full path says what is guarded
            # (vLLM strips its own root path; its routes carry /v1, the front's do not).
            root = scope.get("root_path", "")
            full = scope.get("path", "")
            path = full[len(root):] if root and full.startswith(root) else full
            guarded = path.startswith(GUARDED_PREFIX) or root.endswith(FRONT_ROUTE_SUFFIX)
            if guarded and not _key_matches(dict(scope.get("headers") or []).get(b"authorization", b"")):
                body = b'{"error":"Unauthorized"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _key_matches(header: bytes) -> bool:
    import hashlib
    import secrets

    scheme, _, param = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not _FRONT_KEYS:
        return False
    given = hashlib.sha256(param.encode("utf-8")).digest()
    match = False
    for key in _FRONT_KEYS:
        match |= secrets.compare_digest(given, hashlib.sha256(str(key).encode("utf-8")).digest())
    return match


def _front_class():
    """OpenAiIngress over handles to other applications' deployments, with the key check."""
    from fastapi import HTTPException
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress, init, make_fastapi_ingress

    class OrchFront(OpenAiIngress):
        def __init__(self):
            super().__init__({}, {})
            self._adapter_base: dict = {}

        def reconfigure(self, config: dict) -> None:
            """The models, their LoRA adapters and the key of ``user_config``: new handles, the
            old ones dropped. An adapter is a model id of its own, sent to its base's engine,
            which serves it by name (vLLM's lora_modules)."""
            models = list(config.get("models") or [])
            self._default_serve_handles = {m["model_id"]: serve.get_deployment_handle(m["deployment"], app_name=m["app"])
                                           for m in models}  # fmt: skip
            self._model_cards = {m["model_id"]: ModelCard(id=m["model_id"], object="model", owned_by="orch", permission=[],
                                                          metadata={"app": m["app"]}) for m in models}  # fmt: skip
            self._adapter_base = {a: m["model_id"] for m in models for a in m.get("adapters") or ()}
            for name, base in self._adapter_base.items():
                self._model_cards.setdefault(name, ModelCard(id=name, object="model", owned_by="orch", permission=[],
                                                             metadata={"parent": base}))  # fmt: skip
            self._configured_serve_handles = {}
            _FRONT_KEYS[:] = [str(k) for k in config.get("api_key") or []]

        def _get_configured_serve_handle(self, model_id: str):
            base = self._adapter_base.get(model_id)
            if base is None:
                return super()._get_configured_serve_handle(model_id)
            if model_id not in self._configured_serve_handles:
                self._configured_serve_handles[model_id] = self._default_serve_handles[base].options(stream=True)
            return self._configured_serve_handles[model_id]

        async def _get_model_id(self, model):
            try:
                return await super()._get_model_id(model)
            except HTTPException as exc:  # an unknown model: name the ones served here
                if exc.status_code != 404:
                    raise
                raise HTTPException(404, f"model {model!r} is not served here; served: {', '.join(sorted(self._model_cards))}") from None

    app = init()
    app.add_middleware(_KeyCheck)
    # The front's route prefix ends in /v1 (orchestrator/serve/front.py): its routes are the
    # OpenAI paths under it, as Starlette matches the path less the route prefix.
    endpoints = {
        "models": lambda a: a.get("/models"),
        "model_data": lambda a: a.get("/models/{model:path}"),
        "completions": lambda a: a.post("/completions"),
        "chat": lambda a: a.post("/chat/completions"),
        "embeddings": lambda a: a.post("/embeddings"),
    }
    return make_fastapi_ingress(OrchFront, endpoint_map=endpoints, app=app)


# The classes made on first use, once per process: the ingress in the replica (the build task
# imports this module without vLLM), AmxTileData in each vLLM worker of a CPU engine, the front
# in its replica.
_MADE_ON_FIRST_USE = {INGRESS_CLASS.rsplit(".", 1)[1]: _ingress_class, AMX_CLASS.rsplit(".", 1)[1]: _amx_tile_data,
                      FRONT_CLASS.rsplit(".", 1)[1]: _front_class}  # fmt: skip


def __getattr__(name: str):
    make = _MADE_ON_FIRST_USE.get(name)
    if make is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cls = make()
    return cls
