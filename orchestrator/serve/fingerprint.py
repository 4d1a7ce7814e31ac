"""What makes two Serve configs the same revision, and the API key kept out of everything stored or
printed. Pure.

``config_fingerprint`` is what makes a rollout idempotent: the config without its name and route
(they change with each side-by-side revision) and without the nodes a stage happens to be pinned
to, plus a digest of the API key (a rotated key is a new revision). ``mask_api_key`` replaces the
key wherever a config or a Serve status could carry it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from orchestrator.cluster.ray_nodes import NODE_RESOURCE_PREFIX
from orchestrator.serve.placement import NODE_PIN_KEY
from orchestrator.serve.shapes import effective_app, llm_configs

API_KEY_PLACEHOLDER = "<redacted>"


def mask_api_key(obj: Any) -> Any:
    """A copy of any config/status structure with every ``api_key`` value replaced."""
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if key == "api_key" and value:
                # Always the list form vLLM needs (the state store writes its own string marker).
                out[key] = [API_KEY_PLACEHOLDER]
            else:
                out[key] = mask_api_key(value)
        return out
    if isinstance(obj, list):
        return [mask_api_key(v) for v in obj]
    return obj


def key_digest(api_key: str | None) -> str | None:
    if not api_key:
        return None
    return hashlib.sha256(("orch-api-key:" + api_key).encode()).hexdigest()[:16]


def config_fingerprint(app: Mapping[str, Any], api_key: str | None = None) -> str:
    """sha256 of what the revision serves: the config without its name/route, plus a key digest.

    The app name and route change with each revision (side-by-side rollout) and must not make
    an identical config look new; a rotated API key must.
    """
    # A replica count given as an app-level override (a count-only change: config.with_replicas)
    # serves the same as one in the model config.
    body = {k: v for k, v in effective_app(mask_api_key(app)).items() if k not in ("name", "route_prefix")}
    # How Serve rolls to the config (the surge of app-level overrides: 0 for an in-place change,
    # serve.config.with_max_surge) is not what the revision serves.
    if isinstance(body.get("deployments"), list):
        entries = [{k: v for k, v in e.items() if k != "max_surge_percent"} if isinstance(e, Mapping) else e for e in body["deployments"]]
        entries = [e for e in entries if not (isinstance(e, Mapping) and set(e) == {"name"})]
        if entries:
            body["deployments"] = entries
        else:
            body.pop("deployments")
    # Which nodes the stages are pinned to depends on what is free at the time (a side-by-side
    # copy lands on other nodes): the layout counts, not the node names.
    for cfg in llm_configs(body):
        pg = cfg.get("placement_group_config") or {}
        if pg.get("bundles"):
            pg["bundles"] = [
                {(NODE_PIN_KEY if str(k).startswith(NODE_RESOURCE_PREFIX) else k): v for k, v in b.items()}
                for b in pg["bundles"]
            ]
    blob = json.dumps({"app": body, "key": key_digest(api_key)}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()
