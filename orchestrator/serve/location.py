"""Where the nodes load a model from, and what the planner reads for it. Pure, except that it asks
the file system whether paths exist (the ``exists`` predicate, injected by tests).

``locate`` applies ``orchestrator.plan.model_ref``'s rule to `orch rollout --model`:
- a local path is used as given (made absolute): the nodes load the same path;
- a Hugging Face repo id is loaded by vLLM by id, or from ``<model_store>/<name>`` when the
  manifest sets a model_store (what `orch model sync` makes of a folder named after the repo); the
  planner reads its config from the local Hugging Face cache;
- a catalog name or a bare word is the folder ``<model_store>/<name>``; the planner sizes that
  folder's config.json when it is readable here (``stored_copy``), else the catalog entry;
- the local demo's ``tiny`` (a CPU manifest) is built where it should be when it is not there
  (``build_demo``: the caller's I/O edge builds it, then the planner reads it);
- ``--model-path DIR`` overrides the folder on the nodes; the planner reads DIR when it is
  readable here, else what ``--model`` names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import PlanError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.model_ref import HUB_REF, PATH_REF, ModelRef, local_path_exists, resolve_ref
from orchestrator.plan.tinymodel import SERVED_NAME, default_tiny_dir


@dataclass(frozen=True)
class ModelLocation:
    """``served_name``: the name clients use; ``node_path``: what vLLM loads on the nodes (a path
    or a repo id); ``planner_ref``: what the planner sizes; ``build_demo``: a folder where the
    local demo's model must be built first (then ``planner_ref`` names it)."""

    served_name: str
    node_path: str
    planner_ref: ModelRef
    build_demo: Path | None = None


def _has_config(folder: Path, exists: Callable[[str], bool]) -> bool:
    return exists(str(folder / "config.json"))


def stored_copy(manifest: Manifest | None, ref: ModelRef, exists: Callable[[str], bool] = local_path_exists) -> ModelRef:
    """What the planner reads for ``ref`` on this manifest: the model_store's folder of a catalog
    name or bare word when its config.json is readable here, else ``ref`` itself."""
    if manifest is None or manifest.model_store is None or ref.store_name is None:
        return ref
    folder = Path(manifest.model_store).expanduser() / ref.store_name
    return resolve_ref(str(folder), exists) if _has_config(folder, exists) else ref


def locate(manifest: Manifest, model: str, served_name: str | None = None, model_path: str | None = None,
           exists: Callable[[str], bool] = local_path_exists) -> ModelLocation:  # fmt: skip
    """`orch rollout --model MODEL [--served-name] [--model-path]` -> where the nodes load it from."""
    ref = resolve_ref(model, exists)
    if model_path is not None:
        local = Path(model_path).expanduser()
        planner = resolve_ref(str(local), exists) if _has_config(local, exists) else ref
        return ModelLocation(served_name or ref.store_name or local.name, model_path, planner)
    if ref.kind == HUB_REF:
        if manifest.model_store is not None:
            return ModelLocation(served_name or model, str(Path(manifest.model_store).expanduser() / model.split("/")[1]), ref)
        return ModelLocation(served_name or model, model, ref)
    if ref.kind == PATH_REF:
        assert ref.path is not None
        return ModelLocation(served_name or ref.name, str(ref.path), ref)
    name = ref.store_name or model
    if manifest.model_store is not None:
        folder = Path(manifest.model_store).expanduser() / name
        if name == SERVED_NAME and not exists(str(folder)) and manifest.accelerator == "cpu":
            # the demo model, where the manifest says models live
            return ModelLocation(served_name or name, str(folder), resolve_ref(str(folder), exists), build_demo=folder)
        return ModelLocation(served_name or name, str(folder), stored_copy(manifest, ref, exists))
    if name == SERVED_NAME:
        folder = default_tiny_dir()
        return ModelLocation(served_name or name, str(folder), resolve_ref(str(folder), exists), build_demo=folder)
    raise PlanError(
        f"model {model!r} has no path: the manifest sets no model_store",
        hint=f"set model_store in {manifest.source_path or 'the manifest'} (models live in <model_store>/<name>) or pass --model /path/on/the/nodes",
    )
