"""Which models a cluster serves, each as its own Serve application. Reads the state store and
Serve's status; no other I/O.

Every served name (what requests name in ``model``) has its own revisions and its own Serve
application (``serve/decisions.py``: ``public_app_name``, ``model_route``). The model a served
name stands for is its newest ``ready`` revision. A command on one model (rollout, rollback,
remove, the repair of an interrupted rollout) sends Serve one PUT of every application that
should exist, so it carries every other model's application exactly as Serve runs it (its
deployed config, secrets and key included): Serve then changes nothing in them, and their
replicas keep serving, not restarted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ServeError
from orchestrator.serve import decisions
from orchestrator.serve.desired import Desired
from orchestrator.serve.front import FRONT_APP
from orchestrator.serve.ray_io.client import AppStatus, ServeStatus
from orchestrator.serve.shapes import model_id_of
from orchestrator.state import Revision, StateStore
from orchestrator.workflows.secrets import fill_secrets, unfilled


def served_name_of(state: StateStore, cluster: str, revision: Revision) -> str:
    """The model name a revision served under (what requests name in ``model``)."""
    meta = state.revision_meta(cluster, revision.number) or {}
    return str(meta.get("served_name") or model_id_of(revision.config) or revision.model)


def served_app_name(state: StateStore, revision: Revision) -> str | None:
    """The Serve application a revision serves as: the database's column, else (a revision
    recorded before the column existed) its meta file; None when neither says."""
    if revision.app_name:
        return revision.app_name
    meta = state.revision_meta(revision.cluster, revision.number) or {}
    name = meta.get("app_name")
    return name if isinstance(name, str) and name else None


def serving_by_name(state: StateStore, cluster: str) -> dict[str, Revision]:
    """Served name -> the revision that serves it (the newest ``ready`` one of that name)."""
    out: dict[str, Revision] = {}
    for rev in state.list_revisions(cluster):  # oldest first: a newer ready one of a name wins
        if rev.status == "ready":
            out[served_name_of(state, cluster, rev)] = rev
    return out


def current_of(state: StateStore, cluster: str, served_name: str | None) -> Revision | None:
    """The revision serving ``served_name``; None: the newest ready revision of any name."""
    if served_name is None:
        return state.current_revision(cluster)
    return serving_by_name(state, cluster).get(served_name)


@dataclass(frozen=True)
class OtherModels:
    """The applications of every model but one, as Serve runs them now."""

    names: Mapping[str, str] = field(default_factory=dict)  # served name -> its application's name
    apps: Mapping[str, AppStatus] = field(default_factory=dict)  # application name -> Serve's status (those Serve lists)

    @property
    def routes(self) -> set[str]:
        return {a.route_prefix for a in self.apps.values() if a.route_prefix}

    def configs(self, env: Mapping[str, Any], environ: Mapping[str, str]) -> list[dict]:
        """Their deployed configs, to PUT again unchanged. ServeError when Serve reports none for
        one (a PUT without it would delete it) or a secret in one cannot be put back."""
        out = []
        for name, app in sorted(self.apps.items()):
            if not app.deployed_config:
                raise ServeError(f"Serve reports no deployed config for {name}: a PUT without it would delete it",
                                 hint="orch status; try again once Serve reports it")  # fmt: skip
            config = fill_secrets(app.deployed_config, env, environ)
            left = unfilled(config)
            if left:
                raise ServeError(f"{name} runs with redacted secrets orch cannot put back: {', '.join(left)}",
                                 hint="export them (or set them in the manifest's env) and rerun")  # fmt: skip
            out.append(config)
        return out


def other_models(state: StateStore, cluster: str, status: ServeStatus, served_name: str | None) -> OtherModels:
    """Every served model but ``served_name`` (None: no other model: the one-model view)."""
    if served_name is None:
        return OtherModels()
    names: dict[str, str] = {}
    for name, rev in serving_by_name(state, cluster).items():
        app = served_app_name(state, rev)
        if name != served_name and app:
            names[name] = app
    # The front (serve/front.py) is carried like another model's application.
    apps = {n: a for n, a in status.applications.items() if n in names.values() or n == FRONT_APP}
    return OtherModels(names, apps)


def place(served_name: str, serving: decisions.Serving, status: ServeStatus, others: OtherModels) -> tuple[str, str]:
    """The model's application name and route. A model that serves keeps both (a new name would
    be a new application, started from nothing; a new route would move its clients); an older
    orch's ``orch-r<N>`` is replaced by the stable name. A new model gets ``public_app_name`` and
    ``model_route`` beside the other models' applications."""
    live = status.app(serving.app_name) if serving.app_name else None
    if serving.app_name and decisions.revision_of_app(serving.app_name) is None:
        name = serving.app_name
    else:
        name = decisions.public_app_name(served_name, set(others.names.values()) | set(others.apps))
    if live is not None and live.route_prefix:
        return name, live.route_prefix
    return name, decisions.model_route(served_name, others.routes)


