"""The module orch writes on the nodes (serve/node_hooks.py), run by Ray's own code: Serve LLM
loads the class by the name the rendered application gives (``load_class`` in
ray/llm/_internal/common/utils/import_utils.py, as ``LLMConfig.get_or_create_callback`` does), constructs it the
way that method does and runs its ``on_before_node_init`` hook; ``VLLMEngine.start`` then reads
``callback.ctx.run_init_node`` (ray/llm/_internal/serve/engines/vllm/vllm_engine.py) before it
would start the per-node model task."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from orchestrator.serve import node_hooks


@pytest.fixture
def on_the_node_path(tmp_path, monkeypatch):
    folder = tmp_path / ".orch" / "nodes" / "c1" / "python"
    folder.mkdir(parents=True)
    (folder / f"{node_hooks.MODULE}.py").write_text(node_hooks.SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop(node_hooks.MODULE, None)


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


class _NoCluster:
    """``ray.get_runtime_context()`` outside a Ray worker: LLMServer.get_deployment_options reads
    the runtime env from it, and the real call would start a local Ray on this machine."""

    runtime_env: dict = {}


def _built(import_path, monkeypatch):
    """Builds the application the way Serve's build task does (``build_serve_application`` in
    ray/serve/_private/application_state.py: ``import_attr``, then
    ``call_user_app_builder_with_args_if_necessary``, then ``build_app``), under direct streaming."""
    import ray
    from ray._common.utils import import_attr
    from ray.llm._internal.serve.core.ingress import builder
    from ray.serve._private import build_app as build_module
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    # orch's nodes run Serve with HAProxy and Serve LLM with direct streaming (cluster.ray_nodes)
    monkeypatch.setattr(builder, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", True)
    monkeypatch.setattr(build_module, "RAY_SERVE_ENABLE_HA_PROXY", True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: _NoCluster())
    args = {"llm_configs": [{"model_loading_config": {"model_id": "tiny", "model_source": "/models/tiny"},
                             "accelerator_config": {"kind": "cpu"}, "engine_kwargs": {"tensor_parallel_size": 1}}]}  # fmt: skip
    app = call_user_app_builder_with_args_if_necessary(import_attr(import_path), args)
    return build_module.build_app(app, name="orch-r1", default_runtime_env={})


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
    from ray.llm._internal.serve.core.ingress import builder

    module = __import__(node_hooks.MODULE)
    monkeypatch.setattr(builder, "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING", False)
    with pytest.raises(ValueError, match="needs RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1"):
        module.build_openai_app({"llm_configs": [{"model_loading_config": {"model_id": "tiny"}}]})


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
