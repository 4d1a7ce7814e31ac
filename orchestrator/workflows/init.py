"""`orch init --hosts`: probe the hosts over SSH with preflight's own probes and turn what they
report into the nodes of a starter manifest. The I/O edge (SSH, name resolution), deps injected.

Each host is probed in parallel (``nodes/inventory.py: gather_facts``, as `orch up` does), as the
node of a provisional manifest built from the flags; an unreachable host stops it (nothing is
written). ``nodes/starter.py`` turns the facts into nodes and text.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import AuthenticationError, OrchError, UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.facts import NodeFacts
from orchestrator.nodes.inventory import gather_facts
from orchestrator.nodes.starter import StarterNode, StarterSettings, accelerator_of, node_names, starter_node
from orchestrator.remote.runner import Runner, fan_out


def resolve_address(host: str) -> str | None:
    """The address orch reaches ``host`` at (the host itself when it is an address)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class InitDeps:
    open_runners: Callable[[Manifest], AbstractContextManager[dict[str, Runner]]]
    resolve: Callable[[str], str | None] = resolve_address
    progress: Callable[[str], None] = lambda _m: None


def provisional_manifest(settings: StarterSettings) -> Manifest:
    """The manifest the hosts are probed as: the flags, GPU probes on (a CPU host just has none)."""
    doc: dict[str, Any] = {
        "name": settings.name,
        "accelerator": "gpu",
        "ssh": {k: v for k, v in (("user", settings.user), ("port", settings.port), ("identity_file", settings.identity_file),
                                  ("known_hosts", settings.known_hosts)) if v is not None},
        "nodes": [{"name": n, "host": h, "role": "head" if i == 0 else "worker", "gpus": 1}
                  for i, (n, h) in enumerate(zip(node_names(settings.hosts), settings.hosts))],
    }  # fmt: skip
    if settings.python:
        doc["python"] = settings.python
    if settings.temp_dir:
        doc["ray"] = {"temp_dir": settings.temp_dir}
    return load_manifest(yaml.safe_dump(doc, sort_keys=False), Path("orch-init.yaml"))


def probe_hosts(settings: StarterSettings, deps: InitDeps) -> tuple[list[StarterNode], str]:
    """(the nodes, the accelerator) from what each host reports. UnreachableError (exit 4) when a
    host does not answer, UsageError when GPU and CPU hosts are mixed."""
    manifest = provisional_manifest(settings)
    deps.progress(f"probing {len(manifest.nodes)} host(s) over SSH: {', '.join(settings.hosts)}")
    with deps.open_runners(manifest) as runners:
        outcomes = fan_out(list(runners.values()), lambda r: gather_facts(r, manifest.node(r.node), manifest))
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise UnreachableError(
            "cannot probe " + "; ".join(f"{manifest.node(o.node).host} ({o.error.message})" for o in failed) + "; nothing was written",
            hint=_init_hint(failed[0].error, manifest.node(failed[0].node).host, settings),
            node=failed[0].node,
        )
    facts: dict[str, NodeFacts] = {o.node: o.value for o in outcomes}
    nodes = [starter_node(spec.name, spec.host, spec.role, facts[spec.name], deps.resolve(spec.host)) for spec in manifest.nodes]
    return nodes, accelerator_of(nodes)


def _init_hint(error: OrchError, host: str, settings: StarterSettings) -> str:
    """The runner's hints name the manifest's fields; `orch init` has no manifest yet (it is what
    it writes), so a connection or login failure points at init's own flags."""
    user, port = settings.user or "root", settings.port or 22
    if isinstance(error, UnreachableError):
        return (f"check that {host} is up and that sshd listens on port {port} (`ssh -p {port} {user}@{host}` "
                "from this machine); --port gives the SSH port, --user the login")  # fmt: skip
    if isinstance(error, AuthenticationError):
        return (f"make sure your public key is in ~{user}/.ssh/authorized_keys on {host} (ssh-copy-id), or pass "
                "--identity-file / --user")  # fmt: skip
    return error.hint or f"check `ssh -p {port} {user}@{host}` from this machine"
