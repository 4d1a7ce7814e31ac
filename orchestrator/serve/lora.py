"""LoRA adapters served on a base model: `orch rollout --lora NAME=SOURCE`. Pure.

An adapter is a name (what clients put in the request's ``model`` field) and a source: a folder
on the nodes' disks (absolute, as `orch model sync` places it) or an S3-compatible prefix
(``s3://bucket/prefix``). orch serves them through vLLM's own static adapters: the engine
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
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError

S3_SCHEME = "s3://"
FLAG = "--lora"
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
ADAPTER_CONFIG = "adapter_config.json"  # the PEFT adapter's config (vLLM's PEFTHelper reads it)
_EXAMPLE = "e.g. --lora sql=/models/adapters/sql or --lora sql=s3://bucket/adapters/sql"


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: its served name and where it comes from (a node folder or ``s3://...``)."""

    name: str
    source: str

    @property
    def remote(self) -> bool:
        return self.source.startswith(S3_SCHEME)

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source}


def check_source(source: str, where: str) -> str:
    """A folder on the nodes (absolute) or ``s3://bucket[/prefix]``; anything else is refused."""
    if source.startswith(S3_SCHEME):
        bucket = source[len(S3_SCHEME):].split("/", 1)[0]
        if not bucket:
            raise UsageError(f"{where}: {source!r} names no bucket", hint=_EXAMPLE)
        return source.rstrip("/")
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", source)
    if scheme:
        raise UsageError(f"{where}: the scheme {scheme.group(1)}:// of {source!r} is not supported",
                         hint="an adapter comes from a folder on the nodes or an S3-compatible store (s3://bucket/prefix); " + _EXAMPLE)  # fmt: skip
    if not source.startswith("/"):
        raise UsageError(f"{where}: {source!r} is not an absolute folder on the nodes",
                         hint="give the folder as the nodes see it (`orch model sync` places it under the manifest's model_store); " + _EXAMPLE)  # fmt: skip
    return source.rstrip("/") or "/"


def parse_lora(value: str) -> LoraAdapter:
    """``NAME=SOURCE`` of one --lora flag; bad input is a UsageError naming the flag and the value."""
    name, sep, source = value.partition("=")
    where = f"{FLAG} {value!r}"
    if not sep:
        raise UsageError(f"{where}: expected NAME=SOURCE", hint=_EXAMPLE)
    return adapter(name.strip(), source.strip(), where)


def adapter(name: str, source: str, where: str) -> LoraAdapter:
    """One adapter checked; ``where`` names the flag (or the manifest's field) in the errors."""
    if not name:
        raise UsageError(f"{where}: the adapter's name (before =) is empty", hint="the name is what clients send as the request's model; " + _EXAMPLE)
    if not ADAPTER_NAME.match(name):
        raise UsageError(f"{where}: the adapter's name {name!r} may hold letters, digits, '.', '_' and '-' (at most 128, not first '.', '_' or '-')",
                         hint=_EXAMPLE)  # fmt: skip
    if not source:
        raise UsageError(f"{where}: the source (after =) is empty", hint=_EXAMPLE)
    return LoraAdapter(name, check_source(source, where))


def manifest_adapters(served_name: str, sources: Mapping[str, str]) -> tuple[LoraAdapter, ...]:
    """The manifest's ``serve.lora.<served_name>`` (adapter name -> source), checked as the flag is."""
    where = f"serve.lora.{served_name}"
    adapters = [adapter(str(name), str(source).strip(), f"{where}.{name}") for name, source in sources.items()]
    return check_adapters(adapters, served_name, what=where)


def check_adapters(adapters: Sequence[LoraAdapter], served_name: str, *, what: str = FLAG) -> tuple[LoraAdapter, ...]:
    """No two adapters of one name, none named as the base model is served (vLLM refuses both:
    ``_check_load_lora_adapter_request``)."""
    seen: dict[str, LoraAdapter] = {}
    for adapter in adapters:
        if adapter.name == served_name:
            raise UsageError(f"{what} {adapter.name}={adapter.source}: the name {adapter.name!r} is the base model's served name",
                             hint="clients pick the base or an adapter by the request's model field: give the adapter another name")  # fmt: skip
        if adapter.name in seen:
            raise UsageError(f"{what} {adapter.name}={adapter.source}: the adapter {adapter.name!r} is given twice "
                             f"(also {seen[adapter.name].source})", hint="give each adapter once, each with its own name")  # fmt: skip
        seen[adapter.name] = adapter
    return tuple(adapters)


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
