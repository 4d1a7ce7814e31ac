"""LoRA adapters as orch takes them: `orch rollout --lora NAME=SOURCE` and the manifest's
``serve.lora``. Pure (no I/O).

An adapter is a name (what clients put in the request's ``model`` field) and a source: a folder on
the nodes' disks (absolute, as `orch model sync` places it) or an S3-compatible prefix
(``s3://bucket/prefix``). Bad input is a UsageError naming the flag (or the manifest's field) and
the value. Here, in the manifest layer, because the manifest checks its ``serve.lora`` with the same
rules; how the adapters are served is ``orchestrator.serve.lora``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
