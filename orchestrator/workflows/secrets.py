"""Secrets in a Serve application config: put them back at apply time, never deploy a placeholder.
Pure functions at the edge where a stored config (``orchestrator.state``) meets the manifest and
the command's environment.

orch stores every revision's config with secret-looking values replaced by ``<redacted>``
(``state.redact_secrets``: HF_TOKEN, *_API_KEY, *_TOKEN, ...). A rollback or an automatic restore
re-applies such a stored config, so before any PUT:

- ``fill_secrets``: each placeholder in ``runtime_env.env_vars`` takes the value of the same name
  from the manifest's ``env`` (what a fresh rollout renders), else from the environment of the
  orch command;
- ``placeholder_paths``: whatever still holds a placeholder is named, and the caller refuses to
  apply it (a replica started with ``HF_TOKEN=<redacted>`` fails, or worse, half-works).

The endpoint's own key (``engine_kwargs.api_key``) is not one of these: it is never stored, and
``RenderedApp.with_api_key`` sets it for the body of the PUT only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.serve.config import RenderedApp
from orchestrator.serve.desired import Desired
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, mask_api_key
from orchestrator.serve.shapes import config_paths
from orchestrator.state import REDACTED, redact_secrets

PLACEHOLDERS = frozenset({REDACTED, API_KEY_PLACEHOLDER})
# Where the endpoint's key sits, in every application shape (serve.shapes).
API_KEY_PATHS = frozenset(f"{path}.engine_kwargs.api_key" for path in config_paths())


def _is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and value in PLACEHOLDERS


def fill_secrets(app: Mapping[str, Any], manifest_env: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``app`` whose redacted ``runtime_env.env_vars`` values are taken from the
    manifest's env (when it holds a real value) or else the command's environment; values
    neither has stay placeholders (see ``placeholder_paths``)."""
    out = copy.deepcopy(dict(app))
    env_vars = (out.get("runtime_env") or {}).get("env_vars")
    if not isinstance(env_vars, dict):
        return out
    for key, value in env_vars.items():
        if not _is_placeholder(value):
            continue
        declared = manifest_env.get(key)
        if declared is not None and not _is_placeholder(str(declared)):
            env_vars[key] = str(declared)
        elif environ.get(key):
            env_vars[key] = environ[key]
    return out


def placeholder_paths(obj: Any, skip: frozenset[str] = frozenset(), _path: str = "") -> list[str]:
    """Dotted paths of every value (or list item) that is a secret placeholder, minus ``skip``."""
    found: list[str] = []
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            path = f"{_path}.{key}" if _path else str(key)
            found.extend(placeholder_paths(value, skip, path))
    elif isinstance(obj, list):
        if any(_is_placeholder(v) for v in obj) and _path not in skip:
            found.append(_path)
        for i, value in enumerate(obj):
            if not _is_placeholder(value):
                found.extend(placeholder_paths(value, skip, f"{_path}[{i}]"))
    elif _is_placeholder(obj) and _path not in skip:
        found.append(_path)
    return found


def unfilled(app: Mapping[str, Any]) -> list[str]:
    """The placeholders of a config about to be completed with the API key (the key's own
    placeholder is expected there)."""
    return placeholder_paths(app, skip=API_KEY_PATHS)


def for_display(obj: Any) -> Any:
    """A copy safe to print or return: every secret-looking value redacted, the API key in the
    list form vLLM takes (``[<redacted>]``)."""
    return mask_api_key(redact_secrets(obj))


def with_secrets(desired: Desired, manifest: Manifest, environ: Mapping[str, str]) -> Desired:
    """A stored config (rollback) gets its redacted secrets back; any left is refused."""
    app = fill_secrets(desired.rendered.app, manifest.env, environ)
    left = unfilled(app)
    if left:
        raise UsageError(
            f"the config to deploy holds redacted secrets orch does not keep: {', '.join(left)}",
            hint="export them (or set them in the manifest's env); orch never deploys a <redacted> placeholder",
        )
    return replace(desired, rendered=RenderedApp(app=app, stage_nodes=desired.rendered.stage_nodes, notes=desired.rendered.notes))
