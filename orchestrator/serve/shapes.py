"""The Ray Serve LLM application shapes orch deploys, as a registry of shape objects. Pure.

A shape is everything that differs between Serve LLM's application builders: its import paths,
where its model config sits under ``args``, the class that names its engine deployment, the
engine arguments and placement it renders, its unit of capacity, the Ray model that validates
its ``args`` (named by dotted path: ``serve.ray_io.validate`` imports it), how a replica's log
says which rank and group it is. Two shapes are registered:

- ``tp_pp`` (``TpPpShape``, the default): tensor x pipeline parallel replicas,
  ``ray.serve.llm:build_openai_app`` (or orch's copy of it on the nodes, ``serve.node_hooks``);
  the model's config is ``args.llm_configs[0]``, its engine deployment ``LLMServer:<model_id>``,
  one placement group per replica.
- ``dp`` (``DpShape``): data-parallel groups, ``ray.serve.llm:build_dp_openai_app`` (Ray 2.60's
  ``serving_patterns/data_parallel/builder.py``): ``args`` is ``DPOpenAiServingArgs`` whose one
  model is ``args.llm_config`` (no list); its engine deployment is ``DPServer:<model_id>``, one
  Serve replica per DP rank, a group's ranks reserved together (a gang).

Adding a shape is writing one subclass: ``class MyShape(AppShape, name="mine")`` registers it
(``__init_subclass__``, as SkyPilot registers its load-balancing policies); ``serves`` says which
plans it takes. ``shape_of_plan`` picks the shape of a plan (the default when no other claims
it), ``shape_of_app`` the shape of a rendered, deployed or stored config (by its import path, or
by its ``args`` key when it has none). The readers below (``llm_configs``, ``api_key_of``,
``model_of_deployment``) read any registered shape alike.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from orchestrator.errors import ServeConfigError
from orchestrator.serve.placement import rank_bundles, replica_placement

if TYPE_CHECKING:
    from orchestrator.serve.config import ServingPlan

OPENAI_IMPORT_PATH = "ray.serve.llm:build_openai_app"
DP_IMPORT_PATH = "ray.serve.llm:build_dp_openai_app"
# orch's build_openai_app on the nodes (serve.node_hooks.MODULE; no LLMRouter hop).
ORCH_BUILDER_IMPORT_PATH = "orch_serve_hooks:build_openai_app"

# Serve's placement strategy for a gang (a data-parallel group): DPServer.get_deployment_options.
GANG_STRATEGY = "PACK"

SHAPES: dict[str, AppShape] = {}  # name -> the shape, in registration order
DEFAULT_SHAPE = "tp_pp"

Bundles = list[dict[str, Any]]


class AppShape:
    """One application shape. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    import_paths: ClassVar[tuple[str, ...]]  # every builder that makes this shape
    args_key: ClassVar[str]  # the key of the model config(s) under ``args``
    args_is_list: ClassVar[bool]  # a list of configs (one per model) or one config
    engine_class: ClassVar[str]  # Serve LLM names the engine deployment "<engine_class>:<model_id>"
    description: ClassVar[str]  # what the shape is, for messages
    args_class: ClassVar[str | None] = None  # Ray's model of ``args`` (dotted path) to validate, if any
    gang: ClassVar[bool] = False  # a group of replicas starts, stops and is placed together
    # A replica's log line that says its rank and group (named groups rank, size, gang), if any.
    rank_log: ClassVar[re.Pattern[str] | None] = None
    rank_log_keyword: ClassVar[str | None] = None  # a plain substring of that line (log scans)

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:  # an abstract intermediate class
            return
        if name in SHAPES:
            raise ValueError(f"application shape {name!r} is registered twice")
        cls.name = name
        SHAPES[name] = cls()

    # ------------------------------------------------------------------ from a plan to a config

    def serves(self, plan: ServingPlan) -> bool:
        """Whether this shape claims ``plan`` (the default shape takes what no other claims)."""
        return False

    def check_plan(self, plan: ServingPlan) -> None:
        """Raise ServeConfigError for a plan this shape cannot deploy."""

    def import_path(self, *, hooks: bool, request_router: str | None) -> str:
        """The builder to render: ``hooks`` when the application imports orch's module on the
        nodes, ``request_router`` the class chosen (None: Serve LLM's default)."""
        return self.import_paths[0]

    def engine_kwargs(self, plan: ServingPlan) -> dict[str, Any]:
        """Engine arguments the shape adds (rendered after the parallel sizes)."""
        return {}

    def placement(self, plan: ServingPlan, accelerator: str, stage_nodes: Sequence[str] | None,
                  node_resource: Callable[[str], str], cpus_per_cpu_worker: float = 1) -> tuple[Bundles, str]:  # fmt: skip
        """(bundles, strategy) of one Serve replica's placement group."""
        return replica_placement(plan, accelerator, stage_nodes, node_resource, cpus_per_cpu_worker)

    def ranks_per_serve_replica(self, plan: ServingPlan) -> int:
        """DP ranks the engine behind one Serve replica holds (its batch: serve.in_flight)."""
        return 1

    def check_engine_kwargs(self, engine_kwargs: Mapping[str, Any], prefix: str) -> None:
        """Raise ServeConfigError for engine arguments this shape's engine deployment refuses
        (``prefix``: the model config's path in the application, for the message)."""

    # ------------------------------------------------------------------ reading a config

    @property
    def config_path(self) -> str:
        """Dotted path of the (first) model config, for messages and secret checks."""
        return f"args.{self.args_key}[0]" if self.args_is_list else f"args.{self.args_key}"

    def args(self, llm_config: Mapping[str, Any]) -> dict[str, Any]:
        """The application's ``args`` holding ``llm_config``."""
        return {self.args_key: [llm_config] if self.args_is_list else llm_config}

    def llm_configs(self, app: Mapping[str, Any]) -> list[Any]:
        """Every model config of the application ([] when it has none where this shape keeps them)."""
        args = app.get("args") if isinstance(app, Mapping) else None
        if not isinstance(args, Mapping) or self.args_key not in args:
            return []
        value = args[self.args_key]
        if not self.args_is_list:
            return [value]
        return list(value) if isinstance(value, list) else []

    def capacity_groups(self, bundles: Bundles, strategy: str, replicas: int,
                        llm_config: Mapping[str, Any]) -> tuple[list[Bundles], str]:  # fmt: skip
        """The placement groups a copy asks Ray for, given one replica's bundles (actor CPU
        merged) and the number of replicas: one group per replica."""
        return [list(bundles) for _ in range(max(1, replicas))], strategy


