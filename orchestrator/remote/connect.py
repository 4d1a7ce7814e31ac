"""Which runner each node of a manifest gets, and opening them for one command. No I/O until used.

``connect(manifest, node, known_hosts)`` picks the adapter of one node (``transport: local`` ->
LocalRunner, else SshRunner); ``open_runners(manifest, known_hosts)`` opens one runner per node
for the length of one orch command and closes them all at the end. Opening is lazy: no
connection is made until the first command, so a dead node costs nothing until it is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.remote.local import LocalRunner
from orchestrator.remote.runner import Runner
from orchestrator.remote.ssh import SshRunner

if TYPE_CHECKING:
    from orchestrator.manifest.model import Manifest
    from orchestrator.manifest.sections import NodeSpec


def _node(manifest: Manifest, node: NodeSpec | str) -> NodeSpec:
    if not isinstance(node, str):
        return node
    for n in manifest.nodes:
        if n.name == node:
            return n
    raise KeyError(f"no node named {node!r} in cluster {manifest.name!r}")


def connect(
    manifest: Manifest,
    node: NodeSpec | str,
    known_hosts: Path,
    accept_new_host_keys: bool = False,
) -> Runner:
    """The runner of one node (not connected yet: SSH connects on the first command)."""
    spec = _node(manifest, node)
    if spec.transport == "local":
        return LocalRunner(spec.name)

    ssh = manifest.ssh
    return SshRunner(
        spec.name,
        spec.host,
        port=spec.ssh_port(manifest),
        user=spec.ssh_user(manifest),
        identity_file=ssh.identity_file,
        known_hosts=Path(ssh.known_hosts) if ssh.known_hosts else Path(known_hosts),
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=ssh.connect_timeout,
    )


@contextmanager
def open_runners(
    manifest: Manifest,
    known_hosts: Path,
    accept_new_host_keys: bool = False,
    nodes: Iterable[str] | None = None,
) -> Iterator[dict[str, Runner]]:
    """One runner per node (all nodes, or those named in ``nodes``, in manifest order), closed
    when the block ends, whatever happens inside it."""
    wanted = None if nodes is None else set(nodes)
    if wanted is not None:
        unknown = wanted - {n.name for n in manifest.nodes}
        if unknown:
            raise KeyError(f"no node(s) named {sorted(unknown)} in cluster {manifest.name!r}")
    runners: dict[str, Runner] = {}
    try:
        for spec in manifest.nodes:
            if wanted is None or spec.name in wanted:
                runners[spec.name] = connect(manifest, spec, known_hosts, accept_new_host_keys)
        yield runners
    finally:
        for runner in runners.values():
            try:
                runner.close()
            except Exception:
                pass
