"""The one endpoint in front of several models: its Serve application, rendered. Pure.

One model answers on the public route ``/`` itself: Serve's HAProxy sends each request straight to
an engine replica (``node_hooks``: direct streaming, no Python hop). Each further model answers on
its own route (``/_orch/m/<name>``, ``decisions.model_route``), and from the second model on the
front takes ``/v1`` (``FRONT_ROUTE``): Serve LLM's own OpenAI ingress (``OpenAiIngress``) in one replica, with
a Serve handle to each model's engine deployment in that model's application
(``remote/node_programs/orch_serve_hooks.py``: ``build_front``, ``OrchFront``). It picks the model
by the request's ``model``, lists every model on ``/v1/models``, answers 404 naming an unknown one
and checks the API key as vLLM does (the handles skip vLLM's own HTTP app).

Which models it knows and the key are the deployment's ``user_config``: Serve applies a change of
it with ``reconfigure`` on the running replica (``DeploymentVersion.requires_actor_restart`` in
ray/serve/_private/version.py leaves user_config out), so a model added or removed never restarts
the front, and its args, hence its code version, never change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.serve import node_hooks
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER

FRONT_APP = "orch-front"
FRONT_DEPLOYMENT = "OrchFront"
FRONT_IMPORT_PATH = f"{node_hooks.MODULE}:build_front"
# The front's route: ``/v1``. Serve's HAProxy picks the longest matching route prefix
# (ray/serve/_private/haproxy.py sorts its backends longest prefix first), so the OpenAI paths
# go to the front while the first model keeps ``/`` (its /health, /metrics...): no application
# ever moves, and there is no moment when ``/v1`` has nobody (a route swap between two
# applications left one: a request got Serve's "404 Path '/v1/completions' not found").
FRONT_ROUTE = "/v1"
# Where a new front answers until it is RUNNING and proven; then its route becomes FRONT_ROUTE
# (a route change: Serve reconfigures the replica). The probe's base routes: without the /v1.
FRONT_STAGING_ROUTE = "/_orch/front/v1"
FRONT_STAGING_BASE = "/_orch/front"


def is_front(app: Mapping[str, Any]) -> bool:
    return app.get("name") == FRONT_APP or app.get("import_path") == FRONT_IMPORT_PATH


def front_app(cluster: str, models: Mapping[str, tuple[str, str]], route: str, user_pythonpath: str | None = None,
              api_key: str = API_KEY_PLACEHOLDER, adapters: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The front's application. ``models``: served name -> (its application, its engine
    deployment), as Serve names them; ``adapters``: served name -> the LoRA adapters its engine
    serves (a request naming one goes to that model's engine, which knows it by name).
    ``api_key``: the placeholder (to store), or the real key (only in the body of a PUT)."""
    adapters = adapters or {}
    return {
        "name": FRONT_APP,
        "route_prefix": route,
        "import_path": FRONT_IMPORT_PATH,
        "runtime_env": {"env_vars": {"PYTHONPATH": node_hooks.pythonpath(cluster, user_pythonpath)}},
        "args": {"replicas": 1},
        "deployments": [
            {
                "name": FRONT_DEPLOYMENT,
                "user_config": {
                    "models": [{"model_id": m, "app": a, "deployment": d, "adapters": sorted(adapters.get(m, ()))}
                               for m, (a, d) in sorted(models.items())],  # fmt: skip
                    "api_key": [api_key],
                },
            }
        ],
    }


def front_models(app: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    """The models a front's config routes to (served name -> (application, deployment))."""
    out: dict[str, tuple[str, str]] = {}
    for dep in (app or {}).get("deployments") or []:
        if isinstance(dep, Mapping) and dep.get("name") == FRONT_DEPLOYMENT:
            for m in (dep.get("user_config") or {}).get("models") or []:
                out[str(m["model_id"])] = (str(m["app"]), str(m["deployment"]))
    return out


def front_adapters(app: Mapping[str, Any] | None) -> dict[str, tuple[str, ...]]:
    """The LoRA adapters a front's config knows per model (served name -> adapter names)."""
    out: dict[str, tuple[str, ...]] = {}
    for dep in (app or {}).get("deployments") or []:
        if isinstance(dep, Mapping) and dep.get("name") == FRONT_DEPLOYMENT:
            for m in (dep.get("user_config") or {}).get("models") or []:
                out[str(m["model_id"])] = tuple(sorted(str(a) for a in m.get("adapters") or ()))
    return out


def front_key(app: Mapping[str, Any]) -> str | None:
    for dep in app.get("deployments") or []:
        if isinstance(dep, Mapping) and dep.get("name") == FRONT_DEPLOYMENT:
            keys = (dep.get("user_config") or {}).get("api_key") or []
            return str(keys[0]) if keys else None
    return None
