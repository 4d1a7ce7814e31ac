"""orch's Serve LLM callback on the nodes: no per-node model task at every engine start.

Ray Serve LLM begins every engine start (``VLLMEngine.start`` in
``ray/llm/_internal/serve/engines/vllm/vllm_engine.py``, Ray 2.60) with ``initialize_node``
(``ray/llm/_internal/serve/utils/node_initialization_utils.py``): a new worker process on every
node of the replica's placement group, which imports torch and transformers (4.4 CPU-s measured
here; 170 s under load in a capture, docs/testing.md) to call ``download_model_files``
(``ray/llm/_internal/common/utils/download_utils.py``). Without a cloud mirror that function
only returns the model id it was given. orch renders none: the model is a local path (synced by
`orch model sync`, checked on every node before the apply) or a hub id that vLLM resolves on each
node itself. Only a ``callback_config`` class whose context says ``run_init_node=False`` skips
the task (``CallbackCtx`` in ``ray/llm/_internal/common/callbacks/base.py``), and that class
must import in the replica's process: orch writes it to its own folder on every node (``orch
up`` and every rollout, before the apply) and puts that folder first on the application's
PYTHONPATH. A remote model source (``s3://``, ``gs://``, ...) keeps Serve LLM's task: there it
downloads.

The same module carries orch's builder (``BUILDER_IMPORT_PATH``). Under direct streaming, Ray
2.60's ``build_openai_app`` makes the LLMServer replica the ingress and attaches Serve LLM's
``LLMRouter`` as the application's ingress request router (``core/ingress/builder.py``,
``_build_openai_ingress_request_router``): HAProxy asks that Python replica for a replica before
every POST. With Serve LLM's default router (``RoundRobinRouter``) that hop decides nothing that
HAProxy's own ``balance leastconn`` over the replicas' ports would not, and it was the whole
extra time of orch's public route against bare vLLM (docs/rollout.md, "Where the extra time
goes"). orch's builder builds the same LLMServer ingress deployment with Serve LLM's own
functions and attaches no router: HAProxy sends each request straight to a replica's port. A
request router the manifest chooses (``serve.request_router``) needs LLMRouter: the application
then keeps Serve LLM's builder. Pure: the file's text, its place and the rendered values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.serve.app_shape import llm_configs

MODULE = "orch_serve_hooks"
CALLBACK_CLASS = f"{MODULE}.SkipNodeInit"
BUILDER_IMPORT_PATH = f"{MODULE}:build_openai_app"
# Model sources Serve LLM's per-node task downloads from (download_utils.is_remote_path).
REMOTE_SOURCES = ("s3://", "gs://", "abfss://", "azure://", "pyarrow-")
# The line the callback logs in the replica's log (tests and `orch logs` readers look for it).
SKIPPED_LINE = "orch: Serve LLM's per-node model task skipped"

SOURCE = f'''"""Written by orch (orchestrator/serve/node_hooks.py) on every node of its cluster; `orch down`
removes it. Ray Serve LLM loads this class by name (callback_config) in each engine replica."""

import logging

from ray.llm._internal.common.callbacks.base import CallbackBase


class SkipNodeInit(CallbackBase):
    """Skips Serve LLM's per-node model task: orch renders no cloud mirror, so the task would
    only return the model id, after a fresh worker imported torch on every node."""

    async def on_before_node_init(self) -> None:
        self.ctx.run_init_node = False
        logging.getLogger("ray.serve").info(
            "{SKIPPED_LINE} (the model is %s: no cloud mirror to download from)",
            self.llm_config.model_loading_config.model_source or self.llm_config.model_loading_config.model_id,
        )


def build_openai_app(builder_config: dict):
    """Ray Serve LLM's build_openai_app under direct streaming, without the LLMRouter hop: the
    LLMServer deployment (vLLM's own app) is the ingress and HAProxy balances over its replicas.
    The same Serve LLM functions build it (ray/llm/_internal/serve/core/ingress/builder.py)."""
    from ray import serve
    from ray.llm._internal.serve.core.ingress import builder
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment
    from ray.llm._internal.serve.core.server.llm_server import LLMServer

    args = builder.LLMServingArgs.model_validate(builder_config)
    if not builder.RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING:
        raise ValueError("orch_serve_hooks:build_openai_app needs RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING=1 in the "
                         "application's runtime_env (orch renders it); use ray.serve.llm:build_openai_app without it")
    if len(args.llm_configs) != 1:
        raise ValueError(f"orch_serve_hooks:build_openai_app serves exactly one model, got {{len(args.llm_configs)}}")
    builder._validate_direct_streaming_ingress_config(args.ingress_deployment_config, args.ingress_cls_config)
    llm_config = args.llm_configs[0]
    # As _build_direct_streaming_llm_deployment, less the RoundRobinRouter it sets for LLMRouter's
    # picks: Serve refuses any request_router_class on an ingress deployment that HAProxy
    # balances itself ("A custom `request_router_config.request_router_class` is not supported
    # on the ingress deployment when HAProxy is enabled", ray/serve/_private/application_state.py).
    return build_llm_deployment(llm_config, deployment_cls=serve.ingress()(llm_config.server_cls or LLMServer))
'''


def app_needs_module(app: Mapping[str, Any]) -> bool:
    """Whether a rendered (or stored) application imports orch's module on the nodes: orch's
    builder, or its callback."""
    if str(app.get("import_path") or "").startswith(MODULE + ":"):
        return True
    return any((c.get("callback_config") or {}).get("callback_class") == CALLBACK_CLASS for c in llm_configs(app) if isinstance(c, Mapping))


def uses_hooks(model_source: str) -> bool:
    """Whether an application serving ``model_source`` skips the per-node task (not remote)."""
    return not model_source.startswith(REMOTE_SOURCES)


def hooks_dir(cluster: str, home: str) -> str:
    """The folder on a node that holds the module: beside the node's Ray token, under the SSH
    user's home (``cluster.ray_nodes.node_token_path``)."""
    return f"{home.rstrip('/')}/.orch/nodes/{cluster}/python"


def hooks_path(cluster: str, home: str) -> str:
    return f"{hooks_dir(cluster, home)}/{MODULE}.py"


def pythonpath(cluster: str, user_pythonpath: str | None = None) -> str:
    """The runtime env's PYTHONPATH: orch's folder first. ``${HOME}`` and ``${PYTHONPATH}`` are
    expanded on each node as a worker starts (``update_envs`` in ``ray/_private/utils.py``), so
    the node's own PYTHONPATH stays behind it; a PYTHONPATH the manifest's env sets replaces the
    node's."""
    tail = user_pythonpath if user_pythonpath is not None else "${PYTHONPATH}"
    return f"{hooks_dir(cluster, '${HOME}')}:{tail}"