class TpPpShape(AppShape, name="tp_pp"):
    import_paths = (OPENAI_IMPORT_PATH, ORCH_BUILDER_IMPORT_PATH)
    args_key = "llm_configs"
    args_is_list = True
    engine_class = "LLMServer"
    description = "a tensor/pipeline-parallel application (LLMServer)"

    def import_path(self, *, hooks: bool, request_router: str | None) -> str:
        """orch's builder on the nodes (no LLMRouter hop) when the application imports orch's
        module there and Serve LLM's default router would decide; Serve LLM's ``build_openai_app``
        otherwise (a chosen request router needs LLMRouter; a bucket model source has no orch
        folder on its PYTHONPATH)."""
        return ORCH_BUILDER_IMPORT_PATH if hooks and request_router is None else OPENAI_IMPORT_PATH


class DpShape(AppShape, name="dp"):
    import_paths = (DP_IMPORT_PATH,)
    args_key = "llm_config"
    args_is_list = False
    engine_class = "DPServer"
    description = "a data-parallel application (DPServer, one replica per rank)"
    args_class = "ray.llm._internal.serve.serving_patterns.data_parallel.builder.DPOpenAiServingArgs"
    gang = True
    # Ray Serve LLM's DPServer, when a data-parallel rank's replica starts (Ray 2.60,
    # ray/llm/_internal/serve/serving_patterns/data_parallel/dp_server.py), in the replica's worker
    # log: "DPServer replica initialized: dp_rank=1, dp_size=2, gang_id=0c6edda3"
    rank_log = re.compile(r"DPServer replica initialized: dp_rank=(?P<rank>\d+), dp_size=(?P<size>\d+), gang_id=(?P<gang>\S+)")
    rank_log_keyword = "DPServer replica initialized"

    def serves(self, plan: ServingPlan) -> bool:
        return plan.dp > 1

    def check_plan(self, plan: ServingPlan) -> None:
        if plan.pp > 1:
            # vLLM places a DP rank's pipeline stages itself; Serve LLM's DPServer hands each rank
            # its bundles by node, which orch's stage pins would contradict. The planner never plans it.
            raise ServeConfigError(f"data parallel {plan.dp} with pipeline parallel {plan.pp}: orch deploys DP groups without PP",
                                   hint="plan DP x TP (--dp with --tp), or TP x PP without --dp")  # fmt: skip

    def engine_kwargs(self, plan: ServingPlan) -> dict[str, Any]:
        return {"data_parallel_size": plan.dp}

    def placement(self, plan: ServingPlan, accelerator: str, stage_nodes: Sequence[str] | None,
                  node_resource: Callable[[str], str], cpus_per_cpu_worker: float = 1) -> tuple[Bundles, str]:  # fmt: skip
        return rank_bundles(plan, accelerator, cpus_per_cpu_worker)

    def capacity_groups(self, bundles: Bundles, strategy: str, replicas: int,
                        llm_config: Mapping[str, Any]) -> tuple[list[Bundles], str]:  # fmt: skip
        """One group per DP group, as Serve reserves it (``deployment_scheduler.py``: the
        per-replica bundles, actor CPU merged, repeated for each of the gang's ranks, strategy
        PACK), so a DP group is the unit of capacity."""
        dp = (llm_config.get("engine_kwargs") or {}).get("data_parallel_size", 1)
        if not (isinstance(dp, int) and dp > 1):
            return super().capacity_groups(bundles, strategy, replicas, llm_config)
        gang = [dict(b) for _ in range(dp) for b in bundles]
        return [list(gang) for _ in range(max(1, replicas))], GANG_STRATEGY

    def check_engine_kwargs(self, engine_kwargs: Mapping[str, Any], prefix: str) -> None:
        """The DP size one ``DPServer`` accepts (``DPServer.get_deployment_options``: a positive
        integer; it multiplies num_replicas, which counts groups, by it)."""
        dp = engine_kwargs.get("data_parallel_size", 1)
        if not (isinstance(dp, int) and not isinstance(dp, bool) and dp > 0):
            raise ServeConfigError(
                f"invalid Serve LLM config: {prefix}.engine_kwargs.data_parallel_size: {dp!r} is not a positive integer "
                "(Ray Serve LLM's DPServer refuses it)",
                hint="check --dp",
            )


