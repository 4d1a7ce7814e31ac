"""serve_config: rendering the Serve LLM application, keys, fingerprints, and validation with
Ray Serve LLM's own LLMConfig (real import of ray.serve.llm: about 10 s once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import ServeConfigError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import shape_from_manifest
from orchestrator.serve.config import AppTarget, ServingPlan, deploy_body, render_app
from orchestrator.serve.engine_args import check_engine_arg_key, parse_engine_arg
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, config_fingerprint, mask_api_key
from orchestrator.serve.placement import ray_accelerator_type, stage_nodes_for
from orchestrator.serve.ray_io.validate import validate_app

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"


@pytest.fixture(scope="module")
def local_manifest():
    return load_manifest_file(TEMPLATES / "local.yaml")


@pytest.fixture(scope="module")
def manifest_405b():
    return load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml")


def _target(name="orch-r1", route="/", model="tiny", source="/models/tiny"):
    return AppTarget(name, route, model, source)


def _cpu_app(manifest, **plan):
    sp = ServingPlan(tp=1, pp=1, max_model_len=plan.pop("max_model_len", 1024), **plan)
    return render_app(manifest, sp, _target(), node_resource=node_resource)


def test_cpu_render_uses_cpu_accelerator_and_one_bundle_per_worker(local_manifest):
    app = _cpu_app(local_manifest).app
    assert app["import_path"] == "orch_serve_hooks:build_openai_app"  # orch's builder on the nodes
    assert app["name"] == "orch-r1" and app["route_prefix"] == "/"
    llm = app["args"]["llm_configs"][0]
    assert llm["model_loading_config"] == {"model_id": "tiny", "model_source": "/models/tiny"}
    assert llm["accelerator_config"] == {"kind": "cpu"}
    assert "accelerator_type" not in llm
    assert llm["placement_group_config"] == {"strategy": "STRICT_PACK", "bundles": [{"CPU": 1}]}
    kw = llm["engine_kwargs"]
    assert kw["tensor_parallel_size"] == 1 and kw["pipeline_parallel_size"] == 1 and kw["max_model_len"] == 1024
    assert "gpu_memory_utilization" not in kw and "distributed_executor_backend" not in kw
    assert kw["api_key"] == [API_KEY_PLACEHOLDER]
    env = app["runtime_env"]["env_vars"]
    assert env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # the manifest's env, as a string
    dep = llm["deployment_config"]
    assert dep["num_replicas"] == 1 and dep["health_check_timeout_s"] == 30 and dep["graceful_shutdown_timeout_s"] == 30
    assert dep["max_surge_percent"] == 100  # the side-by-side switch: new replica beside the old one
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert "OMP_NUM_THREADS" not in env  # nobody said how many cores the nodes have


def test_cpu_engine_names_orchs_worker_extension_for_the_amx_tiles(local_manifest):
    # vLLM resolves worker_extension_cls in each worker before the model loads
    # (vllm/v1/worker/worker_base.py); orch's class asks Linux for the AMX tiles there.
    app = _cpu_app(local_manifest).app
    assert app["args"]["llm_configs"][0]["engine_kwargs"]["worker_extension_cls"] == "orch_serve_hooks.AmxTileData"
    # a class the user names is kept (vLLM takes one)
    sp = ServingPlan(tp=1, pp=1, max_model_len=1024)
    own = render_app(local_manifest, sp, _target(), node_resource=node_resource, extra_engine_kwargs={"worker_extension_cls": "rl.Ext"})
    assert own.app["args"]["llm_configs"][0]["engine_kwargs"]["worker_extension_cls"] == "rl.Ext"
    # a bucket model source has no orch folder on its PYTHONPATH: nothing there to resolve
    remote = render_app(local_manifest, sp, _target(source="s3://bucket/tiny"), node_resource=node_resource)
    assert "worker_extension_cls" not in remote.app["args"]["llm_configs"][0]["engine_kwargs"]


@pytest.mark.parametrize(("cores", "threads"), [(1, "1"), (2, "1"), (16, "15")])
def test_cpu_engine_computes_on_all_cores_but_one(local_manifest, cores, threads):
    sp = ServingPlan(tp=1, pp=1, max_model_len=1024)
    app = render_app(local_manifest, sp, _target(), node_resource=node_resource, node_cores=cores).app
    assert app["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == threads


def test_gpu_render_leaves_cpu_threading_alone(manifest_405b):
    plan = plan_model(resolve_model("llama3-405b"), shape_from_manifest(manifest_405b), PlanOptions(max_model_len=8192))
    app = render_app(manifest_405b, ServingPlan.from_parallel_plan(plan), _target(), node_resource=node_resource, node_cores=64).app
    env = app["runtime_env"]["env_vars"]
    assert "OMP_NUM_THREADS" not in env and "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert "worker_extension_cls" not in app["args"]["llm_configs"][0]["engine_kwargs"]  # CUDA kernels: no AMX


def test_405b_plan_pins_each_stage_to_its_node(manifest_405b):
    plan = plan_model(resolve_model("llama3-405b"), shape_from_manifest(manifest_405b), PlanOptions(max_model_len=8192))
    sp = ServingPlan.from_parallel_plan(plan)
    assert (sp.tp, sp.pp, sp.replicas) == (8, 2, 1)
    nodes = [n.name for n in manifest_405b.nodes]
    stages = stage_nodes_for(sp, {n: 8.0 for n in nodes})
    rendered = render_app(manifest_405b, sp, _target(model="llama3-405b"), node_resource=node_resource,
                          accelerator_type="H100", stage_nodes=stages)  # fmt: skip
    llm = rendered.llm_config
    pg = llm["placement_group_config"]
    assert pg["strategy"] == "PACK" and len(pg["bundles"]) == 16
    for i, bundle in enumerate(pg["bundles"]):
        node = stages[i // 8]
        assert bundle == {"GPU": 1, node_resource(node): 0.001}
    assert llm["accelerator_type"] == "H100"
    kw = llm["engine_kwargs"]
    assert (kw["tensor_parallel_size"], kw["pipeline_parallel_size"], kw["max_model_len"]) == (8, 2, 8192)
    assert kw["distributed_executor_backend"] == "ray" and kw["gpu_memory_utilization"] == plan.gpu_memory_utilization
    assert "pipeline stages pinned" in rendered.notes[0]


def test_single_node_tp_is_strict_pack_without_pins(manifest_405b):
    sp = ServingPlan(tp=4, pp=1, max_model_len=4096, replicas=4)
    pg = render_app(manifest_405b, sp, _target(), node_resource=node_resource).llm_config["placement_group_config"]
    assert pg == {"strategy": "STRICT_PACK", "bundles": [{"GPU": 1}] * 4}


def test_stage_nodes_need_enough_free_gpus():
    sp = ServingPlan(tp=8, pp=2, max_model_len=4096)
    assert stage_nodes_for(sp, {"a": 8.0, "b": 4.0, "c": 8.0}) == ("a", "c")
    with pytest.raises(ServeConfigError, match="needs 2 nodes with 8 free GPUs"):
        stage_nodes_for(sp, {"a": 8.0, "b": 7.0})
    assert stage_nodes_for(ServingPlan(tp=8, pp=1, max_model_len=1), {"a": 8.0}) is None


def test_values_cannot_break_the_yaml(local_manifest):
    weird = '/models/it\'s "odd": yes\n- x'
    app = render_app(local_manifest, ServingPlan(tp=1, pp=1, max_model_len=64), _target(source=weird, model="a: b"),
                     node_resource=node_resource).app  # fmt: skip
    assert app["args"]["llm_configs"][0]["model_loading_config"] == {"model_id": "a: b", "model_source": weird}


def test_key_lives_only_in_the_put_copy_and_in_the_fingerprint(local_manifest):
    rendered = _cpu_app(local_manifest)
    with_key = rendered.with_api_key("s3cret")
    assert with_key["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == ["s3cret"]
    assert "s3cret" not in str(rendered.app) and "s3cret" not in str(mask_api_key(with_key))
    assert rendered.fingerprint("s3cret") != rendered.fingerprint("other")
    assert "s3cret" not in rendered.fingerprint("s3cret")
    # The same config under another name/route (a side-by-side copy) is the same revision.
    assert rendered.renamed("orch-r7", "/_orch/r7").fingerprint("k") == rendered.fingerprint("k")
    assert _cpu_app(local_manifest, max_model_len=2048).fingerprint("k") != rendered.fingerprint("k")


def test_fingerprint_ignores_which_nodes_the_stages_landed_on(manifest_405b):
    sp = ServingPlan(tp=8, pp=2, max_model_len=4096)
    a = render_app(manifest_405b, sp, _target(), node_resource=node_resource, stage_nodes=["n1", "n2"])
    b = render_app(manifest_405b, sp, _target(), node_resource=node_resource, stage_nodes=["n3", "n4"])
    assert a.app != b.app
    assert config_fingerprint(a.app, "k") == config_fingerprint(b.app, "k")


def test_deploy_body_lists_every_app_on_the_manifest_port(local_manifest):
    body = deploy_body([{"name": "a"}, {"name": "b"}], local_manifest)
    assert body["http_options"] == {"host": "0.0.0.0", "port": local_manifest.serve.http_port}
    assert [a["name"] for a in body["applications"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "ray_type"),
    [("NVIDIA H100 80GB HBM3", "H100"), ("H100-80GB", "H100"), ("A100-40GB", "A100"), ("NVIDIA A100-SXM4-80GB", "A100"),
     ("NVIDIA L4", "L4"), ("A10G-24GB", "A10G"), ("Tesla V100-SXM2-16GB", "V100"), (None, None), ("mystery", None)],
)  # fmt: skip
def test_ray_accelerator_type(name, ray_type):
    assert ray_accelerator_type(name) == ray_type


def test_reserved_engine_args_are_refused(local_manifest):
    with pytest.raises(ServeConfigError, match="api_key"):
        render_app(local_manifest, ServingPlan(tp=1, pp=1, max_model_len=64), _target(), node_resource=node_resource,
                   extra_engine_kwargs={"api_key": ["x"]})  # fmt: skip


# ------------------------------------------------------------------ validation with LLMConfig


def test_rendered_apps_pass_ray_serve_llm_validation(local_manifest, manifest_405b):
    validate_app(_cpu_app(local_manifest).app)
    sp = ServingPlan(tp=8, pp=2, max_model_len=8192)
    validate_app(render_app(manifest_405b, sp, _target(), node_resource=node_resource, accelerator_type="H100",
                            stage_nodes=["a", "b"]).app)  # fmt: skip


def test_unknown_engine_argument_names_the_field(local_manifest):
    app = _cpu_app(local_manifest).app
    app["args"]["llm_configs"][0]["engine_kwargs"]["max_modle_len"] = 5
    with pytest.raises(ServeConfigError) as err:
        validate_app(app)
    assert "llm_configs[0].engine_kwargs" in err.value.message and "max_modle_len" in err.value.message
    assert "--engine-arg" in err.value.hint


def test_bad_deployment_option_names_the_nested_field(local_manifest):
    app = _cpu_app(local_manifest).app
    app["args"]["llm_configs"][0]["deployment_config"]["num_replicas"] = -2
    with pytest.raises(ServeConfigError) as err:
        validate_app(app)
    assert "llm_configs[0].deployment_config.num_replicas" in err.value.message
    assert "--replicas" in err.value.hint


def test_accelerator_type_ray_does_not_know_is_refused(manifest_405b):
    sp = ServingPlan(tp=1, pp=1, max_model_len=64)
    app = render_app(manifest_405b, sp, _target(), node_resource=node_resource, accelerator_type="H999").app
    with pytest.raises(ServeConfigError) as err:
        validate_app(app)
    assert "accelerator_type" in err.value.message and "gpu_type" in err.value.hint


def test_engine_argument_names_are_checked_in_the_renderer_and_rendered_as_json_strings():
    """Issue 12 item 10: even a caller that skips the CLI cannot inject YAML through a key; a
    plain key renders as a quoted JSON string and comes back unchanged."""
    for bad in ("'tensor_parallel_size'", "a b", "x\ny", "Max", "1x", "a:b", ""):
        with pytest.raises(ServeConfigError):
            check_engine_arg_key(bad)
    assert parse_engine_arg("max-num-seqs=64") == ("max_num_seqs", 64)
    assert parse_engine_arg('compilation_config={"level": 0}') == ("compilation_config", {"level": 0})


def test_the_renderer_refuses_a_quoted_reserved_key_and_renders_values_verbatim(local_manifest):
    sp = ServingPlan(tp=1, pp=1, max_model_len=1024)
    with pytest.raises(ServeConfigError, match="not a vLLM engine argument name"):
        render_app(local_manifest, sp, _target(), node_resource=node_resource, extra_engine_kwargs={"'tensor_parallel_size'": 1})
    extra = {"max_num_seqs": 64, "compilation_config": {"level": 0}, "served_model_name_suffix": "a\ntensor_parallel_size: 8"}
    with pytest.raises(ServeConfigError, match="set by orch"):  # a name orch sets itself
        render_app(local_manifest, sp, _target(), node_resource=node_resource, extra_engine_kwargs={"dtype": "float16"})
    kw = render_app(local_manifest, sp, _target(), node_resource=node_resource, extra_engine_kwargs=extra).app["args"]["llm_configs"][0]["engine_kwargs"]
    assert kw["tensor_parallel_size"] == 1 and {k: kw[k] for k in extra} == extra
# --- the GPU path across nodes (issue 18: what ran on the test bed) ---------------------------

TWO_BY_ONE = """
name: span
python: /opt/venv/bin/python
nodes:
  - {name: n0, host: 10.144.250.10, role: head, gpus: 1, gpu_type: H100-80GB}
  - {name: n1, host: 10.144.250.11, gpus: 1, gpu_type: H100-80GB}
