"""How LoRA adapters are served on a base model (`orch rollout --lora NAME=SOURCE`). Pure.

The adapters themselves (name, source, the checks of the flag and of the manifest's
``serve.lora``) are ``orchestrator.manifest.adapters``, re-exported here.

**Runtime adapters** (an application built by orch's builder, ``orch_serve_hooks:build_openai_app``):
the engine starts with LoRA slots only (``enable_lora``, ``max_loras``, ``max_lora_rank`` in
engine_kwargs, hence in the application's args) and the adapters are the engine deployment's
``user_config`` (``{"lora_adapters": [{"name", "source"}, ...]}``), given as an app-level
``deployments`` override. Serve leaves ``user_config`` out of the code version and of
``requires_actor_restart`` (``ray/serve/_private/version.py``): a change of it calls
``reconfigure`` on every running replica (``replica.py``) and on every replica that starts later,
before it is ready. orch's replica class (``orch_serve_hooks.LLMServerIngress``) loads the added
adapters there into its running engine, in the process, with vLLM's own
``OpenAIServingModels.load_lora_adapter`` (``vllm/entrypoints/openai/models/serving.py``; the
object Serve LLM keeps as ``VLLMEngine._oai_models`` and shares with vLLM's app) and unloads the
removed ones: adding an adapter restarts nothing. vLLM's ``/v1/models`` then lists each loaded
adapter with its base as ``parent``.

Why not vLLM's runtime route (``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` with a ``LoRAResolver`` plugin):
that variable also mounts ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` on the app
clients reach (``vllm/entrypoints/serve/lora/api_router.py``: "should ONLY be used for local
development"); the filesystem resolver (``vllm/plugins/lora_resolvers/filesystem_resolver.py``)
serves ``<VLLM_LORA_RESOLVER_CACHE_DIR>/<name>`` only when its ``base_model_name_or_path`` equals
the engine's model path, cannot fetch an S3 source, and loads on the first request (an adapter is
not listed, nor checked, before); and a removed adapter stays loaded. Serve LLM's own LoRA
(``dynamic_lora_loading_path``, multiplexing) acts only on a ``serve_multiplexed_model_id``
header, which only its LLMRouter sets (orch's builder has none: ``serve/node_hooks.py``), and
takes object-store URIs only.

**Static adapters** (Serve LLM's own builders: a manifest's request router, data parallel): the
adapters are vLLM's ``lora_modules`` in engine_kwargs (``--lora-modules``, loaded at engine start by
``OpenAIServingModels.init_static_loras``), as before: a change is a new engine.

An S3 source is downloaded on the replica's node by orch's module (at engine start for a static
adapter, in ``reconfigure`` for a runtime one) with Serve LLM's cloud filesystem code
(``pyarrow-s3://``: pyarrow's S3 client, which reads ``AWS_ENDPOINT_URL_S3`` and the usual AWS
credentials), into ``node_hooks.adapters_dir``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestrator.manifest.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_NAME,
    FLAG,
    S3_SCHEME,
    LoraAdapter,
    adapter,
    check_adapters,
    check_source,
    manifest_adapters,
    parse_lora,
)
from orchestrator.plan.engine_features import LoraOptions
from orchestrator.serve import node_hooks
from orchestrator.serve.shapes import (
    ORCH_BUILDER_IMPORT_PATH,
    engine_deployment_name,
    llm_config_of,
    llm_configs,
    with_engine_option,
)

# The adapters' checks live in the manifest layer (the manifest's serve.lora uses them too).
__all__ = ["ADAPTER_CONFIG", "ADAPTER_NAME", "FLAG", "S3_SCHEME", "LoraAdapter", "adapter", "adapter_rank", "adapters_of",
           "check_adapters", "check_source", "lora_modules", "manifest_adapters", "parse_lora", "runtime_adapters", "serves_runtime_adapters",
           "static_adapters", "with_adapters", "with_runtime_adapters", "lora_slots"]  # fmt: skip

# The key of the engine deployment's user_config that lists the runtime adapters (the node
# module's own, through serve/node_hooks.py: a test checks that they agree).
LORA_KEY = node_hooks.LORA_KEY


def lora_modules(adapters: Iterable[LoraAdapter], served_name: str) -> list[dict]:
    """vLLM's ``lora_modules`` (``LoRAModulePath``: name, path, base_model_name) for engine_kwargs.
    An S3 source stays an ``s3://`` path here: orch's callback replaces it on the node."""
    return [{"name": a.name, "path": a.source, "base_model_name": served_name} for a in adapters]


