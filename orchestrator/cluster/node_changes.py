"""Which nodes a manifest change touches, and how: the per-node side of `orch up` (issue 46). Pure.

Both manifests are compared as ``model_dump(mode="json")`` with secrets redacted (the recorded one
is stored so), flattened to dotted keys (``ray.port``, ``nodes.w2.env.NCCL_DEBUG``). Each changed key
falls in one class:
- **full restart**: what Ray cannot apply without restarting the head, and so every node: the head
  node itself (any of its keys, or another node named head), the cluster's Python, the accelerator,
  every ``ray.*`` setting (port, dashboard port, token auth, temp dir, object store, CPUs), the
  cluster-wide ``env`` (it is in the head's environment too) and ``serve.http_port`` (the ports
  of Ray's HTTP proxies on every node are set when Ray starts);
- **a worker added**: Ray started there only; it joins the running cluster;
- **a worker removed**: drained (Serve moves its replicas first), then Ray stopped there;
- **a worker replaced** (same name, another ``host`` or ``transport``) or **changed** (its env,
  interface, python, cpus, gpus, gpu type): drained, then restarted alone; it rejoins;
- **no Ray change**: how orch reaches the nodes (``ssh.*``, a node's SSH ``port`` and ``user``)
  and what only orch's own commands read (``serve.api_key_env``, ``serve.request_router``,
  ``serve.autoscaling``, ``serve.max_ongoing_requests``, ``targets``, ``slo``, ``model_store``):
  recorded, nothing restarted.
A key not named here counts as a full restart: a new setting is safe by default.

Environment values are redacted in the recorded manifest (any may be a secret), so they are
compared through keyed digests recorded beside it (``env_digests``, key: the cluster's id): the
cluster ``env`` under ``""``, each node's under its name. Without recorded digests a change that
the redacted manifests do not show cannot be placed on a node, and counts as a full restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NO_RAY_PREFIXES = (
    "ssh.", "serve.api_key_env", "serve.request_router", "serve.autoscaling", "serve.max_ongoing_requests",
    "targets", "slo", "model_store",
)  # fmt: skip
NODE_SSH_ONLY = frozenset({"port", "user"})
NODE_REPLACED = frozenset({"host", "transport"})


@dataclass(frozen=True)
class NodeChanges:
    """What changed, sorted by what it takes. Every tuple of diff lines reads like
    ``~ nodes.w1.cpus: 8 -> 10``."""

    full_restart: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    replaced: dict[str, tuple[str, ...]] = field(default_factory=dict)  # worker -> its diff lines
    changed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    no_restart: tuple[str, ...] = ()

    @property
    def restarted_workers(self) -> tuple[str, ...]:
        """Workers drained and restarted alone (replaced or changed)."""
        return tuple(sorted(set(self.replaced) | set(self.changed)))


def flatten_settings(value: Any, prefix: str, out: dict[str, Any]) -> None:
    """``out[dotted.key] = leaf`` for every leaf of a manifest's nested settings (an empty mapping is a leaf)."""
    if isinstance(value, Mapping) and value:
        for key in sorted(value):
            flatten_settings(value[key], f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def show_setting(value: Any) -> str:
    """A setting as the diff lines show it: strings as they are, anything else as sorted JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _line(key: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    old = show_setting(a[key]) if key in a else "(unset)"
    new = show_setting(b[key]) if key in b else "(unset)"
    return f"~ {key}: {old} -> {new}"


def _changed_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...))


def _head_name(data: Mapping[str, Any]) -> str | None:
    return next((n["name"] for n in data.get("nodes", []) if n.get("role") == "head"), None)


def env_digests(data: Mapping[str, Any], key: str) -> dict[str, str]:
    """Keyed digests of the cluster env (``""``) and of each node's env, from an unredacted
    ``model_dump(mode="json")``."""

    def digest(env: Any) -> str:
        blob = json.dumps(env or {}, sort_keys=True).encode()
        return hmac.new(key.encode(), blob, hashlib.sha256).hexdigest()[:32]

    out = {"": digest(data.get("env"))}
    for node in data.get("nodes", []):
        out[str(node["name"])] = digest(node.get("env"))
    return out


def classify(old: Mapping[str, Any], new: Mapping[str, Any], old_env: Mapping[str, str] | None = None,
             new_env: Mapping[str, str] | None = None) -> NodeChanges:  # fmt: skip
    """Sort the differences between the recorded manifest ``old`` and ``new`` (module doc), both
    redacted; ``old_env``/``new_env``: their ``env_digests`` (None when not recorded)."""
    found = _classify(old, new)
    full, changed = list(found.full_restart), dict(found.changed)
    if old_env is not None and new_env is not None:
        if old_env.get("") != new_env.get(""):
            full.append("~ env: (values changed)")
        head = _head_name(new)
        for name in (n["name"] for n in new.get("nodes", [])):
            if name in old_env and old_env.get(name) != new_env.get(name):
                line = f"~ nodes.{name}.env: (values changed)"
                if name == head:
                    full.append(line)
                elif name not in found.replaced:
                    changed[name] = tuple(changed.get(name, ())) + (line,)
    elif _has_env(old) and _has_env(new):
        full.append("~ env: (values may have changed; which node's cannot be told: no digest was recorded)")
    return NodeChanges(tuple(full), found.added, found.removed, found.replaced, changed, found.no_restart)


def _has_env(data: Mapping[str, Any]) -> bool:
    return bool(data.get("env")) or any(n.get("env") for n in data.get("nodes", []))


def _classify(old: Mapping[str, Any], new: Mapping[str, Any]) -> NodeChanges:
    old_nodes = {n["name"]: {k: v for k, v in n.items() if k != "name"} for n in old.get("nodes", [])}
    new_nodes = {n["name"]: {k: v for k, v in n.items() if k != "name"} for n in new.get("nodes", [])}
    head_old, head_new = _head_name(old), _head_name(new)
    full: list[str] = []
    if head_old != head_new:
        full.append(f"~ head: {head_old} -> {head_new}")
    fa: dict[str, Any] = {}
    fb: dict[str, Any] = {}
    flatten_settings({k: v for k, v in old.items() if k not in ("nodes", "source_path")}, "", fa)
    flatten_settings({k: v for k, v in new.items() if k not in ("nodes", "source_path")}, "", fb)
    quiet: list[str] = []
    for key in _changed_keys(fa, fb):
        (quiet if key.startswith(NO_RAY_PREFIXES) else full).append(_line(key, fa, fb))
    added = tuple(n for n in new_nodes if n not in old_nodes and n != head_new)
    removed = tuple(n for n in old_nodes if n not in new_nodes and n != head_old)
    replaced: dict[str, tuple[str, ...]] = {}
    changed: dict[str, tuple[str, ...]] = {}
    for name in (n for n in new_nodes if n in old_nodes):
        na: dict[str, Any] = {}
        nb: dict[str, Any] = {}
        flatten_settings(old_nodes[name], f"nodes.{name}", na)
        flatten_settings(new_nodes[name], f"nodes.{name}", nb)
        keys = _changed_keys(na, nb)
        if not keys:
            continue
        lines = tuple(_line(k, na, nb) for k in keys)
        own = {k.split(".")[2] for k in keys}
        if name in (head_old, head_new):
            if own - NODE_SSH_ONLY:
                full.extend(lines)
            else:
                quiet.extend(lines)
        elif own & NODE_REPLACED:
            replaced[name] = lines
        elif own - NODE_SSH_ONLY:
            changed[name] = lines
        else:
            quiet.extend(lines)
    return NodeChanges(tuple(full), added, removed, replaced, changed, tuple(quiet))