ray: {port: 6379}
"""


@pytest.fixture(scope="module")
def two_by_one():
    from orchestrator.manifest.load import load_manifest

    return load_manifest(TWO_BY_ONE, Path("/x/span.yaml"))


def test_explicit_tp_across_nodes_packs_one_gpu_bundle_per_worker_with_a_warning(two_by_one):
    plan = plan_model(resolve_model("llama3-8b"), shape_from_manifest(two_by_one), PlanOptions(tp=2, max_model_len=4096))
    sp = ServingPlan.from_parallel_plan(plan)
    assert (sp.tp, sp.pp, sp.gpus_per_node, sp.tp_spans_nodes) == (2, 1, 1, True)
    rendered = render_app(two_by_one, sp, _target(), node_resource=node_resource)
    llm = rendered.llm_config
    # STRICT_PACK would never place: no node has 2 GPUs. PACK spreads the group over the two.
    assert llm["placement_group_config"] == {"strategy": "PACK", "bundles": [{"GPU": 1}, {"GPU": 1}]}
    assert llm["engine_kwargs"]["distributed_executor_backend"] == "ray"
    assert rendered.notes and rendered.notes[0].startswith("warning: tensor parallel 2 spans nodes of 1 GPU(s)")
    validate_app(rendered.app)


def test_tp_inside_a_node_stays_strict_pack_without_warning(manifest_405b):
    plan = plan_model(resolve_model("llama3-70b"), shape_from_manifest(manifest_405b), PlanOptions(tp=8, max_model_len=4096))
    sp = ServingPlan.from_parallel_plan(plan)
    assert sp.gpus_per_node == 8 and not sp.tp_spans_nodes
    rendered = render_app(manifest_405b, sp, _target(), node_resource=node_resource)
    assert rendered.llm_config["placement_group_config"]["strategy"] == "STRICT_PACK"
    assert not any(n.startswith("warning") for n in rendered.notes)


def test_gpu_layout_tells_the_engine_process_where_the_cluster_is(two_by_one, local_manifest):
    """vLLM's EngineCore calls ray.init() itself; with orch's own temp dir it would start a
    private Ray without RAY_ADDRESS (measured on the test bed)."""
    sp = ServingPlan(tp=2, pp=1, max_model_len=4096, gpus_per_node=1)
    env = render_app(two_by_one, sp, _target(), node_resource=node_resource).app["runtime_env"]["env_vars"]
    assert env["RAY_ADDRESS"] == "10.144.250.10:6379"
    assert "RAY_ADDRESS" not in _cpu_app(local_manifest).app["runtime_env"]["env_vars"]  # mp executor: no Ray inside


def test_a_request_router_class_serve_cannot_load_is_refused_by_its_validation(local_manifest):
    from orchestrator.serve.config import ServeDefaults

    app = render_app(local_manifest, ServingPlan(tp=1, pp=1, max_model_len=64, replicas=2), _target(), node_resource=node_resource,
                     defaults=ServeDefaults(request_router="session_affinity")).app  # fmt: skip
    validate_app(app)  # the class Ray Serve ships loads
    app["args"]["llm_configs"][0]["deployment_config"]["request_router_config"]["request_router_class"] = "ray.serve.experimental.nope.Router"
    with pytest.raises(ServeConfigError) as err:
        validate_app(app)
    assert "llm_configs[0].deployment_config" in err.value.message and "Invalid deployment config" in err.value.message
