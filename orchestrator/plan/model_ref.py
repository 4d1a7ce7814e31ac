"""What `--model` names: a catalog entry, a local path, a Hugging Face repo id or a folder of the
manifest's model_store. The one rule `orch plan`, `orch rollout` and `orch model sync` share.

``resolve_ref(text)`` classifies; it asks the file system only whether a path exists (the
``exists`` predicate, injected by tests). The precedence, first match wins:

0. refused: empty text, text with spaces around it or control characters, a URL
   (``scheme://...``): a Hub page's URL is no repo id, ``org/name`` is;
1. a catalog name, exactly or in another case (``LLAMA3-8B``): catalog names are bare words, so a
   folder here named like one is written ``./llama3-8b``;
2. text in path syntax (a ``/`` anywhere, a leading ``.`` or ``~``, a ``.json`` ending) that
   exists here: that local path, even when it is shaped like a repo id (a folder ``org/name``);
3. ``org/name`` in the Hub's repo-id shape (``huggingface_hub.utils.validate_repo_id``): a repo id;
4. any other path syntax: a local path that does not exist (reading it says so; ``..`` is the
   parent folder, ``org/../x`` no repo id);
5. a bare word: a folder of the manifest's model_store (``<model_store>/<name>``), never a folder
   here, whatever the current directory holds.

``spec_for_ref`` reads what a reference names into a ``ModelSpec`` (the config.json; a repo id's
from the local Hugging Face cache, ``orchestrator.plan.hf_cache``). Reads files, no network.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import CATALOG, ModelSpec, closest_name, spec_from_files
from orchestrator.plan.hf_cache import cached_snapshot, not_cached_error

RefKind = Literal["catalog", "path", "hub", "store"]
CATALOG_REF: RefKind = "catalog"
PATH_REF: RefKind = "path"
HUB_REF: RefKind = "hub"
STORE_REF: RefKind = "store"

# The Hub's repo-id shape (huggingface_hub.utils.validate_repo_id): [\w.-] names of at most 96
# characters, not starting with . or -, no "--" or "..".
_REPO_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_HINT = "pass a catalog name, a Hugging Face repo id (org/name), a model folder or its config.json, or a folder name of the model_store"


@dataclass(frozen=True)
class ModelRef:
    """What ``--model TEXT`` names. ``name``: the catalog key, the repo id, the store folder's name
    or the path's last component; ``path``: the absolute local path (kind "path" only)."""

    kind: RefKind
    text: str
    name: str
    path: Path | None = None

    @property
    def store_name(self) -> str | None:
        """The folder of the model_store this names (a catalog name or a bare word, as written),
        else None."""
        return self.text if self.kind in (CATALOG_REF, STORE_REF) else None


def _path_syntax(text: str) -> bool:
    return "/" in text or text.startswith((".", "~")) or text.endswith(".json")


def _repo_id_shape(text: str) -> bool:
    return bool(_REPO_ID.match(text)) and "--" not in text and ".." not in text and not text.endswith((".json", ".git"))


def local_path_exists(path: str) -> bool:
    """Whether ``path`` (``~`` expanded) exists on this machine: the default ``exists`` predicate."""
    return os.path.exists(os.path.expanduser(path))


def resolve_ref(text: str, exists: Callable[[str], bool] = local_path_exists) -> ModelRef:
    """``--model TEXT`` -> what it names, by the precedence in the module docstring."""
    if not text.strip():
        raise ModelSpecError("--model is empty", hint=_HINT)
    if text != text.strip() or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ModelSpecError(f"--model {text!r}: spaces around it or control characters", hint=_HINT)
    if _URL.match(text):
        raise ModelSpecError(f"--model {text}: a URL is not a model reference",
                             hint="pass the Hugging Face repo id (org/name), or the folder you downloaded it to")  # fmt: skip
    if text in CATALOG:
        return ModelRef(CATALOG_REF, text, text)
    if text.lower() in CATALOG:
        return ModelRef(CATALOG_REF, text, text.lower())
    if _path_syntax(text):
        if not exists(text) and _repo_id_shape(text):
            return ModelRef(HUB_REF, text, text)
        path = Path(os.path.abspath(os.path.expanduser(text)))
        return ModelRef(PATH_REF, text, path.name, path)
    return ModelRef(STORE_REF, text, text)


def spec_for_ref(ref: ModelRef, env: Mapping[str, str] = os.environ) -> ModelSpec:
    """The ModelSpec of what ``ref`` names: the catalog entry, the config.json of a local folder
    (or the file itself) with ModelOpt's hf_quant_config.json beside it, or a repo id's config.json
    from the local Hugging Face cache. A store name is sized only from its folder (the caller
    passes that as a path ref); alone it is an unknown model, named with the closest catalog name."""
    if ref.kind == CATALOG_REF:
        return CATALOG[ref.name]
    if ref.kind == HUB_REF:
        snapshot = cached_snapshot(ref.name, env)
        if snapshot is None:
            raise not_cached_error(ref.name, env)
        return spec_from_files(snapshot / "config.json", ref.name)
    if ref.kind == STORE_REF:
        guess = closest_name(ref.name)
        did_you_mean = f"; did you mean '{guess}'?" if guess else ""
        here = f"; for the folder {ref.name} here write ./{ref.name}" if local_path_exists(ref.name) else ""
        raise ModelSpecError(
            f"unknown model '{ref.name}'{did_you_mean}{here} (catalog: {', '.join(CATALOG)})",
            hint="pass a catalog name, a folder name of the model_store of a cluster that has one, "
            "or the path of a local Hugging Face model folder or its config.json",
        )
    path = Path(ref.text).expanduser()  # as given, so that errors name the path the user wrote
    config_path = path / "config.json" if path.is_dir() else path
    name = path.name if path.is_dir() else path.parent.name or str(config_path)
    return spec_from_files(config_path, name)


def resolve_model(name_or_path: str | Path) -> ModelSpec:
    """A catalog name, a local Hugging Face model folder, a config.json path, or a Hugging Face
    repo id found in the local Hugging Face cache -> ModelSpec (``resolve_ref`` + ``spec_for_ref``).
    Raises ``ModelSpecError`` naming the catalog and the closest name for an unknown name, or the
    missing field and the file for a config orch cannot size."""
    return spec_for_ref(resolve_ref(str(name_or_path)))
