"""What `orch model sync` must do, decided from what every node holds. Pure: no I/O.

Inputs are the fingerprints the sync agent (``orchestrator/remote/node_programs/sync_agent.py``) reports: the source
folder's files (relative path, size, sha256) and, per node, the final folder's files, the staging
folder's files (what an interrupted sync left) and the free bytes of the model store.

Per node each source file is ``keep`` (already in staging, verified), ``link`` (the final folder
holds it: hard-linked into staging, no bytes sent) or ``receive``. A node whose final folder
holds exactly the source files is up to date and is left alone.

The data flows along one chain, source -> n1 -> n2 -> ...: each node writes the files it needs and
forwards every chunk at once to the next node that still needs the file (a pipelined relay: the
source's uplink carries the model once, whatever the node count). Nodes that need the most bytes
come first, so a file's stream stops at the last node that wants it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Free space kept beyond the bytes to receive: the filesystem's own metadata and the agent's
# cache and marker files.
RESERVE_BYTES = 1 << 20
RESERVE_FRACTION = 0.01

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+@=-]*$")


@dataclass(frozen=True, order=True)
class FileEntry:
    """One file of a model folder: path relative to the folder, size, sha256 (hex)."""

    rel: str
    size: int
    sha256: str

    def to_list(self) -> list[Any]:
        return [self.rel, self.size, self.sha256]


@dataclass(frozen=True)
class FolderPrint:
    """The fingerprint of a folder as the agent reports it (``exists`` False: nothing there)."""

    path: str
    exists: bool
    kind: str | None = None  # "folder" | "file" | None
    files: tuple[FileEntry, ...] = ()
    content_sha256: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def folder_print(d: Mapping[str, Any]) -> FolderPrint:
    """The agent's ``fingerprint`` JSON as a value (KeyError/TypeError/ValueError when malformed)."""
    exists = bool(d["exists"])
    kind = None
    if exists:
        kind = "file" if d.get("index_kind") == "file" else "folder"
    files = tuple(sorted(FileEntry(str(r), int(s), str(h)) for r, s, h in d.get("files") or ()))
    return FolderPrint(path=str(d["path"]), exists=exists, kind=kind, files=files, content_sha256=d.get("content_sha256"))


@dataclass(frozen=True)
class NodeHolding:
    """What one node holds at the destination, from the agent's ``inspect`` mode."""

    node: str
    final: FolderPrint
    staging: FolderPrint
    free_bytes: int
    final_is_link: bool = False
    staging_owned: bool = False


def node_holding(node: str, d: Mapping[str, Any]) -> NodeHolding:
    return NodeHolding(
        node=node,
        final=folder_print(d["final"]),
        staging=folder_print(d["staging"]),
        free_bytes=int(d["free_bytes"]),
        final_is_link=bool(d.get("final_is_link")),
        staging_owned=bool(d.get("staging_owned")),
    )


@dataclass(frozen=True)
class NodePlan:
    node: str
    up_to_date: bool
    keep: tuple[FileEntry, ...] = ()
    link: tuple[FileEntry, ...] = ()
    receive: tuple[FileEntry, ...] = ()
    remove: tuple[str, ...] = ()  # files of the final folder that are not in the source
    free_bytes: int = 0
    problem: str | None = None

    @property
    def receive_bytes(self) -> int:
        return sum(f.size for f in self.receive)

    @property
    def needed_bytes(self) -> int:
        """Free space this node must have before anything is sent."""
        b = self.receive_bytes
        return b + RESERVE_BYTES + int(b * RESERVE_FRACTION) if b else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "up_to_date": self.up_to_date,
            "receive_files": [f.rel for f in self.receive],
            "receive_bytes": self.receive_bytes,
            "link_files": len(self.link),
            "keep_files": len(self.keep),
            "remove_files": list(self.remove),
            "free_bytes": self.free_bytes,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Frame:
    """One file of the stream and the chain nodes that write it."""

    entry: FileEntry
    to: tuple[str, ...]

    def to_list(self) -> list[Any]:
        return [self.entry.rel, self.entry.size, self.entry.sha256, list(self.to)]


@dataclass(frozen=True)
class SyncPlan:
    target: tuple[FileEntry, ...]
    nodes: tuple[NodePlan, ...]
    chain: tuple[str, ...]
    frames: tuple[Frame, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def stream_bytes(self) -> int:
        """Bytes the source sends once (each chain link carries at most this)."""
        return sum(f.entry.size for f in self.frames)

    @property
    def to_change(self) -> tuple[NodePlan, ...]:
        return tuple(n for n in self.nodes if not n.up_to_date)

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.node == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": len(self.target),
            "model_bytes": sum(f.size for f in self.target),
            "stream_bytes": self.stream_bytes,
            "chain": list(self.chain),
            "nodes": [n.to_dict() for n in self.nodes],
            "problems": list(self.problems),
        }


