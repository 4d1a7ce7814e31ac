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
