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

The callback also turns off Serve LLM's telemetry push in the replica (``LLMServer._start_engine``
waits on a detached Ray actor with no timeout; one left half-made by a stopped replica hangs every
later engine start of the cluster; see ``SkipNodeInit``).

The same module carries orch's builder (``BUILDER_IMPORT_PATH``). Under direct streaming, Ray
2.60's ``build_openai_app`` makes the LLMServer replica the ingress and attaches Serve LLM's
``LLMRouter`` as the application's ingress request router (``core/ingress/builder.py``,
``_build_openai_ingress_request_router``): HAProxy asks that Python replica for a replica before
every POST. With Serve LLM's default router (``RoundRobinRouter``) that hop decides nothing that
HAProxy's own ``balance leastconn`` over the replicas' ports would not, and it was the whole
extra time of orch's public route against bare vLLM (docs/rollout.md, "Serving overhead and
orch's Serve settings"). orch's builder builds the same LLMServer ingress deployment with Serve LLM's own
functions and attaches no router: HAProxy sends each request straight to a replica's port. A
request router the manifest chooses (``serve.request_router``) needs LLMRouter: the application
then keeps Serve LLM's builder.

Serve runs the builder in a task of its own at every apply. Serve LLM's builder imports vLLM
there (10.3 s alone, 277 vLLM modules, against 1.7 s for Ray Serve: docs/testing.md, "Where the
suite's time goes") only to compute the deployment's options. For what orch renders (explicit placement bundles,
CPU or GPU, no request router) those options follow from the config itself: the builder computes
them as ``LLMServer.get_deployment_options`` and ``build_llm_deployment`` do, names the replica's
class by its import path (``INGRESS_CLASS``, made on first use in the replica, where vLLM is
imported anyway) and passes the config as a dict, which the replica validates into an
``LLMConfig``. That holds on the Ray release it was compared with (``CHECKED_RAY``, the one
setup.cfg pins; tests/unit/test_serve_node_hooks.py builds both ways and compares every option);
any other release or config builds through Serve LLM's functions as before.

The module itself is ``orchestrator/remote/node_programs/orch_serve_hooks.py`` (a real module, written
whole to the nodes); this one holds its names, its place on the nodes and the rendered values.
Pure, but for reading that file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.remote import node_programs
from orchestrator.serve.shapes import ORCH_BUILDER_IMPORT_PATH, llm_configs

MODULE = "orch_serve_hooks"
CALLBACK_CLASS = f"{MODULE}.SkipNodeInit"
BUILDER_IMPORT_PATH = ORCH_BUILDER_IMPORT_PATH  # "<MODULE>:build_openai_app", one of the tp_pp shape's builders
# The class the light build names as the replica's (loaded by import path in the replica).
INGRESS_CLASS = f"{MODULE}.LLMServerIngress"
# The Ray release the light build was checked against: the one orch pins (setup.cfg).
CHECKED_RAY = "2.60.0"
# Model sources Serve LLM's per-node task downloads from (download_utils.is_remote_path).
REMOTE_SOURCES = ("s3://", "gs://", "abfss://", "azure://", "pyarrow-")
# The line the callback logs in the replica's log (tests and `orch logs` readers look for it); this
# and the lines and names below are the node module's own (a test checks that they agree).
SKIPPED_LINE = "orch: Serve LLM's per-node model task skipped"
# The vLLM worker extension orch names for a CPU engine (``worker_extension_cls``): resolving it in
# the engine's worker process asks Linux for the AMX tile registers (``_amx_tile_data`` in the module).
AMX_CLASS = f"{MODULE}.AmxTileData"
# The lines the worker logs when it resolves the class (tests and `orch logs` readers look for them).
AMX_GRANTED_LINE = "orch: AMX tile data enabled for this vLLM worker"
AMX_REFUSED_LINE = "orch: the kernel refused AMX tile data to this vLLM worker"
# The line the callback logs for each S3 LoRA adapter it downloaded before the engine started (serve.lora).
ADAPTER_LINE = "orch: LoRA adapter downloaded"
# The lines the replica logs as it loads (or fails to load) a runtime adapter of its user_config
# (``reconfigure``; serve/lora.py), and the user_config key that lists them.
ADAPTER_LOADED_LINE = "orch: LoRA adapter loaded"
ADAPTER_FAILED_LINE = "orch: LoRA adapter not loaded"
LORA_KEY = "lora_adapters"
# Where LLMServer._start_engine finds the telemetry push it calls after the engine started (Ray
# 2.60, ray/llm/_internal/serve/core/server/llm_server.py); the callback replaces it there.
LLM_SERVER_MODULE = "ray.llm._internal.serve.core.server.llm_server"
TELEMETRY_PUSH = "push_telemetry_report_for_all_models"


def source() -> str:
    """The module's text, written whole to every node (``orchestrator/remote/node_programs/orch_serve_hooks.py``)."""
    return node_programs.source(MODULE)


def app_needs_module(app: Mapping[str, Any]) -> bool:
    """Whether a rendered (or stored) application imports orch's module on the nodes: orch's
    builder, or its callback."""
    if str(app.get("import_path") or "").startswith(MODULE + ":"):
        return True
    return any((c.get("callback_config") or {}).get("callback_class") == CALLBACK_CLASS for c in llm_configs(app) if isinstance(c, Mapping))


def uses_hooks(model_source: str) -> bool:
    """Whether an application serving ``model_source`` skips the per-node task (not remote)."""
    return not model_source.startswith(REMOTE_SOURCES)


def _cluster_dir(cluster: str, home: str) -> str:
    """orch's folder of the cluster on a node, under the SSH user's home (the node's Ray token is
    there too: ``cluster.ray_nodes.node_token_path``)."""
    return f"{home.rstrip('/')}/.orch/nodes/{cluster}"


def hooks_dir(cluster: str, home: str) -> str:
    """The folder on a node that holds the module."""
    return f"{_cluster_dir(cluster, home)}/python"


def adapters_dir(cluster: str, home: str) -> str:
    """Where the callback puts LoRA adapters it downloads from S3 (``adapter_dir`` in the node
    module): a sibling of ``hooks_dir``, orch's own files only."""
    return f"{_cluster_dir(cluster, home)}/lora"


def hooks_path(cluster: str, home: str) -> str:
    return f"{hooks_dir(cluster, home)}/{MODULE}.py"


def pythonpath(cluster: str, user_pythonpath: str | None = None) -> str:
    """The runtime env's PYTHONPATH: orch's folder first. ``${HOME}`` and ``${PYTHONPATH}`` are
    expanded on each node as a worker starts (``update_envs`` in ``ray/_private/utils.py``), so
    the node's own PYTHONPATH stays behind it; a PYTHONPATH the manifest's env sets replaces the
    node's."""
    tail = user_pythonpath if user_pythonpath is not None else "${PYTHONPATH}"
    return f"{hooks_dir(cluster, '${HOME}')}:{tail}"