def check_model_name(name: str) -> str | None:
    """Why ``name`` cannot be a folder of the model store (None: it can)."""
    if not _NAME.match(name) or name in (".", ".."):
        return f"model name {name!r} must be one folder name (letters, digits, . _ + @ = -; not starting with . or -)"
    return None


@dataclass(frozen=True)
class ModelPaths:
    """Where a model lives on every node: ``final`` (what vLLM loads), ``staging`` (written
    first, renamed onto ``final`` when complete and verified), ``old`` (the previous copy during
    a swap where the kernel cannot exchange two paths)."""

    store: str
    name: str

    @property
    def final(self) -> str:
        return posixpath.join(self.store, self.name)

    @property
    def staging(self) -> str:
        return posixpath.join(self.store, f".{self.name}.orch-sync")

    @property
    def old(self) -> str:
        return posixpath.join(self.store, f".{self.name}.orch-old")


def plan_node(target: Sequence[FileEntry], holding: NodeHolding) -> NodePlan:
    name = holding.node
    if holding.final_is_link:
        return NodePlan(name, False, free_bytes=holding.free_bytes, problem=f"{holding.final.path} is a symbolic link; orch replaces only a real folder")
    if holding.final.exists and holding.final.kind != "folder":
        return NodePlan(name, False, free_bytes=holding.free_bytes, problem=f"{holding.final.path} is a file, not a model folder")
    if holding.staging.exists and not holding.staging_owned:
        return NodePlan(name, False, free_bytes=holding.free_bytes, problem=f"{holding.staging.path} exists and was not made by orch")
    want = set(target)
    final = set(holding.final.files)
    if holding.final.exists and final == want:
        return NodePlan(name, True, free_bytes=holding.free_bytes)
    staging = set(holding.staging.files) if holding.staging.exists else set()
    keep, link, receive = [], [], []
    for f in sorted(want):
        if f in staging:
            keep.append(f)
        elif f in final:
            link.append(f)
        else:
            receive.append(f)
    wanted_rels = {f.rel for f in want}
    remove = tuple(sorted(f.rel for f in final if f.rel not in wanted_rels))
    return NodePlan(name, False, tuple(keep), tuple(link), tuple(receive), remove, holding.free_bytes)


def chain_order(plans: Sequence[NodePlan]) -> tuple[str, ...]:
    """Nodes that receive bytes, most bytes first (the given order breaks ties)."""
    receiving = [(i, p) for i, p in enumerate(plans) if p.receive and p.problem is None]
    receiving.sort(key=lambda ip: (-ip[1].receive_bytes, ip[0]))
    return tuple(p.node for _, p in receiving)


def frames(target: Sequence[FileEntry], plans: Sequence[NodePlan], chain: Sequence[str]) -> tuple[Frame, ...]:
    by_node = {p.node: set(p.receive) for p in plans}
    out = []
    for f in sorted(target):
        to = tuple(n for n in chain if f in by_node.get(n, ()))
        if to:
            out.append(Frame(f, to))
    return tuple(out)


def disk_problems(plans: Sequence[NodePlan], store: str) -> tuple[str, ...]:
    return tuple(
        f"{p.node}: needs {_mib(p.needed_bytes)} free in {store} to receive {len(p.receive)} file(s), has {_mib(p.free_bytes)}"
        for p in plans
        if p.problem is None and p.receive and p.free_bytes < p.needed_bytes
    )


def plan_sync(target: Sequence[FileEntry], holdings: Sequence[NodeHolding], store: str) -> SyncPlan:
    """The whole plan; ``problems`` non-empty means nothing may be sent."""
    plans = tuple(plan_node(target, h) for h in holdings)
    chain = chain_order(plans)
    problems = tuple(f"{p.node}: {p.problem}" for p in plans if p.problem) + disk_problems(plans, store)
    return SyncPlan(tuple(sorted(target)), plans, chain, frames(target, plans, chain), problems)


def next_hops(chain: Sequence[str]) -> dict[str, str | None]:
    """Each chain node's downstream neighbour (None at the tail)."""
    return {n: (chain[i + 1] if i + 1 < len(chain) else None) for i, n in enumerate(chain)}


def after(chain: Sequence[str], node: str) -> tuple[str, ...]:
    """The nodes behind ``node`` in the chain (those it forwards to, directly or not)."""
    return tuple(chain[chain.index(node) + 1 :]) if node in chain else ()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"
