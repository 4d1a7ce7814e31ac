"""Preflight: turn the facts probed on every node into findings with stable codes. Pure, no I/O.

``run_checks(manifest, facts)`` composes the small ``check_*`` functions of
``orchestrator.preflight.checks``; each returns a list of ``Finding`` (``orchestrator.preflight.findings``).
"""

from __future__ import annotations

from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.preflight import checks
from orchestrator.preflight.findings import _SEVERITY_ORDER, Finding


def run_checks(manifest: Manifest, facts: dict[str, Any]) -> list[Finding]:
    """All findings for a cluster: ``facts`` maps node name to its NodeFacts, or to the
    RemoteError that stopped its probing (a node missing from ``facts`` was not probed). Sorted by node order of the
    manifest (cluster-wide first), then severity, then code."""
    out: list[Finding] = []
    for check in checks.ALL_CHECKS:
        out.extend(check(manifest, facts))
    order = {n.name: i for i, n in enumerate(manifest.nodes)}
    out.sort(key=lambda f: (-1 if f.node is None else order.get(f.node, len(order)), _SEVERITY_ORDER[f.severity], f.code))
    return out