def no_room(desired: Desired, others: OtherModels, nodes: list) -> tuple[str, str]:
    """Why a new model does not fit beside the others: what it asks for, what is free, and what
    each other model's application holds (exit 2)."""
    need = decisions.copy_total(desired.rendered.app)
    free = decisions.free_resources(nodes)
    held = []
    for served, app_name in sorted(others.names.items()):
        app = others.apps.get(app_name)
        if app is not None and app.deployed_config:
            held.append(f"'{served}' ({app_name}) holds {_describe(decisions.copy_total(app.deployed_config))}")
    message = (f"'{desired.served_name}' does not fit beside the models this cluster serves: it needs {_describe(need)}, "
               f"free now: {'; '.join(f'{n}: {_describe(f)}' for n, f in free.items()) or 'nothing'}; "
               + ("; ".join(held) or "held by " + ", ".join(sorted(others.names))))  # fmt: skip
    return message, "free capacity with `orch remove NAME`, give the model fewer replicas or a smaller plan, or add nodes (orch up)"


def _describe(resources: Mapping[str, float]) -> str:
    """``CPU 2, GPU 1`` (Ray's resources orch places by; node pins and memory left out)."""
    shown = [f"{res} {amount:g}" for res, amount in sorted(resources.items()) if res in ("CPU", "GPU") and amount > 0]
    return ", ".join(shown) or "no CPU or GPU"


def capacity(manifest: Any, state: StateStore) -> dict[str, Any]:
    """What the served models hold of the cluster (``orch plan --cluster``): the manifest's GPUs
    and Ray CPUs in all, each model's placement groups as its serving revision rendered them
    (``decisions.copy_demand``: replicas x bundles, the replica actor's CPU included), and what is
    left. From the record, without asking Ray (``orch status`` shows what runs now)."""
    total: dict[str, float] = {"GPU": float(sum(n.gpus for n in manifest.nodes))}
    cpus = [n.ray_cpus(manifest) for n in manifest.nodes]
    if all(c is not None for c in cpus):
        total["CPU"] = float(sum(c for c in cpus if c is not None))
    held: list[dict[str, Any]] = []
    for name, rev in sorted(serving_by_name(state, manifest.name).items()):
        try:
            used = decisions.copy_total(rev.config)
        except KeyError:  # a config with no model in it (an older record): nothing known
            continue
        held.append({"served_name": name, "revision": rev.number, "application": served_app_name(state, rev),
                     "resources": {r: used.get(r, 0.0) for r in total}})  # fmt: skip
    free = {r: total[r] - sum(h["resources"][r] for h in held) for r in total}
    return {"total": total, "held": held, "free": free}


def describe_capacity(cap: Mapping[str, Any]) -> str:
    """One line: ``CPU 24, GPU 0 in all; 'tiny' (revision 3) holds CPU 2; free: CPU 22``."""
    held = "; ".join(f"'{h['served_name']}' (revision {h['revision']}) holds {_describe(h['resources'])}" for h in cap["held"])
    return f"{_describe(cap['total'])} in all; {held or 'no model served'}; free: {_describe(cap['free'])}"
