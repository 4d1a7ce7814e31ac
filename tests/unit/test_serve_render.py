"""serve/config.py's render_app, one behaviour each (issue 17: what the mutation run of the module
found untested). Expected values: the shipped manifests in cluster-templates/ (hosts, interfaces,
env), the defaults docs/rollout.md documents (health check every 10 s with a 30 s timeout, 30 s
graceful shutdown, max_surge_percent 100, direct streaming, RAY_ADDRESS on GPU), vLLM's argument
names and choices (``--dtype auto`` for quantized weights, ``--kv-cache-dtype fp8_e4m3``) and Ray Serve's
``autoscaling_config`` field names (min/initial/max_replicas, target_ongoing_requests)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import ServeConfigError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve.config import AppTarget, ServeDefaults, ServingPlan, render_app

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"
TARGET = AppTarget("orch-r2", "/_orch/r2", "llama3-405b", "/mnt/shared/models/Llama-3.1-405B-Instruct")


@pytest.fixture(scope="module")
def gpu_manifest():
    return load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml")


@pytest.fixture(scope="module")
def cpu_manifest():
    return load_manifest_file(TEMPLATES / "local.yaml")


def _llm(app: dict) -> dict:
    return app["args"]["llm_configs"][0]


def test_the_405b_manifest_renders_in_full(gpu_manifest):
    # 2 nodes x 8 H100 (gpu-a 10.10.0.11 is the head, both name ib0, env NCCL_DEBUG/NCCL_IB_DISABLE):
    # TP 8 inside each node, stage i pinned to its node, every default of docs/rollout.md. 1024
    # sequences: vLLM's API-server default on an H100-80GB from 0.9 (engine/arg_utils.py
    # get_batch_defaults, >= 70 GiB and not an A100); Serve takes 1.25x that per replica.
    plan = ServingPlan(tp=8, pp=2, max_model_len=8192, dtype="bf16", gpu_memory_utilization=0.9, max_num_seqs=1024)
    rendered = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource, accelerator_type="H100",
                          stage_nodes=["gpu-a", "gpu-b"])  # fmt: skip
    pins = [{"GPU": 1, "orch_node_gpu-a": 0.001}] * 8 + [{"GPU": 1, "orch_node_gpu-b": 0.001}] * 8
    assert rendered.app == {
        "name": "orch-r2",
        "route_prefix": "/_orch/r2",
        # orch's builder on the nodes (serve/node_hooks.py): the LLMServer ingress without Serve
        # LLM's LLMRouter hop, so there is no router deployment to configure
        "import_path": "orch_serve_hooks:build_openai_app",
        "runtime_env": {
            "env_vars": {
                "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1",
                "RAY_ADDRESS": "10.10.0.11:6379",
                "NCCL_SOCKET_IFNAME": "ib0",
                "GLOO_SOCKET_IFNAME": "ib0",
                "NCCL_DEBUG": "WARN",
                "NCCL_IB_DISABLE": "0",
                # orch's folder on each node first (expanded there by Ray as a worker starts)
                "PYTHONPATH": "${HOME}/.orch/nodes/llama405/python:${PYTHONPATH}",
            }
        },
        "args": {
            "llm_configs": [
                {
                    "model_loading_config": {
                        "model_id": "llama3-405b",
                        "model_source": "/mnt/shared/models/Llama-3.1-405B-Instruct",
                    },
                    "accelerator_type": "H100",
                    "engine_kwargs": {
                        "tensor_parallel_size": 8,
                        "pipeline_parallel_size": 2,
                        "max_model_len": 8192,
                        "dtype": "bfloat16",
                        "gpu_memory_utilization": 0.9,
                        "distributed_executor_backend": "ray",
                        "api_key": ["<redacted>"],
                    },
                    # skips Serve LLM's per-node model task (ray/llm/_internal/common/callbacks/base.py)
                    "callback_config": {"callback_class": "orch_serve_hooks.SkipNodeInit"},
                    "placement_group_config": {"strategy": "PACK", "bundles": pins},
                    "deployment_config": {
                        "num_replicas": 1,
                        "max_ongoing_requests": 1280,
                        "health_check_period_s": 10,
                        "health_check_timeout_s": 30,
                        "graceful_shutdown_timeout_s": 30,
                        "max_surge_percent": 100,
                    },
                }
            ]
        },
    }
    assert rendered.stage_nodes == ("gpu-a", "gpu-b")
    assert rendered.notes == ("pipeline stages pinned to nodes: stage 0: gpu-a, stage 1: gpu-b",)


def test_fp8_weights_and_an_fp8_kv_cache_become_vllm_flags(gpu_manifest):
    # fp8 weights: vLLM takes the activation dtype from the checkpoint ("auto"); the quantization is
    # the checkpoint's own (an on-the-fly one comes in the plan's engine kwargs: test_quantized_rollout)
    plan = ServingPlan(tp=8, pp=1, max_model_len=4096, dtype="fp8", kv_cache_dtype="fp8_e4m3")
    kw = _llm(render_app(gpu_manifest, plan, TARGET, node_resource=node_resource).app)["engine_kwargs"]
    assert (kw["dtype"], kw["kv_cache_dtype"]) == ("auto", "fp8_e4m3") and "quantization" not in kw
    # 16-bit weights and vLLM's own KV dtype ("auto"): neither flag is passed.
    kw = _llm(
        render_app(gpu_manifest, ServingPlan(tp=8, pp=1, max_model_len=4096), TARGET, node_resource=node_resource).app
    )["engine_kwargs"]
    assert kw["dtype"] == "bfloat16" and "quantization" not in kw and "kv_cache_dtype" not in kw


def test_deployment_settings_come_from_the_defaults_given(gpu_manifest, cpu_manifest):
    defaults = ServeDefaults(health_check_period_s=5, health_check_timeout_s=60, graceful_shutdown_timeout_s=45,
                             max_surge_percent=50, max_ongoing_requests=64, router_drain_s=4)  # fmt: skip
    app = render_app(gpu_manifest, ServingPlan(tp=8, pp=1, max_model_len=4096, replicas=2), TARGET,
                     node_resource=node_resource, defaults=defaults).app  # fmt: skip
    assert _llm(app)["deployment_config"] == {
        "num_replicas": 2, "max_ongoing_requests": 64, "health_check_period_s": 5, "health_check_timeout_s": 60,
        "graceful_shutdown_timeout_s": 45, "max_surge_percent": 50,
    }  # fmt: skip
    assert "deployments" not in app  # orch's builder: no LLMRouter
    # A chosen request router keeps Serve LLM's builder and its LLMRouter, which is replaced with a
    # surge too and outlives HAProxy's reloads by router_drain_s before it exits: Serve's own
    # default (stop first, exit after 2 s) cost a request "router_unreachable" in a side-by-side switch.
    routed = render_app(gpu_manifest, ServingPlan(tp=8, pp=1, max_model_len=4096, replicas=2), TARGET, node_resource=node_resource,
                        defaults=replace(defaults, request_router="session_affinity")).app  # fmt: skip
    assert routed["import_path"] == "ray.serve.llm:build_openai_app"
    assert routed["deployments"] == [{"name": "LLMRouter", "max_surge_percent": 50, "graceful_shutdown_wait_loop_s": 4,
                                      "graceful_shutdown_timeout_s": 45}]  # fmt: skip
    cpu = render_app(cpu_manifest, ServingPlan(tp=2, pp=1, max_model_len=1024), TARGET, node_resource=node_resource,
                     defaults=ServeDefaults(cpus_per_cpu_worker=3, cpu_kv_cache_gib=4)).app  # fmt: skip
    assert _llm(cpu)["placement_group_config"] == {"strategy": "STRICT_PACK", "bundles": [{"CPU": 3}, {"CPU": 3}]}
    # The manifest's env (VLLM_CPU_KVCACHE_SPACE: "1") wins over the default the plan falls back to.
    assert cpu["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_a_cpu_kv_cache_in_a_fraction_of_a_gib_is_the_engines_kv_cache_memory_bytes(cpu_manifest):
    # 0.25 GiB: vLLM 0.32's CPU worker logged "Explicitly set (0.25/23.54) GiB for KV cache" and
    # "CPU KV cache size: 131,072 tokens" for the tiny model with kv_cache_memory_bytes=268435456
    # and VLLM_CPU_KVCACHE_SPACE unset (tests/data/planner/vllm-0.32-cpu-tiny-kv-fraction.log).
    bare = cpu_manifest.model_copy(update={"env": {}})
    plan = ServingPlan(tp=1, pp=1, max_model_len=1024, kv_cache_gib=0.25)
    app = render_app(bare, plan, TARGET, node_resource=node_resource).app
    assert _llm(app)["engine_kwargs"]["kv_cache_memory_bytes"] == 268_435_456
    assert "VLLM_CPU_KVCACHE_SPACE" not in app["runtime_env"]["env_vars"]
    # The template's env sets the variable ("1"): vLLM would put 1 GiB in place of the argument,
    # and no runtime env can unset what the nodes' Ray processes carry (an empty value stops the
    # engine: vllm/envs.py reads it with int()). Refused, naming the field.
    with pytest.raises(ServeConfigError) as err:
        render_app(cpu_manifest, plan, TARGET, node_resource=node_resource)
    assert str(err.value).startswith("env.VLLM_CPU_KVCACHE_SPACE is '1': ") and "--kv-cache-gib" in err.value.hint
    # A whole size stays the variable (the manifest's value wins, as for the default) and adds no argument.
    whole = render_app(cpu_manifest, replace(plan, kv_cache_gib=2), TARGET, node_resource=node_resource).app
    assert "kv_cache_memory_bytes" not in _llm(whole)["engine_kwargs"]
    assert whole["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert render_app(bare, replace(plan, kv_cache_gib=2), TARGET, node_resource=node_resource).app["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_autoscaling_between_the_plans_replicas_and_the_maximum(gpu_manifest):
    plan = ServingPlan(tp=8, pp=1, max_model_len=4096, replicas=2)
    app = render_app(
        gpu_manifest, plan, TARGET, node_resource=node_resource, defaults=ServeDefaults(autoscaling_max_replicas=4)
    ).app
    # A plan without max_num_seqs: vLLM's smallest GPU default, 256 sequences, so a replica takes
    # 320 requests (1.25x) and the autoscaler aims at a full batch, 256, 25% under the cap as Ray's
    # autoscaling guide asks (max_ongoing_requests ~20-50% above target_ongoing_requests).
    assert _llm(app)["deployment_config"] == {
        "autoscaling_config": {"min_replicas": 2, "initial_replicas": 2, "max_replicas": 4, "target_ongoing_requests": 256},
        "max_ongoing_requests": 320, "health_check_period_s": 10, "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": 30, "max_surge_percent": 100,
    }  # fmt: skip
    # A maximum that is not above the plan's replicas is a fixed count.
    fixed = render_app(
        gpu_manifest, plan, TARGET, node_resource=node_resource, defaults=ServeDefaults(autoscaling_max_replicas=2)
    ).app
    assert (
        _llm(fixed)["deployment_config"]["num_replicas"] == 2
        and "autoscaling_config" not in _llm(fixed)["deployment_config"]
    )
    # One request per replica: the target is still at least one.
    one = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource,
                     defaults=ServeDefaults(autoscaling_max_replicas=3, max_ongoing_requests=1)).app  # fmt: skip
    assert _llm(one)["deployment_config"]["autoscaling_config"]["target_ongoing_requests"] == 1


@pytest.mark.parametrize(("tp", "pp"), [(0, 1), (1, 0)], ids=["tp0", "pp0"])
def test_a_plan_without_workers_is_refused(cpu_manifest, tp, pp):
    with pytest.raises(ServeConfigError) as err:
        render_app(cpu_manifest, ServingPlan(tp=tp, pp=pp, max_model_len=64), TARGET, node_resource=node_resource)
    assert (err.value.message, err.value.hint) == (f"invalid plan: tp={tp} pp={pp}", "tp and pp are at least 1")


def test_stage_nodes_must_name_one_node_per_stage(gpu_manifest):
    plan = ServingPlan(tp=8, pp=2, max_model_len=4096)
    with pytest.raises(ServeConfigError) as err:
        render_app(gpu_manifest, plan, TARGET, node_resource=node_resource, stage_nodes=["gpu-a"])
    assert err.value.message == "1 stage nodes given for pp=2"
    assert err.value.hint == "give one node per pipeline stage (stage_nodes_for picks them)"
    # No stage nodes at all is not a mismatch: the stages are left unpinned.
    assert render_app(gpu_manifest, plan, TARGET, node_resource=node_resource).stage_nodes is None


def test_unpinned_stages_say_so_on_gpu_only(gpu_manifest, cpu_manifest):
    plan = ServingPlan(tp=8, pp=2, max_model_len=4096, replicas=2)
    gpu = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource)
    assert gpu.notes == ("replicas > 1: pipeline stages are not pinned to nodes (PACK fills one node first)",)
    assert gpu.stage_nodes is None
    # The CPU layout is one node per replica (vLLM's mp executor): nothing to pin, nothing to say.
    cpu = render_app(
        cpu_manifest, ServingPlan(tp=1, pp=2, max_model_len=64, replicas=2), TARGET, node_resource=node_resource
    )
    assert cpu.notes == ()


def test_tp_across_nodes_is_warned_about_in_full_on_gpu_only(gpu_manifest, cpu_manifest):
    plan = ServingPlan(tp=16, pp=1, max_model_len=4096, gpus_per_node=8)
    rendered = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource)
    assert rendered.notes == (
        "warning: tensor parallel 16 spans nodes of 8 GPU(s): every layer's all-reduce crosses the network between "
        "them (placement PACK); the automatic plan keeps TP inside a node",
    )
    cpu = render_app(
        cpu_manifest, ServingPlan(tp=2, pp=1, max_model_len=64, gpus_per_node=1), TARGET, node_resource=node_resource
    )
    assert cpu.notes == ()


def test_the_autoscaling_target_is_a_whole_number_of_requests(gpu_manifest):
    # 5 requests per replica / 1.25 = 4: a whole target, below the cap (at the cap Serve's replicas
    # would never count as over their target).
    defaults = ServeDefaults(autoscaling_max_replicas=3, max_ongoing_requests=5)
    app = render_app(
        gpu_manifest,
        ServingPlan(tp=8, pp=1, max_model_len=4096),
        TARGET,
        node_resource=node_resource,
        defaults=defaults,
    ).app
    target = _llm(app)["deployment_config"]["autoscaling_config"]["target_ongoing_requests"]
    assert (target, type(target)) == (4, int)


def test_a_single_stage_gpu_plan_has_nothing_to_note(gpu_manifest):
    assert (
        render_app(gpu_manifest, ServingPlan(tp=8, pp=1, max_model_len=4096), TARGET, node_resource=node_resource).notes
        == ()
    )


def test_a_value_that_breaks_the_yaml_is_reported_as_orchs_bug(cpu_manifest):
    # Numbers are rendered as they are; a caller that passes text where a number belongs gets an
    # error that says to report it, not a traceback from the YAML parser.
    plan = ServingPlan(tp=1, pp=1, max_model_len=cast(Any, "[1, 2"))
    with pytest.raises(ServeConfigError) as err:
        render_app(cpu_manifest, plan, TARGET, node_resource=node_resource)
    assert err.value.message.startswith("the rendered Serve config is not valid YAML: while parsing a flow sequence")
    assert err.value.hint == "report it with --debug output"


@pytest.mark.parametrize(("router", "cls"), [
    ("session_affinity", "ray.serve.experimental.consistent_hash_router.ConsistentHashRouter"),  # Ray 2.60's experimental module
])  # fmt: skip
def test_a_request_router_goes_on_the_llm_server_deployment(cpu_manifest, router, cls):
    # LLMRouter picks replicas through the LLMServer deployment's handle, so its request_router_config
    # is where the choice takes effect (ray/llm/_internal/serve/core/ingress/router.py: _pick_replica).
    app = render_app(cpu_manifest, ServingPlan(tp=1, pp=1, max_model_len=1024, replicas=2), TARGET, node_resource=node_resource,
                     defaults=ServeDefaults(request_router=router)).app  # fmt: skip
    assert _llm(app)["deployment_config"]["request_router_config"] == {"request_router_class": cls}
    assert app["import_path"] == "ray.serve.llm:build_openai_app"  # Serve LLM's builder: LLMRouter asks the class
    assert app["deployments"][0]["name"] == "LLMRouter" and "request_router_config" not in app["deployments"][0]
    # The default: orch's builder, no router class (Serve refuses one on an ingress HAProxy balances)
    # and no LLMRouter: HAProxy's leastconn picks the replica.
    default = render_app(cpu_manifest, ServingPlan(tp=1, pp=1, max_model_len=1024), TARGET, node_resource=node_resource).app
    assert "request_router_config" not in _llm(default)["deployment_config"]
    assert default["import_path"] == "orch_serve_hooks:build_openai_app" and "deployments" not in default


def test_a_bucket_model_source_keeps_serve_llms_builder(cpu_manifest):
    # No orch folder on its PYTHONPATH (Serve LLM's per-node task downloads it), so no orch builder.
    app = render_app(cpu_manifest, ServingPlan(tp=1, pp=1, max_model_len=1024), AppTarget("orch-r2", "/", "tiny", "s3://bucket/tiny"),
                     node_resource=node_resource).app  # fmt: skip
    assert app["import_path"] == "ray.serve.llm:build_openai_app" and app["deployments"][0]["name"] == "LLMRouter"
    assert "PYTHONPATH" not in app["runtime_env"]["env_vars"] and "callback_config" not in _llm(app)


def test_an_unknown_request_router_is_refused(cpu_manifest):
    with pytest.raises(ServeConfigError) as err:
        render_app(cpu_manifest, ServingPlan(tp=1, pp=1, max_model_len=1024), TARGET, node_resource=node_resource,
                   defaults=ServeDefaults(request_router="prefix"))  # fmt: skip
    assert err.value.message == "unknown request router 'prefix'"
    assert err.value.hint == "use one of: default, session_affinity"


def test_prefix_cache_affinity_is_refused_with_why_it_cannot_work_behind_direct_streaming(cpu_manifest):
    # LLMRouter's pick-only choose_replica(_reserve=False) never calls on_request_routed, where
    # PrefixCacheAffinityRouter learns prompts (ray/serve/_private/router.py, Ray 2.60): measured,
    # every request went to one replica. The rendered config must not claim an affinity it lacks.
    with pytest.raises(ServeConfigError) as err:
        render_app(cpu_manifest, ServingPlan(tp=1, pp=1, max_model_len=1024, replicas=2), TARGET, node_resource=node_resource,
                   defaults=ServeDefaults(request_router="prefix_affinity"))  # fmt: skip
    assert "on_request_routed" in err.value.message and "one replica" in err.value.message
    assert err.value.hint.startswith("use session_affinity and send one x-session-id per shared prefix")


def test_autoscaling_bounds_and_target_from_a_measured_policy(gpu_manifest):
    plan = ServingPlan(tp=8, pp=1, max_model_len=4096, replicas=1)
    app = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource,
                     defaults=ServeDefaults(autoscaling_min_replicas=2, autoscaling_max_replicas=3, autoscaling_target_ongoing=6)).app  # fmt: skip
    assert _llm(app)["deployment_config"]["autoscaling_config"] == {
        "min_replicas": 2, "initial_replicas": 2, "max_replicas": 3, "target_ongoing_requests": 6}  # fmt: skip
    # A policy whose bounds meet (the cluster holds just what the target needs) is a fixed count of that many.
    fixed = render_app(gpu_manifest, plan, TARGET, node_resource=node_resource,
                       defaults=ServeDefaults(autoscaling_min_replicas=2, autoscaling_max_replicas=2, autoscaling_target_ongoing=6)).app  # fmt: skip
    assert _llm(fixed)["deployment_config"]["num_replicas"] == 2 and "autoscaling_config" not in _llm(fixed)["deployment_config"]


def test_a_remote_model_source_keeps_serve_llms_per_node_download(gpu_manifest):
    """Serve LLM's per-node task downloads from a bucket (download_utils.download_model_files with
    a CloudMirrorConfig): no callback that skips it, no PYTHONPATH of orch's; a local path skips it."""
    plan = ServingPlan(tp=8, pp=2, max_model_len=8192, dtype="bf16", gpu_memory_utilization=0.9)
    for source in ("s3://models/llama-405b", "gs://models/llama-405b", "abfss://c@a.dfs.core.windows.net/m"):
        app = render_app(gpu_manifest, plan, AppTarget("orch-r2", "/_orch/r2", "llama3-405b", source),
                         node_resource=node_resource, stage_nodes=["gpu-a", "gpu-b"]).app  # fmt: skip
        assert "callback_config" not in _llm(app) and "PYTHONPATH" not in app["runtime_env"]["env_vars"], source
    app = render_app(gpu_manifest, plan, AppTarget("orch-r2", "/_orch/r2", "llama3-405b", "meta-llama/Llama-3.1-405B"),
                     node_resource=node_resource, stage_nodes=["gpu-a", "gpu-b"]).app  # fmt: skip
    assert _llm(app)["callback_config"] == {"callback_class": "orch_serve_hooks.SkipNodeInit"}


def test_the_manifests_pythonpath_stays_behind_orchs_folder(cpu_manifest):
    manifest = cpu_manifest.model_copy(update={"env": {**cpu_manifest.env, "PYTHONPATH": "/opt/site"}})
    plan = ServingPlan(tp=1, pp=1, max_model_len=2048, dtype="bf16")
    app = render_app(manifest, plan, AppTarget("orch-r1", "/", "tiny", "/models/tiny"), node_resource=node_resource).app
    assert app["runtime_env"]["env_vars"]["PYTHONPATH"] == "${HOME}/.orch/nodes/local/python:/opt/site"
