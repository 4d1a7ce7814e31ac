"""Rollout decisions: desired vs recorded revision -> what to do, and whether a copy fits. Pure.

``decide`` compares the desired config (its fingerprint) with the revision that is serving and
with what Serve runs now, and picks one of:

- ``noop``: the serving revision has the same fingerprint and its application is RUNNING.
- ``fresh``: nothing serves yet (first rollout, or Serve lost the app): deploy on the public route.
  A fresh deploy replaces every application Serve runs, so it is refused while any of them is
  RUNNING (unless ``--allow-downtime``), and whenever the serving revision's application name is
  unknown (a lost record must not read as "nothing serves").
- ``side_by_side``: the cluster has room for a second copy: the new revision comes up as a
  candidate application on its own route and must answer a real completion there; then the live
  application takes the new config and Serve rolls it with a surge (the new replica beside the
  old one, the old one stopped once the new one is healthy). The public route and its router
  never change hands, so no request fails during the change; a failure before the switch leaves
  the old revision untouched.
- ``scale``: the desired config is the serving revision's with only its fixed replica count
  changed (``replica_change``): the live application takes the new count as an app-level
  override (``serve.config.with_replicas``), which Serve applies without a new code version: it
  adds or stops replicas and the ones serving keep running. More replicas need room for the added
  ones (else ``refuse``). Not for a data-parallel application, whose groups start together.
- ``adapters``: the desired config is the serving revision's with only its runtime LoRA adapters
  changed (``light_change``; ``serve.lora``): the live application takes the new list as its engine
  deployment's ``user_config``, which Serve applies with ``reconfigure`` on every running replica
  (no new code version): each loads the added adapters into its engine and unloads the removed
  ones; nothing restarts. With a replica count changed as well it is ``scale``. An engine without
  LoRA slots, or whose slots change (``--max-loras``, a larger ``--max-lora-rank``), needs a new
  engine: a full revision, noted as such (``lora_restart``).
- ``in_place``: no room for a second copy and ``--allow-downtime`` was given: the public
  application is updated in place without a surge (the old replica stops, then the new one
  starts: ``serve.config.with_max_surge``); the downtime is about one cold load (estimated).

Names: each served name is its own application (``public_app_name``: the first ``orch``, each
further one ``orch-m-<slug>``), whatever revision it serves; a candidate is
``candidate_app_name(N)`` (``orch-rN``) on ``candidate_route(N)``. ``beside`` notes a model that
comes up beside others.
- ``refuse``: no room and no ``--allow-downtime``: say so with the downtime estimate. The same when
  the new revision changes the engine deployment's kind (a tensor-parallel application becoming a
  data-parallel one, or back: ``engine_change``), which Serve cannot roll with a surge.

``fits`` simulates Ray's placement of a copy's placement groups (one per replica; one per group of
a data-parallel application, whose ranks Serve reserves together) on the free resources per node: STRICT_PACK puts a group on one node, PACK fills nodes in order, a bundle
pinned with a node resource goes only to that node. ``estimate_cold_load_s`` gives the downtime
of an in-place change: the last measured cold load of the model, else weights / disk throughput
plus an engine start-up constant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.serve.fingerprint import config_fingerprint
from orchestrator.serve.lora import lora_slots, runtime_adapters, with_runtime_adapters
from orchestrator.serve.shapes import effective_app, llm_config_of, shape_of_app

NOOP = "noop"
FRESH = "fresh"
SIDE_BY_SIDE = "side_by_side"
IN_PLACE = "in_place"
SCALE = "scale"
ADAPTERS = "adapters"
LIGHT = (SCALE, ADAPTERS)  # applied to the live application without a new code version
REFUSE = "refuse"

# The public application (on route "/") has a stable name that names no revision: which revision
# it serves is the state store's record, never its name. A candidate (side by side) IS one
# revision: ``orch-r<N>`` on ``/_orch/r<N>``. Clusters deployed by an older orch serve their public
# application as ``orch-r<N>`` too (the revision that created it, not the one it serves).
PUBLIC_APP = "orch"
APP_PREFIX = "orch-r"
CANDIDATE_ROUTE_PREFIX = "/_orch/r"
# Several models on one cluster: one application per served name, so a rollout of one never
# restarts another (Serve hashes an application's args into its code version: two models in one
# application would restart together). The first keeps ``orch``; each further one is
# ``orch-m-<slug>`` on ``/_orch/m/<slug>`` while another model holds ``/``.
MODEL_APP_PREFIX = "orch-m-"
MODEL_ROUTE_PREFIX = "/_orch/m/"

# Downtime estimate of an in-place change when no cold load was measured for this model.
DISK_GIB_PER_S = 1.0  # sequential read of safetensors from a local NVMe/network store, per node
ENGINE_START_S = {"gpu": 90.0, "cpu": 120.0}  # process start, imports, CUDA graphs / CPU warm-up

# Resources the Serve replica actor adds to bundle 0 (LLMServer.get_deployment_options merges
# ray_actor_options' num_cpus, default 1, into the first bundle).
REPLICA_ACTOR_CPUS = 1.0


def public_app_name(served_name: str | None = None, taken: Collection[str] = ()) -> str:
    """The name of a new model's application: ``orch`` (the name a cluster's first model gets,
    and the one an older orch gave its only model) unless ``taken`` holds it, else
    ``orch-m-<served name>`` (``model_slug``). A model that serves keeps the name its revision
    recorded: a new name would be a new application, and Serve would start it from nothing."""
    if served_name is None or PUBLIC_APP not in taken:
        return PUBLIC_APP
    return MODEL_APP_PREFIX + model_slug(served_name)


def model_slug(served_name: str) -> str:
    """``served_name`` as it can stand in an application name and a route: letters, digits,
    ``.``, ``_`` and ``-`` kept, any other run of characters one ``-``; a name that changed gets
    8 hex digits of its SHA-256, so two names never share a slug (``org/m`` and ``org-m``)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", served_name).strip("-.") or "model"
    if slug != served_name:
        slug += "-" + hashlib.sha256(served_name.encode()).hexdigest()[:8]
    return slug