def static_adapters(llm_config: Mapping[str, Any]) -> tuple[LoraAdapter, ...]:
    """The static adapters (``lora_modules``) a rendered (or stored) llm_config serves."""
    modules = (llm_config.get("engine_kwargs") or {}).get("lora_modules") or []
    return tuple(LoraAdapter(str(m["name"]), str(m["path"])) for m in modules if isinstance(m, Mapping) and "name" in m and "path" in m)


def serves_runtime_adapters(app: Mapping[str, Any]) -> bool:
    """Whether the application's replicas load adapters at runtime: orch's builder (its replica
    class has the ``reconfigure`` that loads them)."""
    return app.get("import_path") == ORCH_BUILDER_IMPORT_PATH


def _engine_user_config(app: Mapping[str, Any]) -> Mapping[str, Any] | None:
    try:
        engine = engine_deployment_name(app)
    except KeyError:
        return None
    for entry in app.get("deployments") or []:
        if isinstance(entry, Mapping) and entry.get("name") == engine and isinstance(entry.get("user_config"), Mapping):
            return entry["user_config"]
    return None


def runtime_adapters(app: Mapping[str, Any]) -> tuple[LoraAdapter, ...] | None:
    """The runtime adapters of an application (its engine deployment's user_config), sorted by
    name; None when it has none configured (no LoRA, or static adapters)."""
    config = _engine_user_config(app)
    if config is None or not isinstance(config.get(LORA_KEY), list):
        return None
    found = [LoraAdapter(str(a["name"]), str(a["source"])) for a in config[LORA_KEY] if isinstance(a, Mapping) and "name" in a and "source" in a]
    return tuple(sorted(found, key=lambda a: a.name))


def adapters_of(app: Mapping[str, Any]) -> tuple[LoraAdapter, ...]:
    """The adapters a rendered (or stored, or live) application serves: runtime or static."""
    runtime = runtime_adapters(app)
    if runtime is not None:
        return runtime
    return tuple(a for llm in llm_configs(app) if isinstance(llm, Mapping) for a in static_adapters(llm))


def with_runtime_adapters(app: Mapping[str, Any], adapters: Sequence[LoraAdapter] | None) -> dict[str, Any]:
    """A copy of ``app`` whose engine deployment's user_config lists ``adapters`` (sorted by name;
    an empty list still unloads what the replicas hold); None: no user_config."""
    value = None if adapters is None else {LORA_KEY: [a.to_json() for a in sorted(adapters, key=lambda a: a.name)]}
    own = (llm_config_of(app).get("deployment_config") or {}).get("user_config")
    return with_engine_option(app, "user_config", value, own)


def with_adapters(app: Mapping[str, Any], adapters: Sequence[LoraAdapter], served_name: str) -> dict[str, Any]:
    """``app`` serving ``adapters``: runtime adapters where its replicas load them (orch's builder),
    else vLLM's static ``lora_modules``. An engine with LoRA slots and no adapter still gets an
    empty list (runtime): a later adapter is then a user_config change only."""
    enabled = bool((llm_config_of(app).get("engine_kwargs") or {}).get("enable_lora"))
    if serves_runtime_adapters(app):
        return with_runtime_adapters(app, adapters) if adapters or enabled else dict(app)
    out = copy.deepcopy(dict(app))
    if adapters:
        llm_config_of(out).setdefault("engine_kwargs", {})["lora_modules"] = lora_modules(adapters, served_name)
    return out


def lora_slots(llm_config: Mapping[str, Any]) -> LoraOptions | None:
    """The LoRA slots a (stored) llm_config's engine was started with; None: LoRA off."""
    return LoraOptions.from_engine_kwargs(llm_config.get("engine_kwargs") or {})


def adapter_rank(text: str) -> int | None:
    """The rank ``r`` of a PEFT ``adapter_config.json`` (None: unreadable or not a LoRA)."""
    try:
        config = json.loads(text)
    except ValueError:
        return None
    rank = config.get("r") if isinstance(config, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else None