# ---------------------------------------------------------------------------------- lookups


def get_shape(name: str) -> AppShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ServeConfigError(f"unknown application shape {name!r}", hint="one of: " + ", ".join(SHAPES)) from None


def shape_of_plan(plan: ServingPlan) -> AppShape:
    """The shape that deploys ``plan``: the one shape that claims it, else the default."""
    claims = [shape for shape in SHAPES.values() if shape.name != DEFAULT_SHAPE and shape.serves(plan)]
    if len(claims) > 1:
        raise ServeConfigError(f"application shapes {', '.join(s.name for s in claims)} all claim the plan",
                               hint="a plan has one shape: make the shapes' `serves` exclusive")  # fmt: skip
    return claims[0] if claims else SHAPES[DEFAULT_SHAPE]


def shape_of_app(app: Mapping[str, Any]) -> AppShape:
    """The shape of a rendered, deployed or stored application config: by its import path; a
    config without one by the key of its model config under ``args``. ServeConfigError for an
    import path no shape builds, or a config no shape reads."""
    import_path = app.get("import_path") if isinstance(app, Mapping) else None
    name = app.get("name") if isinstance(app, Mapping) else None
    if import_path:
        for shape in SHAPES.values():
            if import_path in shape.import_paths:
                return shape
        known = ", ".join(p for s in SHAPES.values() for p in s.import_paths)
        raise ServeConfigError(f"application {name!r} has import_path {import_path!r}, which no application shape of orch builds",
                               hint=f"orch deploys and reads the import paths: {known}")  # fmt: skip
    shape = _shape_by_args(app)
    if shape is None:
        raise ServeConfigError(f"application {name!r} has neither an import_path nor a model config under args",
                               hint="keys orch reads: " + ", ".join(f"args.{s.args_key}" for s in SHAPES.values()))  # fmt: skip
    return shape


def _shape_by_args(app: Mapping[str, Any]) -> AppShape | None:
    args = app.get("args") if isinstance(app, Mapping) else None
    if not isinstance(args, Mapping):
        return None
    return next((s for s in SHAPES.values() if s.args_key in args), None)


def shape_of_deployment(name: str) -> AppShape | None:
    """The shape whose engine deployment ``name`` is (``LLMServer:<model>``...), None for another."""
    head = name.partition(":")[0]
    return next((s for s in SHAPES.values() if head.startswith(s.engine_class)), None)


def rank_logs() -> Iterable[re.Pattern[str]]:
    """The rank lines of every shape whose replicas log one."""
    return [s.rank_log for s in SHAPES.values() if s.rank_log is not None]


def rank_log_keywords() -> list[str]:
    return [s.rank_log_keyword for s in SHAPES.values() if s.rank_log_keyword]


# ------------------------------------------------------------------ readers of any shape's config


def llm_configs(app: Mapping[str, Any]) -> list[Any]:
    """Every model config of the application, in whatever shape (lenient: [] for anything
    else, so a foreign application Serve runs reads as one without a model)."""
    if not isinstance(app, Mapping):
        return []
    shape = next((s for s in SHAPES.values() if app.get("import_path") in s.import_paths), None) or _shape_by_args(app)
    return shape.llm_configs(app) if shape is not None else []