def model_route(served_name: str, taken_routes: Collection[str]) -> str:
    """The route a new model's application takes: the public route ``/`` while no other model's
    application holds it, else its own ``/_orch/m/<slug>`` under the same base URL and key."""
    if "/" not in taken_routes:
        return "/"
    return MODEL_ROUTE_PREFIX + model_slug(served_name)


def candidate_app_name(revision: int) -> str:
    """The candidate application of a side-by-side rollout: revision ``revision`` on its own route."""
    return f"{APP_PREFIX}{revision}"


def candidate_route(revision: int) -> str:
    return f"{CANDIDATE_ROUTE_PREFIX}{revision}"


def revision_of_app(name: str) -> int | None:
    """The revision a candidate's name (or an older orch's public ``orch-r<N>``) was created for.
    Never what a public application serves: that is the state store's record."""
    if name.startswith(APP_PREFIX) and name[len(APP_PREFIX) :].isdigit():
        return int(name[len(APP_PREFIX) :])
    return None


@dataclass(frozen=True)
class Serving:
    """What serves now: the recorded ready revision, and Serve's state of its application."""

    revision: int | None = None
    fingerprint: str | None = None
    app_name: str | None = None
    app_status: str | None = None  # RUNNING, DEPLOYING, DEPLOY_FAILED... None: not in Serve
    cold_load_s: float | None = None  # measured when that revision came up
    running_apps: tuple[str, ...] = ()  # every application Serve reports RUNNING

    @property
    def live(self) -> bool:
        return self.app_status == "RUNNING"


@dataclass(frozen=True)
class Decision:
    kind: str
    reason: str
    downtime_s: float | None = None  # estimated seconds without service (in_place / refuse)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "downtime_s": self.downtime_s, "notes": list(self.notes)}


def engine_change(live_config: Mapping[str, Any] | None, desired_config: Mapping[str, Any]) -> str | None:
    """Why the switch cannot roll the live application with a surge, or None when it can.

    Serve names the engine deployment after its class: ``LLMServer:<model>`` for
    ``build_openai_app``, ``DPServer:<model>`` for ``build_dp_openai_app`` (one replica per DP
    rank). Going from one to the other is a new deployment, and Serve deletes the old one in the
    same step as it creates the new one (``application_state.py``: "Delete outdated deployments"),
    with no surge between them: the public route has no engine until the new one is up."""
    if not live_config:
        return None
    old, new = shape_of_app(live_config), shape_of_app(desired_config)
    if old.name == new.name:
        return None
    return f"the switch turns {old.description} into {new.description}: Serve replaces the engine deployment without a surge"


