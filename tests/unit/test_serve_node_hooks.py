"""The module orch writes on the nodes (serve/node_hooks.py), run by Ray's own code: Serve LLM
loads the class by the name the rendered application gives (``load_class`` in
ray/llm/_internal/common/utils/import_utils.py, as ``LLMConfig.get_or_create_callback`` does), constructs it the
way that method does and runs its ``on_before_node_init`` hook; ``VLLMEngine.start`` then reads
``callback.ctx.run_init_node`` (ray/llm/_internal/serve/engines/vllm/vllm_engine.py) before it
would start the per-node model task."""

from __future__ import annotations

import asyncio
import copy
import logging
import sys
from pathlib import Path

import pytest

from orchestrator.serve import node_hooks


def test_serve_llm_loads_the_callback_by_its_rendered_name_and_it_skips_the_node_task(on_the_node_path):
    from ray.llm._internal.common.callbacks.base import CallbackBase
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    config = LLMConfig(model_loading_config={"model_id": "tiny", "model_source": "/models/tiny"},
                       callback_config={"callback_class": node_hooks.CALLBACK_CLASS})  # fmt: skip
    cls = load_class(config.callback_config.callback_class)
    assert issubclass(cls, CallbackBase)
    # constructed as get_or_create_callback does (its ctx_kwargs, Serve LLM's defaults)
    callback = cls(raise_error_on_callback=True, llm_config=config, ctx_kwargs={"runtime_env": {}})
    assert callback.ctx.run_init_node is True  # Serve LLM's default: the task runs
    # through Serve's logger: in the replica's log, where `orch logs` shows it
    serve_logger, seen = logging.getLogger("ray.serve"), []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    level = serve_logger.level
    serve_logger.addHandler(handler)
    serve_logger.setLevel(logging.INFO)
    try:
        asyncio.run(callback.run_callback("on_before_node_init"))
    finally:
        serve_logger.removeHandler(handler)
        serve_logger.setLevel(level)
    assert callback.ctx.run_init_node is False
    assert any(m.startswith(f"{node_hooks.SKIPPED_LINE} (the model is /models/tiny") for m in seen), seen


def test_the_callback_turns_off_serve_llms_telemetry_push_that_can_hang_a_replica(on_the_node_path, monkeypatch):
    # LLMServer._start_engine pushes a telemetry report after the engine started; the push blocks
    # on Ray's detached telemetry actor (ray.get, no timeout), which a replica stopped while making
    # it leaves DEPENDENCIES_UNREADY for good: every later engine replica then hangs at start
    # (seen on the test bed, docs/moe.md). The real _start_engine runs here with a stub engine.
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from ray.llm._internal.serve.core.server import llm_server
    from ray.llm._internal.serve.observability.usage_telemetry import usage

    pushed: list = []
    monkeypatch.setattr(usage, "_push_model_telemetry", lambda model, *a, **k: pushed.append(model))
    # Ray's own push (from its module), whatever an earlier test's callback left in llm_server
    monkeypatch.setattr(llm_server, node_hooks.TELEMETRY_PUSH, getattr(usage, node_hooks.TELEMETRY_PUSH))
    assert llm_server.__name__ == node_hooks.LLM_SERVER_MODULE
    config = LLMConfig(model_loading_config={"model_id": "tiny", "model_source": "/models/tiny"},
                       callback_config={"callback_class": node_hooks.CALLBACK_CLASS})  # fmt: skip

    class Engine:
        async def start(self):
            return None

    server = type("Server", (), {"engine": Engine(), "_llm_config": config})()
    asyncio.run(llm_server.LLMServer._start_engine(server))
    assert pushed == [config]  # without orch's callback: Serve LLM pushes once per engine start
    callback = load_class(node_hooks.CALLBACK_CLASS)(raise_error_on_callback=True, llm_config=config, ctx_kwargs={"runtime_env": {}})
    asyncio.run(callback.run_callback("on_before_node_init"))
    asyncio.run(llm_server.LLMServer._start_engine(server))
    assert pushed == [config]  # after it: no push, so nothing waits on the telemetry actor