def llm_config_of(app: Mapping[str, Any]) -> dict[str, Any]:
    """The application's (first) model config; a KeyError when it has none."""
    configs = llm_configs(app)
    if not configs or not isinstance(configs[0], dict):
        raise KeyError(f"application {app.get('name') if isinstance(app, Mapping) else '?'!r} has no llm_config")
    return configs[0]


def api_key_of(app: Mapping[str, Any]) -> str | None:
    """The deployed API key (the first of ``engine_kwargs.api_key``), None when absent."""
    try:
        key = llm_config_of(app)["engine_kwargs"]["api_key"]
    except (KeyError, TypeError):
        return None
    return key[0] if isinstance(key, list) and key else None


def model_id_of(app: Mapping[str, Any]) -> str | None:
    """The (first) model config's ``model_id``: the name requests use; None when it has none."""
    llm = (llm_configs(app) or [{}])[0]
    return (llm.get("model_loading_config") or {}).get("model_id") if isinstance(llm, Mapping) else None


def engine_deployment_name(app: Mapping[str, Any]) -> str:
    """The engine deployment's name as Serve LLM gives it (Ray 2.60,
    ``ray/llm/_internal/serve/core/server/builder.py``: ``build_llm_deployment``): the shape's
    engine class (``LLMServer``, ``DPServer``), ``:``, then ``deployment_config.name`` when set,
    else the model id with ``/`` as ``--`` and ``.`` as ``_`` (``_get_deployment_name``)."""
    llm = llm_config_of(app)
    name = (llm.get("deployment_config") or {}).get("name")
    if not name:
        name = str((llm.get("model_loading_config") or {}).get("model_id", "")).replace("/", "--").replace(".", "_")
    return f"{shape_of_app(app).engine_class}:{name}"


def model_of_deployment(name: str) -> str | None:
    """The model id of an engine deployment (``LLMServer:<model_id>``, ``DPServer:<model_id>``)."""
    head, sep, rest = name.partition(":")
    return rest if sep and shape_of_deployment(name) is not None else None


def is_engine_deployment(name: str) -> bool:
    return shape_of_deployment(name) is not None


def config_paths() -> list[str]:
    """The dotted path of the model config in every shape."""
    return [s.config_path for s in SHAPES.values()]


# ------------------------------------------------------------------ the replica count as Serve runs it


def replica_override(app: Mapping[str, Any]) -> int | None:
    """The engine deployment's ``num_replicas`` set by an app-level ``deployments`` entry (how orch
    changes a model's replica count without restarting it: ``serve.config.with_replicas``), None
    when no entry sets it."""
    entries = app.get("deployments") if isinstance(app, Mapping) else None
    if not isinstance(entries, list) or not llm_configs(app):
        return None
    engine = engine_deployment_name(app)
    for entry in entries:
        if isinstance(entry, Mapping) and entry.get("name") == engine and isinstance(entry.get("num_replicas"), int):
            return int(entry["num_replicas"])
    return None


def with_engine_option(app: Mapping[str, Any], option: str, value: Any, own: Any, others_too: bool = False) -> dict[str, Any]:
    """A copy of ``app`` whose engine deployment's app-level ``deployments`` entry sets ``option``
    to ``value``, or sets nothing where the model config's own ``deployment_config`` says ``value``
    already (``own``); ``others_too``: every other entry that sets ``option`` gets ``value``. An
    entry left overriding nothing is dropped, and ``deployments`` with it when it is empty."""
    out = copy.deepcopy(dict(app))
    engine = engine_deployment_name(out)
    entries: list[dict] = []
    engine_entry: dict | None = None
    for entry in out.get("deployments") or []:
        entry = dict(entry)
        if entry.get("name") == engine:
            entry.pop(option, None)
            engine_entry = entry
        elif others_too and option in entry:
            entry[option] = value
        entries.append(entry)
    if own != value:
        if engine_entry is None:
            engine_entry = {"name": engine}
            entries.append(engine_entry)
        engine_entry[option] = value
    entries = [e for e in entries if set(e) != {"name"}]  # an override that overrides nothing
    if entries:
        out["deployments"] = entries
    else:
        out.pop("deployments", None)
    return out


def effective_app(app: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``app`` as Serve runs its engine: an app-level ``num_replicas`` override of the
    engine deployment (``replica_override``) moved into the model config's ``deployment_config``,
    where Serve's own override puts it (``deployments`` entries override the options the builder
    set). What the application serves, whichever of the two ways its replica count was given."""
    count = replica_override(app)
    if count is None:
        return copy.deepcopy(dict(app))
    out = with_engine_option(app, "num_replicas", count, own=count)  # the override dropped
    dep = llm_config_of(out).setdefault("deployment_config", {})
    dep.pop("autoscaling_config", None)
    dep["num_replicas"] = count
    return out