def replica_change(live_config: Mapping[str, Any] | None, desired_app: Mapping[str, Any], api_key: str | None,
                   serving_fingerprint: str | None) -> tuple[int, int] | None:  # fmt: skip
    """(serving, desired) replica counts when the desired config is the serving revision's
    (``serving_fingerprint``, API key included) with only its fixed replica count changed, as the
    live application runs it (``live_config``, Serve's deployed config); None for any other change,
    an autoscaling count, or a shape whose replicas start as a gang (data parallel)."""
    if not live_config or not serving_fingerprint:
        return None
    try:
        live, want = effective_app(live_config), effective_app(desired_app)
        shape = shape_of_app(want)
        if shape.gang or shape_of_app(live).name != shape.name:
            return None
        old = (llm_config_of(live).get("deployment_config") or {}).get("num_replicas")
        want_dep = llm_config_of(want).setdefault("deployment_config", {})
    except KeyError:
        return None
    new = want_dep.get("num_replicas")
    if not isinstance(old, int) or not isinstance(new, int) or old < 1 or new < 1 or old == new:
        return None
    want_dep["num_replicas"] = old
    return (old, new) if config_fingerprint(want, api_key) == serving_fingerprint else None


@dataclass(frozen=True)
class AdapterChange:
    """The runtime adapters a light change adds (or re-sources) and removes, by name."""

    added: tuple[str, ...]
    removed: tuple[str, ...]

    def describe(self) -> str:
        parts = ([f"adds {', '.join(self.added)}"] if self.added else []) + ([f"removes {', '.join(self.removed)}"] if self.removed else [])
        return " and ".join(parts) or "changes nothing"


def light_change(live_config: Mapping[str, Any] | None, desired_app: Mapping[str, Any], api_key: str | None,
                 serving_fingerprint: str | None) -> tuple[tuple[int, int] | None, AdapterChange | None]:  # fmt: skip
    """(``replica_change``, the adapters' change) when the desired config is the serving
    revision's with only its fixed replica count and/or its runtime LoRA adapters changed, as the
    live application runs them; (None, None) for any other change."""
    live_adapters = runtime_adapters(live_config) if live_config else None
    want_adapters = runtime_adapters(desired_app)
    if live_adapters is None or want_adapters is None or live_adapters == want_adapters:
        return replica_change(live_config, desired_app, api_key, serving_fingerprint), None
    same_adapters = with_runtime_adapters(desired_app, live_adapters)
    rescale = replica_change(live_config, same_adapters, api_key, serving_fingerprint)
    if rescale is None and config_fingerprint(same_adapters, api_key) != serving_fingerprint:
        return None, None
    old, new = {a.name: a.source for a in live_adapters}, {a.name: a.source for a in want_adapters}
    change = AdapterChange(tuple(n for n in sorted(new) if old.get(n) != new[n]), tuple(n for n in sorted(old) if n not in new))
    return rescale, change


def lora_restart(live_config: Mapping[str, Any] | None, desired_app: Mapping[str, Any]) -> str | None:
    """Why serving the desired adapters needs a new engine where it does (its LoRA slots are
    engine arguments, fixed at start), or None."""
    if not live_config or not runtime_adapters(desired_app):
        return None
    try:
        old, new = lora_slots(llm_config_of(effective_app(live_config))), lora_slots(llm_config_of(desired_app))
    except KeyError:
        return None
    if old is None:
        return ("the serving engine was started without LoRA slots (enable_lora): the first adapter needs a new engine "
                "(vLLM sizes the slots at start); later adapters load into the running replicas")  # fmt: skip
    if new is not None and new != old:
        return (f"the LoRA slots change (max_loras {old.max_loras} -> {new.max_loras}, max_lora_rank {old.max_lora_rank} -> "
                f"{new.max_lora_rank}): a new engine (vLLM sizes them at start)")  # fmt: skip
    return None


def beside(others: Mapping[str, str], desired_name: str, decision: Decision, app_name: str, route: str,
           lora_note: str | None = None) -> Decision:  # fmt: skip
    """``decision`` with a note when the model comes up (fresh) beside other served models
    (served name -> their application): they keep serving and are not restarted; and with
    ``lora_note`` (``lora_restart``) when it starts a new engine of a serving model."""
    if lora_note and decision.kind in (SIDE_BY_SIDE, IN_PLACE, REFUSE):
        decision = replace(decision, notes=(*decision.notes, lora_note))
    if not others or decision.kind != FRESH:
        return decision
    names = ", ".join(f"'{n}' ({a})" for n, a in sorted(others.items()))
    note = f"'{desired_name}' comes up as its own application {app_name} on {route}, beside {names}: they keep serving, untouched"
    return replace(decision, notes=(*decision.notes, note))