def test_the_folder_is_where_the_rendered_pythonpath_points_once_expanded(on_the_node_path, monkeypatch):
    # Ray expands ${HOME} and ${PYTHONPATH} from the node's environment as each worker starts
    # (update_envs in ray/_private/utils.py, called by RuntimeEnvContext.exec_worker)
    import os

    from ray._private.utils import update_envs

    home = str(on_the_node_path.parents[3])
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    monkeypatch.setenv("ORCH_T_PP", "")  # restored by monkeypatch after update_envs sets it
    update_envs({"ORCH_T_PP": node_hooks.pythonpath("c1")})
    assert os.environ["ORCH_T_PP"].split(":") == [str(on_the_node_path), "/opt/site"]
    assert node_hooks.hooks_path("c1", home) == str(on_the_node_path / f"{node_hooks.MODULE}.py")


class _TaskContext:
    """``ray.get_runtime_context()`` in Serve's build task: the application's runtime env (the
    task runs with it; outside a Ray worker the real call would start a local Ray on this
    machine). A fresh dict each call: Serve LLM's builder writes into the one it gets."""

    def __init__(self, runtime_env: dict):
        self._env = runtime_env

    @property
    def runtime_env(self) -> dict:
        return copy.deepcopy(self._env)


TINY_ARGS = {"llm_configs": [{"model_loading_config": {"model_id": "tiny", "model_source": "/models/tiny"},
                              "accelerator_config": {"kind": "cpu"}, "engine_kwargs": {"tensor_parallel_size": 1}}]}  # fmt: skip


