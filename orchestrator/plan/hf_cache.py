"""Hugging Face repo ids as model references, and their files in the local Hugging Face cache.

Owns the lookup of a repo's ``config.json`` in the cache layout ``huggingface_hub`` writes (when
``--model`` is a repo id is ``orchestrator.plan.model_ref``'s rule):
``<cache>/models--<org>--<name>/refs/main`` holds the commit, whose files are in
``<cache>/models--<org>--<name>/snapshots/<commit>/``. The cache is ``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``
(``huggingface_hub/constants.py``). Reads the file system only (the download, when the network
is allowed, is ``orchestrator.workflows.hf_fetch``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from orchestrator.errors import ModelSpecError

_TRUE = ("1", "ON", "YES", "TRUE")


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def hub_offline(env: Mapping[str, str]) -> bool:
    return env.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def repo_folder(repo_id: str, env: Mapping[str, str]) -> Path:
    return hub_cache_dir(env) / ("models--" + repo_id.replace("/", "--"))


def cached_snapshot(repo_id: str, env: Mapping[str, str], revision: str = "main") -> Path | None:
    """The snapshot folder holding the repo's config.json (``refs/<revision>``'s commit; without
    that ref, the only snapshot that has a config.json), or None when the cache does not have it."""
    folder = repo_folder(repo_id, env)
    ref = folder / "refs" / revision
    try:
        if ref.is_file():
            commit = ref.read_text(encoding="utf-8").strip()
            snap = folder / "snapshots" / commit
            return snap if re.fullmatch(r"[0-9A-Za-z._-]{1,100}", commit) and (snap / "config.json").is_file() else None
        snaps = [p for p in (folder / "snapshots").iterdir() if (p / "config.json").is_file()] if (folder / "snapshots").is_dir() else []
    except OSError:
        return None
    return snaps[0] if len(snaps) == 1 else None


def not_cached_error(repo_id: str, env: Mapping[str, str], why: str | None = None) -> ModelSpecError:
    cache = hub_cache_dir(env)
    reason = why or ("HF_HUB_OFFLINE is set" if hub_offline(env) else "it was not downloaded")
    return ModelSpecError(
        f"{repo_id}: no config.json of this Hugging Face repo in the cache {cache} ({reason})",
        hint=f"download it where this machine can reach the Hub (`huggingface-cli download {repo_id} config.json`), "
        "point HF_HOME or HF_HUB_CACHE at a cache that has it, or pass the local folder or config.json",
    )