def decide(
    desired_fingerprint: str,
    serving: Serving,
    room_for_copy: bool,
    allow_downtime: bool,
    downtime_s: float | None,
    engine_changes: str | None = None,
    rescale: tuple[int, int] | None = None,
    room_for_added: bool = False,
    adapters: AdapterChange | None = None,
) -> Decision:
    """Pick the kind of rollout (see the module doc). ``engine_changes``: ``engine_change`` of the
    live and the desired config (a switch that would stop serving: in place, or refused).
    ``rescale``: ``replica_change`` of the live and the desired config; ``room_for_added``:
    whether the replicas it adds fit on the free resources. ``adapters``: the runtime adapters'
    change of ``light_change``."""
    if serving.revision is not None and serving.fingerprint == desired_fingerprint and serving.live:
        return Decision(NOOP, f"revision {serving.revision} already serves this config ({serving.app_name} RUNNING)")
    if serving.revision is not None and serving.app_name is None:
        why = f"revision {serving.revision} is recorded as serving but the name of its Serve application is not (its record is incomplete)"
        if allow_downtime:
            return Decision(FRESH, f"{why}: replacing whatever Serve runs (--allow-downtime)", downtime_s=downtime_s)
        return Decision(REFUSE, f"{why}: orch will not replace what Serve runs without --allow-downtime", downtime_s=downtime_s)
    if serving.revision is None or not serving.live:
        if serving.revision is None:
            why = "no revision serves yet"
        else:
            why = f"revision {serving.revision}'s application {serving.app_name} is {serving.app_status or 'not in Serve'}"
        if serving.running_apps and not allow_downtime:
            return Decision(
                REFUSE,
                f"{why}, but Serve runs {', '.join(serving.running_apps)}: a fresh deploy would delete it",
                downtime_s=downtime_s,
            )
        return Decision(FRESH, f"{why}: deploy on the public route")
    if rescale is not None:
        old, new = rescale
        if new < old or room_for_added:
            verb = f"adds {new - old}" if new > old else f"stops {old - new}"
            also = f"; the LoRA adapters change too (it {adapters.describe()}: loaded by every replica)" if adapters else ""
            return Decision(SCALE, f"only the replica count changes ({old} -> {new}): Serve {verb} replica(s) of revision "
                                   f"{serving.revision}'s application; the replicas serving now keep running{also}")  # fmt: skip
        return Decision(REFUSE, f"no room for {new - old} more replica(s) beside what the cluster runs: revision "
                                f"{serving.revision} keeps serving on {old}")  # fmt: skip
    if adapters is not None:
        return Decision(ADAPTERS, f"only the LoRA adapters change: revision {serving.revision}'s application {adapters.describe()} "
                                  "(its engine deployment's user_config: every running replica loads or unloads them in its engine, "
                                  "none restarts)")  # fmt: skip
    estimate = f"about {downtime_s:.0f} s" if downtime_s is not None else "one cold load of the model"
    if engine_changes:
        if allow_downtime:
            return Decision(IN_PLACE, f"{engine_changes}; revision {serving.revision} is replaced in place (--allow-downtime); "
                                      f"expected downtime {estimate}", downtime_s=downtime_s)  # fmt: skip
        return Decision(REFUSE, f"{engine_changes}: replacing revision {serving.revision} would stop serving for {estimate}",
                        downtime_s=downtime_s)  # fmt: skip
    if room_for_copy:
        return Decision(
            SIDE_BY_SIDE,
            f"the cluster has room for a second copy: the new revision comes up beside revision {serving.revision}, "
            "traffic moves after its readiness probe",
        )
    if allow_downtime:
        return Decision(
            IN_PLACE,
            f"no room for a second copy: revision {serving.revision} is replaced in place (--allow-downtime); "
            f"expected downtime {estimate}",
            downtime_s=downtime_s,
        )
    return Decision(
        REFUSE,
        f"no room for a second copy beside revision {serving.revision}: an in-place change would stop serving "
        f"for {estimate}",
        downtime_s=downtime_s,
    )


# ---------------------------------------------------------------------------------- capacity


