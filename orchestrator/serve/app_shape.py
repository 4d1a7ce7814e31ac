"""Where the parts of a Ray Serve LLM application are, in its two shapes orch deploys. Pure.

- ``ray.serve.llm:build_openai_app`` (tensor x pipeline parallel replicas): the model's config is
  ``args.llm_configs[0]`` and its engine deployment is ``LLMServer:<model_id>``.
- ``ray.serve.llm:build_dp_openai_app`` (a data-parallel group per replica, Ray 2.60's
  ``serving_patterns/data_parallel/builder.py``): ``args`` is ``DPOpenAiServingArgs``, whose one
  model is ``args.llm_config`` (no list), and its engine deployment is ``DPServer:<model_id>``,
  one Serve replica per DP rank.

Everything that reads a stored or deployed config (rollback, restore, repair, secrets,
fingerprints, `orch status`) goes through here, so both shapes read alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OPENAI_IMPORT_PATH = "ray.serve.llm:build_openai_app"
DP_IMPORT_PATH = "ray.serve.llm:build_dp_openai_app"
# The engine deployment's class name, per builder (Serve LLM names it "<class>:<model_id>").
ENGINE_DEPLOYMENT_CLASSES = ("LLMServer", "DPServer")
# Dotted paths of the model's config in each shape (used in messages and secret checks).
LLM_CONFIGS_PATH = "args.llm_configs[0]"
DP_LLM_CONFIG_PATH = "args.llm_config"


def is_dp_app(app: Mapping[str, Any]) -> bool:
    """True for an application built by ``build_dp_openai_app``."""
    return isinstance(app, Mapping) and (app.get("import_path") == DP_IMPORT_PATH or "llm_config" in (app.get("args") or {}))


def llm_config_path(app: Mapping[str, Any]) -> str:
    return DP_LLM_CONFIG_PATH if is_dp_app(app) else LLM_CONFIGS_PATH


def llm_configs(app: Mapping[str, Any]) -> list[Any]:
    """Every model config of the application (one for a DP application)."""
    if not isinstance(app, Mapping):
        return []
    args = app.get("args") or {}
    if not isinstance(args, Mapping):
        return []
    if "llm_config" in args:
        return [args["llm_config"]]
    configs = args.get("llm_configs") or []
    return list(configs) if isinstance(configs, list) else []


def llm_config_of(app: Mapping[str, Any]) -> dict[str, Any]:
    """The application's (first) model config; a KeyError when it has none."""
    configs = llm_configs(app)
    if not configs or not isinstance(configs[0], dict):
        raise KeyError(f"application {app.get('name') if isinstance(app, Mapping) else '?'!r} has no llm_config")
    return configs[0]


def api_key_of(app: Mapping[str, Any]) -> str | None:
    """The deployed API key (the first of ``engine_kwargs.api_key``), None when absent."""
    try:
        key = llm_config_of(app)["engine_kwargs"]["api_key"]
    except (KeyError, TypeError):
        return None
    return key[0] if isinstance(key, list) and key else None


def engine_deployment_name(app: Mapping[str, Any]) -> str:
    """The engine deployment's name as Serve LLM gives it (Ray 2.60,
    ``ray/llm/_internal/serve/core/server/builder.py``: ``build_llm_deployment``): the class name
    (``LLMServer``, ``DPServer`` for a DP application), ``:``, then ``deployment_config.name`` when
    set, else the model id with ``/`` as ``--`` and ``.`` as ``_`` (``_get_deployment_name``)."""
    llm = llm_config_of(app)
    cls = ENGINE_DEPLOYMENT_CLASSES[1] if is_dp_app(app) else ENGINE_DEPLOYMENT_CLASSES[0]
    name = (llm.get("deployment_config") or {}).get("name")
    if not name:
        name = str((llm.get("model_loading_config") or {}).get("model_id", "")).replace("/", "--").replace(".", "_")
    return f"{cls}:{name}"


def model_of_deployment(name: str) -> str | None:
    """The model id of an engine deployment (``LLMServer:<model_id>`` or ``DPServer:<model_id>``)."""
    head, sep, rest = name.partition(":")
    return rest if sep and head.startswith(ENGINE_DEPLOYMENT_CLASSES) else None


def is_engine_deployment(name: str) -> bool:
    return name.startswith(ENGINE_DEPLOYMENT_CLASSES)
