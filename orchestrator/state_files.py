"""The per-cluster files beside orch's database, under ``<state_dir>/clusters/<name>/``: revision
details, the node facts `orch up` probed, the last collective check, the Ray token and the
cluster id (both 0600). Does I/O; every write is atomic (temp file, fsync, rename) and a full
disk is a DiskFullError (exit 5). ``StateStore`` (``orchestrator.state``) inherits these."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import StateError
from orchestrator.local_disk import disk_full, is_disk_full, write_secret


class ClusterFiles:
    """Files of each cluster; needs ``state_dir`` and ``_clock`` from the class that uses it."""

    state_dir: Path
    _clock: Callable[[], float]

    def cluster_dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad cluster name for a folder: {name!r}")
        return self.state_dir / "clusters" / name

    def revision_meta_path(self, cluster: str, number: int) -> Path:
        return self.cluster_dir(cluster) / "revisions" / f"{int(number)}.json"

    def save_revision_meta(self, cluster: str, number: int, meta: Mapping[str, Any]) -> None:
        """A revision's details (JSON), replaced atomically: a reader sees the old or the new file."""
        write_atomic(self.revision_meta_path(cluster, number), json.dumps(dict(meta), indent=1, sort_keys=True, default=str))

    def revision_meta(self, cluster: str, number: int) -> dict[str, Any] | None:
        """A revision's details; None when the file is missing or unreadable (callers must not
        take a lost file for "nothing was recorded")."""
        try:
            data = json.loads(self.revision_meta_path(cluster, number).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def facts_path(self, name: str) -> Path:
        """The node facts (JSON) that the last `orch up` of the cluster probed."""
        return self.cluster_dir(name) / "facts.json"

    def save_facts(self, name: str, facts: Mapping[str, Mapping[str, Any]]) -> None:
        """Keep what `orch up` probed (node name -> ``NodeFacts.to_dict()``) for the planner."""
        write_atomic(self.facts_path(name), json.dumps({"probed_at": self._clock(), "nodes": dict(facts)}, default=str))

    def env_digests_path(self, name: str) -> Path:
        return self.cluster_dir(name) / "env-digests.json"

    def save_env_digests(self, name: str, digests: Mapping[str, str]) -> None:
        """Keyed digests of the environment `orch up` started each node with (the recorded
        manifest has its values redacted): the next `up` tells which node's env changed."""
        write_atomic(self.env_digests_path(name), json.dumps(dict(digests), sort_keys=True))

    def load_env_digests(self, name: str) -> dict[str, str] | None:
        try:
            data = json.loads(self.env_digests_path(name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None

    def load_facts(self, name: str) -> dict[str, dict[str, Any]] | None:
        try:
            data = json.loads(self.facts_path(name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        nodes = data.get("nodes") if isinstance(data, dict) else None
        return nodes if isinstance(nodes, dict) else None

    def collective_path(self, name: str) -> Path:
        """The figures of the last collective check of the cluster (JSON)."""
        return self.cluster_dir(name) / "collective.json"

    def save_collective(self, name: str, report: Mapping[str, Any]) -> None:
        """Keep the last collective check (``CollectiveReport.to_dict()``) for `orch status`."""
        write_atomic(self.collective_path(name), json.dumps({"checked_at": self._clock(), **dict(report)}, default=str))

    def load_collective(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.collective_path(name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def token_path(self, name: str) -> Path:
        """Where the cluster's Ray auth token lives locally (mode 0600)."""
        return self.cluster_dir(name) / "ray-token"

    def read_token(self, name: str) -> str | None:
        path = self.token_path(name)
        try:
            return path.read_text().strip() or None
        except FileNotFoundError:
            return None

    def cluster_id_path(self, name: str) -> Path:
        """The cluster's random id (``ORCH_CLUSTER_ID`` of its processes; what `orch down` kills by)."""
        return self.cluster_dir(name) / "cluster-id"

    def read_cluster_id(self, name: str) -> str | None:
        try:
            return self.cluster_id_path(name).read_text().strip() or None
        except FileNotFoundError:
            return None

    def ensure_cluster_id(self, name: str, generate: Callable[[], str]) -> str:
        """The cluster's id, made once with ``generate`` and kept (a restart keeps its processes' tag)."""
        existing = self.read_cluster_id(name)
        if existing:
            return existing
        cid = generate()
        write_secret(self.cluster_id_path(name), cid)
        return cid

    def ensure_token(self, name: str, generate: Callable[[], str]) -> str:
        """The cluster's token, created once with ``generate`` and written 0600 (never rewritten)."""
        existing = self.read_token(name)
        if existing:
            return existing
        token = generate()
        write_secret(self.token_path(name), token)
        return token


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temp file in the same folder (fsynced, then
    renamed): a crash leaves the old file or the new one, never a truncated one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(path, exc) from exc
        raise StateError(f"cannot write {path}: {exc.strerror or exc}", hint="check the state folder's permissions") from exc
    finally:
        tmp.unlink(missing_ok=True)