def replica_bundles(llm_config: Mapping[str, Any]) -> tuple[list[dict[str, float]], str]:
    """The placement group one replica asks Ray for: the rendered bundles with the replica
    actor's CPU merged into bundle 0 (as Serve LLM does), and the strategy."""
    pg = llm_config.get("placement_group_config") or {}
    bundles = [dict(b) for b in pg.get("bundles") or []]
    if not bundles:
        bundles = [{}]
    actor_cpus = float(((llm_config.get("deployment_config") or {}).get("ray_actor_options") or {}).get("num_cpus", REPLICA_ACTOR_CPUS))
    bundles[0]["CPU"] = float(bundles[0].get("CPU", 0.0)) + actor_cpus
    return bundles, str(pg.get("strategy") or "PACK")


def copy_demand(app: Mapping[str, Any]) -> tuple[list[list[dict[str, float]]], str]:
    """The placement groups a copy of the rendered application asks Ray for, as its shape counts
    them (``shapes.AppShape.capacity_groups``): one per replica of a tensor/pipeline-parallel
    application; one per DP group of a data-parallel one, whose ranks Serve reserves together."""
    app = effective_app(app)  # a count-only change's override is what Serve runs
    llm_config = llm_config_of(app)
    bundles, strategy = replica_bundles(llm_config)
    dep = llm_config.get("deployment_config") or {}
    replicas = dep.get("num_replicas")
    if not isinstance(replicas, int):
        replicas = int((dep.get("autoscaling_config") or {}).get("min_replicas", 1) or 1)
    return shape_of_app(app).capacity_groups(bundles, strategy, replicas, llm_config)


def copy_total(app: Mapping[str, Any]) -> dict[str, float]:
    """Every resource a copy of the rendered application asks Ray for, summed over its placement
    groups (``copy_demand``): what it holds once it runs."""
    groups, _ = copy_demand(app)
    return _sum([b for g in groups for b in g])


def _fits_on(free: Mapping[str, float], demand: Mapping[str, float]) -> bool:
    return all(free.get(res, 0.0) + 1e-9 >= amount for res, amount in demand.items() if amount > 0)


def _take(free: dict[str, float], demand: Mapping[str, float]) -> None:
    for res, amount in demand.items():
        free[res] = free.get(res, 0.0) - amount


def _sum(bundles: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for b in bundles:
        for res, amount in b.items():
            out[res] = out.get(res, 0.0) + float(amount)
    return out


def fits(groups: Sequence[Sequence[Mapping[str, float]]], strategy: str, free_by_node: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether every placement group of ``groups`` can be placed on the free resources.

    Greedy and in node order, like Ray's scheduler for these strategies; a node-pinning resource
    is an ordinary resource only that node has, so pinning needs no special case."""
    free = {node: dict(res) for node, res in free_by_node.items()}
    for bundles in groups:
        if strategy == "STRICT_PACK":
            need = _sum(bundles)
            node = next((n for n, f in free.items() if _fits_on(f, need)), None)
            if node is None:
                return False
            _take(free[node], need)
            continue
        trial = {node: dict(res) for node, res in free.items()}
        used: list[str] = []
        for bundle in bundles:
            # PACK prefers the nodes the group already uses; SPREAD prefers new ones.
            order = list(trial)
            if strategy in ("PACK",):
                order = used + [n for n in order if n not in used]
            elif strategy in ("SPREAD", "STRICT_SPREAD"):
                order = [n for n in order if n not in used] + ([] if strategy == "STRICT_SPREAD" else used)
            node = next((n for n in order if _fits_on(trial[n], bundle)), None)
            if node is None:
                return False
            _take(trial[node], bundle)
            if node not in used:
                used.append(node)
        free = trial
    return True


def free_resources(nodes: Sequence[Any]) -> dict[str, dict[str, float]]:
    """Orch node name -> available resources, from cluster.node_state.NodeState values (ALIVE ones)."""
    out: dict[str, dict[str, float]] = {}
    for state in nodes:
        if not getattr(state, "alive", False):
            continue
        name = getattr(state, "name", None) or getattr(state, "node_id", "?")
        out[name] = dict(state.resources_available)
    return out


def estimate_cold_load_s(accelerator: str, weights_gib_per_node: float | None, measured_s: float | None) -> float:
    """Seconds from deploy to the first token: the last measurement of this model when there is
    one, else engine start-up plus reading the node's share of the weights."""
    if measured_s is not None and measured_s > 0:
        return float(measured_s)
    start = ENGINE_START_S.get(accelerator, ENGINE_START_S["gpu"])
    return start + max(0.0, weights_gib_per_node or 0.0) / DISK_GIB_PER_S
