"""The front's part of a rollout or a removal: keep one endpoint in front of every served model.
I/O only through the Serve API and the endpoint (``rollout_steps``); the rendering is
``serve/front.py``.

After a model passed its readiness probe on its own application (and before its revision is
recorded ready), ``settle_front`` makes the front route to every model that serves then:

- one model and no front: nothing (the model answers on ``/`` itself);
- a second model and no front yet: the front comes up on its staging route beside everything
  (one PUT; no application changes), answers a completion for every model there, then one PUT
  gives it ``/v1`` (a route change: Serve reconfigures the replica); the first model keeps ``/``,
  so ``/v1`` always has someone to answer; every model must then answer through ``/v1``;
- a front already: its ``user_config`` takes the new list (Serve reconfigures its replica);
  the model must answer through ``/``.

``front_without`` is the removal's side: the front routes to the models left; it goes when none is
left, or when the one left answers on ``/`` itself.

A failure raises, and the rollout puts back what ran before it (the other models' applications
and the front exactly as they were).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.manifest.model import Manifest
from orchestrator.serve.config import PUBLIC_ROUTE
from orchestrator.serve.front import (
    FRONT_APP,
    FRONT_ROUTE,
    FRONT_STAGING_BASE,
    FRONT_STAGING_ROUTE,
    front_adapters,
    front_app,
    front_key,
    front_models,
    is_front,
)
from orchestrator.serve.lora import adapters_of
from orchestrator.serve.shapes import engine_deployment_name, llm_configs, model_id_of
from orchestrator.workflows.rollout_steps import (
    ClusterApis,
    Progress,
    RolloutOptions,
    ServingDeps,
    check_ready,
    put,
    wait_for_app,
)


def served_name_of_app(app: Mapping[str, Any]) -> str:
    return model_id_of(app) or str(app.get("name"))


def models_of(apps: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str]]:
    """Served name -> (application, engine deployment) of every model application in ``apps``
    (an application with no model config, not orch's, is none)."""
    return {served_name_of_app(a): (str(a["name"]), engine_deployment_name(a)) for a in apps if not is_front(a) and llm_configs(a)}


def adapters_in(apps: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Served name -> the LoRA adapters its application's engine serves (names, sorted)."""
    return {served_name_of_app(a): tuple(sorted(x.name for x in adapters_of(a)))
            for a in apps if not is_front(a) and llm_configs(a)}  # fmt: skip


def settle_front(manifest: Manifest, apis: ClusterApis, deps: ServingDeps, options: RolloutOptions, step: Progress,
                 kept: Sequence[dict], mine: dict, api_key: str) -> None:  # fmt: skip
    """Make the front route to every model once ``mine`` (the model's application as it serves,
    real key included) serves beside ``kept`` (the other applications as Serve runs them); no
    model's application changes. See the module doc."""
    front = next((a for a in kept if is_front(a)), None)
    apps = [a for a in kept if not is_front(a)] + [mine]
    models, adapters = models_of(apps), adapters_in(apps)
    user_pythonpath = manifest.env.get("PYTHONPATH")
    if front is None and len(models) < 2:
        return
    if front is not None:
        if front_models(front) == models and front_adapters(front) == adapters:
            return
        updated = front_app(manifest.name, models, str(front.get("route_prefix") or FRONT_ROUTE), user_pythonpath, api_key, adapters)
        since = _deployed_at(apis, FRONT_APP)
        put(apis.serve, [*apps, updated], manifest)
        step(f"the front ({FRONT_APP}) on {updated['route_prefix']} now routes to {', '.join(sorted(models))}")
        wait_for_app(apis.serve, FRONT_APP, options.timeout_s, deps, options.poll_s, since=since)
        check_ready(apis, _base(updated["route_prefix"]), served_name_of_app(mine), api_key, deps, options)
        return
    staged = front_app(manifest.name, models, FRONT_STAGING_ROUTE, user_pythonpath, api_key, adapters)
    put(apis.serve, [*apps, staged], manifest)
    step(f"a second model serves: the front ({FRONT_APP}) comes up on {FRONT_STAGING_ROUTE} to route by the request's model")
    wait_for_app(apis.serve, FRONT_APP, options.timeout_s, deps, options.poll_s)
    for name in sorted(models):
        check_ready(apis, FRONT_STAGING_BASE, name, api_key, deps, options)
    public = front_app(manifest.name, models, FRONT_ROUTE, user_pythonpath, api_key, adapters)
    since = _deployed_at(apis, FRONT_APP)
    put(apis.serve, [*apps, public], manifest)
    routes = ", ".join(f"'{served_name_of_app(a)}' on {a['route_prefix']}" for a in apps)
    step(f"the front takes {FRONT_ROUTE} (every model through the request's model field); the models keep their routes: {routes}")
    wait_for_app(apis.serve, FRONT_APP, options.timeout_s, deps, options.poll_s, since=since)
    for name in sorted(models):
        check_ready(apis, PUBLIC_ROUTE, name, api_key, deps, options)


def _base(route: str) -> str:
    """The route a probe adds ``/v1/completions`` to, for the front's route prefix."""
    return route[: -len(FRONT_ROUTE)] or PUBLIC_ROUTE if route.endswith(FRONT_ROUTE) else route


def _deployed_at(apis: ClusterApis, name: str) -> float | None:
    app = apis.serve.status().app(name)
    return app.last_deployed_time_s if app is not None else None


def front_without(kept: Sequence[dict], manifest: Manifest) -> list[dict]:
    """``kept`` (the applications that stay, as Serve runs them) with the front routing to the
    models left in it. With one model left on ``/`` the front goes (``/v1`` falls back to that
    model's own route ``/``: no gap); a model left on its own route keeps the front; with none
    left the front goes."""
    models = models_of(kept)
    alone_on_root = len(models) == 1 and any(a.get("route_prefix") == PUBLIC_ROUTE for a in kept if not is_front(a) and llm_configs(a))
    out: list[dict] = []
    for app in kept:
        if not is_front(app):
            out.append(app)
        elif models and not alone_on_root:
            out.append(front_app(manifest.name, models, str(app.get("route_prefix") or FRONT_ROUTE),
                                 manifest.env.get("PYTHONPATH"), front_key(app) or "", adapters_in(kept)))  # fmt: skip
    return out
