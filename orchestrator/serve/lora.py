"""How LoRA adapters are served on a base model (`orch rollout --lora NAME=SOURCE`). Pure.

The adapters themselves (name, source, the checks of the flag and of the manifest's
``serve.lora``) are ``orchestrator.manifest.adapters``, re-exported here. orch serves them through vLLM's own static adapters: the engine
argument ``lora_modules`` (vLLM's ``--lora-modules``, a frontend argument that Ray Serve LLM passes
to ``FrontendArgs``; ``init_app_state`` loads each one at engine start through
``OpenAIServingModels.init_static_loras`` in ``vllm/entrypoints/openai/models/serving.py``). Under
Serve LLM's direct streaming, requests reach vLLM's own FastAPI app, whose model check
(``BaseServing._check_model``, ``vllm/entrypoints/serve/engine/serving.py``) accepts a loaded
adapter's name, and whose ``/v1/models`` lists each adapter with its base as ``parent``.

Serve LLM's own LoRA path (``lora_config.dynamic_lora_loading_path``, multiplexing) does not reach
that app: its ``_ResolveLoRAMiddleware`` only acts on a request whose ``serve_multiplexed_model_id``
header is set, which Serve LLM's LLMRouter sets from the body (with
``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1``), and orch's builder has no LLMRouter
(``serve/node_hooks.py``). It also takes object-store URIs only, not the nodes' folders.

An S3 source is downloaded on each node by orch's Serve LLM callback (``orch_serve_hooks``) before
the engine starts, with Serve LLM's cloud filesystem code (``pyarrow-s3://``: pyarrow's S3 client,
which reads ``AWS_ENDPOINT_URL_S3`` for a store other than AWS, and the usual AWS credentials), and
the adapter's ``lora_modules`` path is replaced by the local copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
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

# The adapters' checks live in the manifest layer (the manifest's serve.lora uses them too).
__all__ = ["ADAPTER_CONFIG", "ADAPTER_NAME", "FLAG", "S3_SCHEME", "LoraAdapter", "adapter", "adapter_rank", "adapters_of",
           "check_adapters", "check_source", "lora_modules", "manifest_adapters", "parse_lora"]  # fmt: skip


def lora_modules(adapters: Iterable[LoraAdapter], served_name: str) -> list[dict]:
    """vLLM's ``lora_modules`` (``LoRAModulePath``: name, path, base_model_name) for engine_kwargs.
    An S3 source stays an ``s3://`` path here: orch's callback replaces it on the node."""
    return [{"name": a.name, "path": a.source, "base_model_name": served_name} for a in adapters]


def adapters_of(llm_config: Mapping[str, Any]) -> tuple[LoraAdapter, ...]:
    """The adapters a rendered (or stored) llm_config serves."""
    modules = (llm_config.get("engine_kwargs") or {}).get("lora_modules") or []
    return tuple(LoraAdapter(str(m["name"]), str(m["path"])) for m in modules if isinstance(m, Mapping) and "name" in m and "path" in m)


def adapter_rank(text: str) -> int | None:
    """The rank ``r`` of a PEFT ``adapter_config.json`` (None: unreadable or not a LoRA)."""
    try:
        config = json.loads(text)
    except ValueError:
        return None
    rank = config.get("r") if isinstance(config, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0 else None
