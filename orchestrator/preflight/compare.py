"""Helpers shared by the preflight check modules: which nodes were probed, and how a value of
one node compares with the others (the head is the reference when it has the value). Pure.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts

Facts = dict[str, Any]
GIB = 1 << 30


def probed(manifest: Manifest, facts: Facts) -> list[tuple[Any, NodeFacts]]:
    """(NodeSpec, NodeFacts) for every node that was probed, in manifest order."""
    return [(n, facts[n.name]) for n in manifest.nodes if isinstance(facts.get(n.name), NodeFacts)]


def reference(manifest: Manifest, values: dict[str, Any]) -> tuple[Any, str]:
    """The value others are compared with, and where it comes from (the head, or most nodes)."""
    head = manifest.head.name
    if values.get(head) is not None:
        return values[head], f"the head ({head})"
    present = [v for v in values.values() if v is not None]
    value, _ = Counter(present).most_common(1)[0]
    holders = [n for n, v in values.items() if v == value]
    return value, "node" + ("s " if len(holders) > 1 else " ") + ", ".join(holders)


def differing(manifest: Manifest, values: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
    """(node, its value, reference value, reference label) for each node that differs."""
    present = {n: v for n, v in values.items() if v is not None}
    if len(set(present.values())) <= 1:
        return []
    ref, label = reference(manifest, present)
    return [(n, v, ref, label) for n, v in present.items() if v != ref]