def _built(import_path, monkeypatch, app: dict | None = None):
    """Builds ``app`` (default: a hand-written tiny one) the way Serve's build task does
    (``build_serve_application`` in ray/serve/_private/application_state.py: ``import_attr``, then
    ``call_user_app_builder_with_args_if_necessary``, then ``build_app``), under direct streaming."""
    import ray
    from ray._common.utils import import_attr
    from ray.llm._internal.serve import constants
    from ray.llm._internal.serve.core.ingress import builder
    from ray.serve._private import build_app as build_module
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    app = app or {"name": "orch-r1", "runtime_env": {}, "args": TINY_ARGS}
    # orch's nodes run Serve with HAProxy and Serve LLM with direct streaming (cluster.ray_nodes)
    monkeypatch.setattr(builder, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", True)
    monkeypatch.setattr(constants, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", True)
    monkeypatch.setattr(build_module, "RAY_SERVE_ENABLE_HA_PROXY", True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: _TaskContext(app["runtime_env"]))
    built = call_user_app_builder_with_args_if_necessary(import_attr(import_path), copy.deepcopy(app["args"]))
    return build_module.build_app(built, name=app["name"], default_runtime_env={})


# orch's module builds through Serve LLM's functions here when the light build does not apply.
THROUGH_SERVE_LLM = f"{node_hooks.MODULE}:_build_with_serve_llm"


def test_orchs_builder_makes_the_llm_server_the_ingress_without_serve_llms_router(on_the_node_path, monkeypatch):
    ours = _built(node_hooks.BUILDER_IMPORT_PATH, monkeypatch)
    assert [d.name for d in ours.deployments] == ["LLMServer:tiny"]
    assert ours.ingress_deployment_name == "LLMServer:tiny" and ours.ingress_request_router_deployment is None
    # Serve refuses any request router class on an ingress deployment HAProxy balances itself.
    assert ours.deployments[0]._deployment_config.request_router_config.request_router_class.endswith("PowerOfTwoChoicesRequestRouter")
    # Serve LLM's own builder, same args: the same ingress with LLMRouter beside it.
    theirs = _built("ray.serve.llm:build_openai_app", monkeypatch)
    assert theirs.ingress_deployment_name == "LLMServer:tiny" and theirs.ingress_request_router_deployment.name == "LLMRouter"


def test_orchs_builder_refuses_to_run_without_direct_streaming(on_the_node_path, monkeypatch):
    from ray.llm._internal.serve import constants
    from ray.llm._internal.serve.core.ingress import builder

    module = __import__(node_hooks.MODULE)
    monkeypatch.setattr(builder, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", False)
    monkeypatch.setattr(constants, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", False)
    for config in (_rendered("cpu-tp1")["args"]["llm_configs"][0], {"model_loading_config": {"model_id": "tiny"}}):  # light, full
        with pytest.raises(ValueError, match="needs RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1"):
            module.build_openai_app({"llm_configs": [config]})


def _rendered(case: str) -> dict:
    """An application as orch renders it (serve/config.py), one per shape the builder meets."""
    from pathlib import Path

    from orchestrator.cluster.ray_nodes import node_resource
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.serve.config import AppTarget, ServeDefaults, ServingPlan, render_app

    templates = Path(__file__).resolve().parents[2] / "cluster-templates"
    target = AppTarget("orch-r2", "/_orch/r2", "org/Model-3.1.x", "/models/tiny")
    if case == "gpu-pp2-pinned":
        plan = ServingPlan(tp=8, pp=2, max_model_len=8192, max_num_seqs=1024)
        return render_app(load_manifest_file(templates / "2x8-h100-405b.yaml"), plan, target, node_resource=node_resource,
                          accelerator_type="H100", stage_nodes=["gpu-a", "gpu-b"]).app  # fmt: skip
    if case == "gpu-tp4-autoscaling":
        plan = ServingPlan(tp=4, pp=1, max_model_len=4096, replicas=2)
        return render_app(load_manifest_file(templates / "2x8-h100-405b.yaml"), plan, target, node_resource=node_resource,
                          accelerator_type="H100", defaults=ServeDefaults(autoscaling_max_replicas=4)).app  # fmt: skip
    if case == "cpu-autoscaling-serve-llms-target":  # Serve LLM's default target fills the one orch leaves out
        app = render_app(load_manifest_file(templates / "local.yaml"), ServingPlan(tp=1, pp=1, max_model_len=1024), target,
                         node_resource=node_resource, defaults=ServeDefaults(autoscaling_max_replicas=2)).app  # fmt: skip
        del app["args"]["llm_configs"][0]["deployment_config"]["autoscaling_config"]["target_ongoing_requests"]
        return app
    plan = ServingPlan(tp=2 if case == "cpu-tp2" else 1, pp=1, max_model_len=1024, replicas=3 if case == "cpu-tp2" else 1)
    return render_app(load_manifest_file(templates / "local.yaml"), plan, target, node_resource=node_resource).app


@pytest.mark.parametrize("case", ["cpu-tp1", "cpu-tp2", "gpu-pp2-pinned", "gpu-tp4-autoscaling", "cpu-autoscaling-serve-llms-target"])
def test_the_light_build_gives_the_deployment_serve_llms_build_gives(on_the_node_path, monkeypatch, case):
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    app = _rendered(case)
    light = _built(node_hooks.BUILDER_IMPORT_PATH, monkeypatch, app)
    full = _built(THROUGH_SERVE_LLM, monkeypatch, app)
    assert [d.name for d in light.deployments] == [d.name for d in full.deployments] == ["LLMServer:org--Model-3_1_x"]
    assert light.ingress_deployment_name == full.ingress_deployment_name and light.ingress_request_router_deployment is None
    ours, theirs = light.deployments[0], full.deployments[0]
    assert ours.func_or_class == node_hooks.INGRESS_CLASS  # named, not imported: no vLLM in the build task
    assert ours._deployment_config.to_proto_bytes() == theirs._deployment_config.to_proto_bytes()
    assert ours._deployment_config.user_configured_option_names == theirs._deployment_config.user_configured_option_names
    for field in ("ray_actor_options", "placement_group_bundles", "placement_group_strategy", "max_replicas_per_node",
                  "placement_group_bundle_label_selector", "init_args"):  # fmt: skip
        assert getattr(ours._replica_config, field) == getattr(theirs._replica_config, field), field
    # the replica gets the config's dict and builds the same LLMConfig from it (its engine config,
    # cached by Serve LLM's build, is computed again there from the same fields)
    (passed,) = theirs._replica_config.init_kwargs.values()
    assert LLMConfig.model_validate(ours._replica_config.init_kwargs["llm_config"]).model_dump() == passed.model_dump()


def test_a_config_orch_does_not_render_or_another_ray_builds_through_serve_llm(on_the_node_path, monkeypatch):
    import ray

    module = __import__(node_hooks.MODULE)
    assert isinstance(_built(node_hooks.BUILDER_IMPORT_PATH, monkeypatch, _rendered("cpu-tp1")).deployments[0].func_or_class, str)

    def changed(change) -> dict:
        args = _rendered("cpu-tp1")["args"]
        change(args["llm_configs"][0])
        return args

    for args in (
        changed(lambda c: c.update(runtime_env={"env_vars": {"X": "1"}})),  # a field the light build does not read
        changed(lambda c: c.update(accelerator_config={"kind": "tpu", "topology": "4x4"})),  # Serve LLM defers its group
        changed(lambda c: c.pop("placement_group_config")),  # Serve LLM computes the bundles
        changed(lambda c: c["placement_group_config"].update(bundle_per_worker={"CPU": 1})),
        changed(lambda c: c["deployment_config"].update(request_router_config={"request_router_class": "x.Y"})),
        {**_rendered("cpu-tp1")["args"], "ingress_deployment_config": {}},
    ):
        assert module._light_config(args) is None, args
    monkeypatch.setattr(ray, "__version__", "2.61.0")
    assert not isinstance(_built(node_hooks.BUILDER_IMPORT_PATH, monkeypatch, _rendered("cpu-tp1")).deployments[0].func_or_class, str)


def test_the_checked_ray_is_the_one_orch_pins():
    import configparser
    from pathlib import Path

    import ray

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    extras = cfg["options.extras_require"]
    pins = {ln.strip().split("==")[1] for extra in ("cpu", "gpu") for ln in extras[extra].splitlines() if ln.strip().startswith("ray[")}
    assert pins == {node_hooks.CHECKED_RAY} and ray.__version__ == node_hooks.CHECKED_RAY


# Serve's ingress wrapper has an async __del__ (its replica awaits it at shutdown); a test's object
# is simply collected.
@pytest.mark.filterwarnings("ignore:coroutine .*__del__' was never awaited")
def test_the_replica_loads_the_named_class_and_builds_the_llm_config_from_the_dict(on_the_node_path, monkeypatch):
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve._private.http_util import ASGIAppReplicaWrapper
    from ray.serve._private.replica import _load_deployment_def_from_import_path

    got = []

    async def engine_start_stand_in(self, llm_config, **kwargs):  # LLMServer's constructor starts vLLM
        got.append(llm_config)

    monkeypatch.setattr(LLMServer, "__init__", engine_start_stand_in)
    cls = _load_deployment_def_from_import_path(node_hooks.INGRESS_CLASS)  # as the replica does
    assert issubclass(cls, ASGIAppReplicaWrapper) and issubclass(cls, LLMServer) and cls.__name__ == "LLMServer"
    config = _rendered("cpu-tp1")["args"]["llm_configs"][0]
    replica = cls.__new__(cls)  # constructed as Serve's replica does: __new__, then the async __init__
    asyncio.run(replica.__init__(llm_config=config))
    assert [type(c) for c in got] == [LLMConfig] and got[0].model_dump() == LLMConfig.model_validate(config).model_dump()


def test_the_light_build_task_imports_neither_vllm_nor_torch(on_the_node_path):
    import subprocess

    code = (
        "import sys, ray\n"
        "from ray.serve._private import build_app\n"
        "import orch_serve_hooks as m\n"
        "ray.get_runtime_context = lambda: type('C', (), {'runtime_env': {}})()\n"
        f"built = m.build_openai_app({_rendered('cpu-tp1')['args']!r})\n"
        "build_app.build_app(built, name='a', default_runtime_env={})\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'vllm', 'torch', 'transformers'}))\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(on_the_node_path), "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("app", "needs"), [
    ({"import_path": node_hooks.BUILDER_IMPORT_PATH, "args": {"llm_configs": [{}]}}, True),
    ({"import_path": "ray.serve.llm:build_openai_app",
      "args": {"llm_configs": [{"callback_config": {"callback_class": node_hooks.CALLBACK_CLASS}}]}}, True),
    ({"import_path": "ray.serve.llm:build_dp_openai_app",
      "args": {"llm_config": {"callback_config": {"callback_class": node_hooks.CALLBACK_CLASS}}}}, True),
    ({"import_path": "ray.serve.llm:build_openai_app", "args": {"llm_configs": [{}]}}, False),
])  # fmt: skip
def test_an_application_needs_the_module_for_its_builder_or_its_callback(app, needs):
    assert node_hooks.app_needs_module(app) is needs


def _worker_resolves(monkeypatch, caplog, supported: bool, granted: bool):
    """vLLM's own resolution of worker_extension_cls (``resolve_obj_by_qualname``, as
    ``WorkerWrapperBase.init_worker`` does) with the CPU's answers stubbed: the AMX flag, and
    whether Linux grants the tiles. Returns the class and the calls to ``_init_amx``."""
    import torch
    from vllm.utils.import_utils import resolve_obj_by_qualname

    asked: list[int] = []
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: supported)
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: asked.append(1) or granted)
    with caplog.at_level(logging.INFO, logger="vllm"):
        cls = resolve_obj_by_qualname(node_hooks.AMX_CLASS)
    return cls, asked


@pytest.mark.parametrize(("supported", "granted", "asks", "line"), [
    (True, True, 1, node_hooks.AMX_GRANTED_LINE),
    (True, False, 1, node_hooks.AMX_REFUSED_LINE),
    (False, False, 0, None),
])  # fmt: skip
def test_the_worker_extension_asks_for_the_amx_tiles_when_vllm_resolves_it(on_the_node_path, monkeypatch, caplog, supported, granted, asks, line):
    from vllm.v1.worker.cpu_worker import CPUWorker

    cls, asked = _worker_resolves(monkeypatch, caplog, supported, granted)
    assert len(asked) == asks
    said = [r.getMessage() for r in caplog.records if r.name == "vllm" and r.getMessage().startswith("orch:")]
    assert said == [] if line is None else (len(said) == 1 and said[0].startswith(line)), said
    # vLLM refuses an extension that shares a name with the worker's; orch's adds none
    assert [a for a in dir(cls) if not a.startswith("__") and hasattr(CPUWorker, a)] == []
    assert [a for a in dir(cls) if not a.startswith("__")] == []
    # resolved once per process: a second resolution asks nothing more
    again, asked_again = _worker_resolves(monkeypatch, caplog, supported, granted)
    assert again is cls and asked_again == []


def test_importing_the_module_asks_for_nothing(on_the_node_path, monkeypatch):
    # the build task and the replica import the module too: only the worker's resolution asks
    import importlib

    import torch

    asked: list[int] = []
    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: asked.append(1) or True)
    module = importlib.import_module(node_hooks.MODULE)
    assert module.SkipNodeInit is not None and asked == []


def _asgi(check, path, headers=(), method="POST", root_path=""):
    """One request through the front's key check over an app that answers 200."""
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": root_path + path, "root_path": root_path, "headers": list(headers)}
    asyncio.run(check(app)(scope, None, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_the_front_checks_the_api_key_as_vllm_does(on_the_node_path):
    """vLLM's AuthenticationMiddleware (vllm/entrypoints/serve/middleware/authenticate.py): a
    guarded path needs "Bearer KEY" (scheme in any case), else 401 {"error": "Unauthorized"};
    OPTIONS and other paths pass."""
    import importlib

    hooks = importlib.import_module(node_hooks.MODULE)
    hooks._FRONT_KEYS[:] = ["k-123"]
    check = hooks._KeyCheck
    assert _asgi(check, "/v1/completions") == (401, b'{"error":"Unauthorized"}')
    assert _asgi(check, "/v1/models", [(b"authorization", b"Bearer wrong")])[0] == 401
    assert _asgi(check, "/v1/models", [(b"authorization", b"k-123")])[0] == 401  # no scheme
    assert _asgi(check, "/v1/chat/completions", [(b"authorization", b"Bearer k-123")])[0] == 200
    assert _asgi(check, "/v1/chat/completions", [(b"authorization", b"bearer k-123")])[0] == 200
    for guarded in ("/v2/x", "/inference/v1/generate", "/cohere/v2/rerank"):
        assert _asgi(check, guarded)[0] == 401
    assert _asgi(check, "/health")[0] == 200 and _asgi(check, "/v1/models", method="OPTIONS")[0] == 200
    assert _asgi(check, "/v1/models", root_path="/api")[0] == 401  # the path under Serve's route prefix
    # the front's own routes sit under its route prefix /v1 (orchestrator/serve/front.py): guarded too
    assert _asgi(check, "/completions", root_path="/v1")[0] == 401
    assert _asgi(check, "/models", [(b"authorization", b"Bearer k-123")], method="GET", root_path="/_orch/front/v1")[0] == 200
    hooks._FRONT_KEYS[:] = []
    assert _asgi(check, "/v1/models", [(b"authorization", b"Bearer k-123")])[0] == 401  # no key set: closed


def test_the_front_builds_as_serve_builds_it_one_zero_cpu_ingress(on_the_node_path, monkeypatch):
    from orchestrator.serve.front import FRONT_DEPLOYMENT, FRONT_IMPORT_PATH, front_app

    app = front_app("c1", {"tiny": ("orch", "LLMServer:tiny")}, "/")
    built = _built(FRONT_IMPORT_PATH, monkeypatch, app)
    assert [d.name for d in built.deployments] == [FRONT_DEPLOYMENT] and built.ingress_deployment_name == FRONT_DEPLOYMENT
    (dep,) = built.deployments
    assert dep._deployment_config.num_replicas == 1 and dep.ray_actor_options == {"num_cpus": 0}


def test_the_callback_downloads_an_s3_adapter_and_points_vllm_at_the_local_copy(on_the_node_path, tmp_path, monkeypatch):
    """serve.lora: an ``s3://`` adapter of ``lora_modules`` is fetched on the node before the engine
    starts, from a real S3-compatible server (moto's, on loopback) through Serve LLM's cloud
    filesystem code and AWS_ENDPOINT_URL_S3; the path vLLM gets (engine_kwargs and the engine
    config Serve LLM built from them) is the local folder, beside orch's module on the node."""
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    from orchestrator.plan.tinymodel import build_tiny_model
    from tests.lora_store import S3Store, make_adapter

    model = build_tiny_model(tmp_path / "tiny")
    adapter = make_adapter(tmp_path / "sql", model)
    with S3Store() as store:
        uri = store.upload(adapter, "adapters", "tiny/sql")
        for key, value in store.env.items():
            monkeypatch.setenv(key, value)
        modules = [{"name": "sql", "path": uri, "base_model_name": "tiny"}, {"name": "disk", "path": str(adapter), "base_model_name": "tiny"}]
        config = LLMConfig(model_loading_config={"model_id": "tiny", "model_source": str(model)},
                           engine_kwargs={"enable_lora": True, "lora_modules": modules},
                           callback_config={"callback_class": node_hooks.CALLBACK_CLASS})  # fmt: skip
        config.get_engine_config()  # Serve LLM may have built it before the callback runs
        callback = load_class(node_hooks.CALLBACK_CLASS)(raise_error_on_callback=True, llm_config=config, ctx_kwargs={"runtime_env": {}})
        asyncio.run(callback.run_callback("on_before_node_init"))
    # where `orch down` deletes them (orch's module lives at hooks_path("c1", home) here)
    local = Path(node_hooks.adapters_dir("c1", str(on_the_node_path.parents[3])))
    (copy,) = [p for p in local.iterdir() if p.is_dir()]  # beside it: the download's lock file
    assert copy.name.startswith("sql-")
    assert (copy / "adapter_config.json").read_bytes() == (adapter / "adapter_config.json").read_bytes()
    assert (copy / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
    paths = [m["path"] for m in config.engine_kwargs["lora_modules"]]
    assert paths == [str(copy), str(adapter)]  # the disk adapter is left as it is
    assert [m["path"] for m in config.get_engine_config().frontend_kwargs["lora_modules"]] == paths


def test_an_s3_adapter_prefix_without_an_adapter_fails_the_engine_start_naming_it(on_the_node_path, tmp_path, monkeypatch):
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    from tests.lora_store import S3Store

    with S3Store() as store:
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "README").write_text("not an adapter")
        uri = store.upload(tmp_path / "x", "adapters", "nothing")
        for key, value in store.env.items():
            monkeypatch.setenv(key, value)
        config = LLMConfig(model_loading_config={"model_id": "tiny", "model_source": "/models/tiny"},
                           engine_kwargs={"lora_modules": [{"name": "sql", "path": uri, "base_model_name": "tiny"}]},
                           callback_config={"callback_class": node_hooks.CALLBACK_CLASS})  # fmt: skip
        callback = load_class(node_hooks.CALLBACK_CLASS)(raise_error_on_callback=True, llm_config=config, ctx_kwargs={"runtime_env": {}})
        with pytest.raises(Exception, match=f"LoRA adapter 'sql': no adapter_config.json under {uri}"):
            asyncio.run(callback.run_callback("on_before_node_init"))
    assert not [p for p in (on_the_node_path.parent / "lora").iterdir() if p.is_dir()]  # no half copy left
