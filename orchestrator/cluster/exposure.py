"""What orch's Ray nodes expose beyond the Serve port that orch cannot close. Pure, no I/O.

With ``RAY_SERVE_ENABLE_HA_PROXY=1`` (orch's default: it more than doubles Serve LLM's
throughput, see the README) Ray 2.60 renders HAProxy's stats page as ``bind *:STATS_PORT`` and
its Prometheus frontend as ``bind :METRICS_PORT`` (ray/serve/_private/haproxy_templates.py): every
address, no auth, and no setting for the bind address. orch moves HAProxy's admin socket into a
0700 folder (``ray_nodes.haproxy_paths``) but cannot bind these two to loopback: `orch up`
(preflight included) and `orch status` warn with ``exposure_warnings`` (docs/cluster.md says what
to do about it).
"""

from __future__ import annotations

from typing import Any

from orchestrator.cluster.ray_nodes import haproxy_enabled, ray_process_env


def haproxy_public_ports(manifest: Any) -> dict[str, tuple[int, int]]:
    """Node name -> (stats port, Prometheus port) of the nodes whose Ray runs HAProxy."""
    out = {}
    for node in manifest.nodes:
        env = ray_process_env(manifest, node, None, token_path="-")
        if haproxy_enabled(env):
            out[node.name] = (int(env["RAY_SERVE_HAPROXY_STATS_PORT"]), int(env["RAY_SERVE_HAPROXY_METRICS_PORT"]))
    return out


def exposure_warnings(manifest: Any) -> list[str]:
    """One line per set of ports: what listens beyond loopback that the user should firewall."""
    by_ports: dict[tuple[int, int], list[str]] = {}
    for node, ports in haproxy_public_ports(manifest).items():
        by_ports.setdefault(ports, []).append(node)
    return [
        f"HAProxy (Ray Serve) on {', '.join(nodes)} serves its stats page on port {stats} and Prometheus metrics on "
        f"port {metrics} to every address, without auth: Ray 2.60 has no setting for their bind address; allow "
        "them only from trusted hosts (docs/cluster.md)"
        for (stats, metrics), nodes in sorted(by_ports.items())
    ]
