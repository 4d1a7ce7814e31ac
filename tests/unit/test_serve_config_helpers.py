"""serve/config.py's pure helpers, one behaviour each (issue 17: what the mutation run of the
module found untested). Expected values: vLLM's own argument names and choices (``--dtype``:
auto, half, float16, bfloat16, float, float32; ``--quantization fp8``), Ray's address format
and what docs/rollout.md says orch renders."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.errors import ServeConfigError
from orchestrator.manifest.load import load_manifest
from orchestrator.serve.config import (
    RenderedApp,
    ServeDefaults,
    ServingPlan,
    cluster_ray_address,
    deploy_body,
    serving_env,
)
from orchestrator.serve.engine_args import check_engine_arg_key, parse_engine_arg, vllm_dtype
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, config_fingerprint, key_digest, mask_api_key
from orchestrator.serve.placement import ray_accelerator_type, replica_placement, stage_nodes_for


def test_a_planner_plan_as_a_dict_gets_the_documented_defaults():
    sp = ServingPlan.from_parallel_plan({})
    assert (sp.tp, sp.pp, sp.max_model_len, sp.replicas) == (1, 1, 2048, 1)
    assert (sp.dtype, sp.gpu_memory_utilization, sp.kv_cache_dtype) == ("bf16", 0.9, "auto")
    assert (sp.max_concurrency, sp.kv_cache_gib, sp.reasons, sp.gpus_per_node) == (None, None, (), None)
    assert (sp.max_num_seqs, sp.dp) == (None, 1)  # the engine's batch unknown; no data parallelism


def test_a_planner_plan_object_is_read_by_attribute_and_overrides_win():
    plan = SimpleNamespace(tp=4, pp=2, max_model_len=8192, replicas=0, dtype="fp8", gpu_memory_utilization=0.85,
                           kv_cache_dtype="fp8_e4m3", max_concurrency=12.5, kv_cache_gib_per_gpu=30.0,
                           reasons=["a", 1], gpus_per_node=8, max_num_seqs=512, dp=2)  # fmt: skip
    sp = ServingPlan.from_parallel_plan(plan, replicas=3, dtype=None)
    assert (sp.max_num_seqs, sp.dp) == (512, 2)
    assert (sp.tp, sp.pp, sp.max_model_len, sp.replicas) == (4, 2, 8192, 3)
    assert (sp.dtype, sp.gpu_memory_utilization, sp.kv_cache_dtype) == ("fp8", 0.85, "fp8_e4m3")  # None overrides nothing
    assert (sp.max_concurrency, sp.kv_cache_gib, sp.reasons, sp.gpus_per_node) == (12.5, 30.0, ("a", "1"), 8)
    assert ServingPlan.from_parallel_plan({"kv_cache_gib": 2.0}).kv_cache_gib == 2.0
    assert ServingPlan.from_parallel_plan({"replicas": 0}).replicas == 1


def test_tp_spans_nodes_only_past_a_known_node_size():
    assert ServingPlan(tp=16, pp=1, max_model_len=1, gpus_per_node=8).tp_spans_nodes
    assert not ServingPlan(tp=8, pp=1, max_model_len=1, gpus_per_node=8).tp_spans_nodes
    assert not ServingPlan(tp=16, pp=1, max_model_len=1).tp_spans_nodes  # node size unknown


@pytest.mark.parametrize(
    ("dtype", "flag"),
    [("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16"), ("fp32", "float32"),
     ("FP8", "auto"), ("int8", "auto"), ("int4", "auto"), ("auto", "auto"), ("float", "float")],
)  # fmt: skip
def test_planner_dtype_to_vllm_dtype(dtype, flag):
    # quantized weights: vLLM takes the activation dtype from the checkpoint; the quantization
    # comes from the checkpoint or from the plan's `quantization` engine argument, never from here
    assert vllm_dtype(dtype) == flag


def test_placement_layouts():
    def res(node: str) -> str:
        return f"node:{node}"

    cpu = replica_placement(ServingPlan(tp=2, pp=1, max_model_len=1), "cpu", None, res, cpus_per_cpu_worker=2)
    assert cpu == ([{"CPU": 2}, {"CPU": 2}], "STRICT_PACK")
    replicas_pp = replica_placement(ServingPlan(tp=2, pp=2, max_model_len=1, replicas=2), "gpu", None, res)
    assert replicas_pp == ([{"GPU": 1}] * 4, "PACK")
    pinned = replica_placement(ServingPlan(tp=1, pp=2, max_model_len=1), "gpu", ["a", "b"], res)
    assert pinned == ([{"GPU": 1, "node:a": 0.001}, {"GPU": 1, "node:b": 0.001}], "PACK")


def test_stage_nodes_error_lists_each_nodes_free_gpus():
    sp = ServingPlan(tp=8, pp=2, max_model_len=1)
    with pytest.raises(ServeConfigError) as err:
        stage_nodes_for(sp, {"a": 8.0, "b": 7.5})
    assert str(err.value) == (
        "pipeline parallel 2 x tensor parallel 8 needs 2 nodes with 8 free GPUs each; free GPUs per node: a: 8, b: 7.5"
    )
    assert err.value.hint == "free GPUs (orch rollback, or stop other applications) or plan fewer stages"
    with pytest.raises(ServeConfigError, match="free GPUs per node: none"):
        stage_nodes_for(sp, {})
    assert stage_nodes_for(ServingPlan(tp=1, pp=2, max_model_len=1, replicas=2), {"a": 1.0, "b": 1.0}) is None


@pytest.mark.parametrize(
    ("host", "port", "address"),
    [("10.0.0.1", 6379, "10.0.0.1:6379"), ("fd00::1", 6380, "[fd00::1]:6380"), ("[fd00::1]", 6379, "[fd00::1]:6379"),
     (None, 6379, None), ("10.0.0.1", None, None)],
    ids=["ipv4", "ipv6", "ipv6-in-brackets", "no-host", "no-port"],  # plain ids: mutmut selects tests by id
)  # fmt: skip
def test_cluster_ray_address_is_host_port_with_ipv6_in_brackets(host, port, address):
    manifest = SimpleNamespace(head=SimpleNamespace(host=host), ray=SimpleNamespace(port=port))
    assert cluster_ray_address(manifest) == address


def _manifest(accelerator="gpu", interfaces=("eth0", "eth0"), env=None):
    return SimpleNamespace(
        accelerator=accelerator, nodes=[SimpleNamespace(interface=i) for i in interfaces], env=env or {},
        head=SimpleNamespace(host="10.0.0.1"), ray=SimpleNamespace(port=6379),
    )  # fmt: skip


def test_serving_env_sets_one_nic_for_every_node_and_the_manifest_env_wins():
    env = serving_env(_manifest(env={"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "bond0"}), ServingPlan(1, 1, 1), ServeDefaults())
    assert env == {
        "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1",
        "RAY_ADDRESS": "10.0.0.1:6379",
        "NCCL_SOCKET_IFNAME": "eth0",
        "GLOO_SOCKET_IFNAME": "bond0",
        "NCCL_DEBUG": "INFO",
    }
    mixed = serving_env(_manifest(interfaces=("eth0", "ens5")), ServingPlan(1, 1, 1), ServeDefaults())
    assert "NCCL_SOCKET_IFNAME" not in mixed and "GLOO_SOCKET_IFNAME" not in mixed
    unset = serving_env(_manifest(interfaces=(None, None)), ServingPlan(1, 1, 1), ServeDefaults())
    assert "NCCL_SOCKET_IFNAME" not in unset


# vLLM's CPU platform reads VLLM_CPU_KVCACHE_SPACE as whole GiB (int() in vllm/platforms/cpu.py,
# 0.32): 0.2 GiB rounded up to 1 gave the engine five times the KV cache the plan counted. A
# fraction is left out: the size goes as the engine's kv_cache_memory_bytes (test_serve_render).
@pytest.mark.parametrize(("gib", "space"), [(None, "1"), (0.2, None), (2.1, None), (4.0, "4")])
def test_cpu_kv_cache_space_is_the_whole_gib_or_left_out(gib, space):
    env = serving_env(_manifest(accelerator="cpu", interfaces=()), ServingPlan(1, 1, 1, kv_cache_gib=gib), ServeDefaults())
    assert env.get("VLLM_CPU_KVCACHE_SPACE") == space and "RAY_ADDRESS" not in env


def test_a_fractional_kv_cache_keeps_the_cpu_engines_thread_settings():
    # The threads are unpinned and counted whatever the KV cache's size: a side-by-side candidate
    # pinned ("auto") to the serving engine's core was starved for minutes on the test bed.
    env = serving_env(_manifest(accelerator="cpu", interfaces=()), ServingPlan(1, 1, 1, kv_cache_gib=0.25), ServeDefaults(), node_cores=4)
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["OMP_NUM_THREADS"]) == ("nobind", "3") and "VLLM_CPU_KVCACHE_SPACE" not in env


def test_a_node_env_that_sets_the_whole_gib_variable_is_refused_beside_a_fraction():
    manifest = _manifest(accelerator="cpu", interfaces=())
    manifest.nodes = [SimpleNamespace(name="n1", interface=None, env={"VLLM_CPU_KVCACHE_SPACE": "4"})]
    with pytest.raises(ServeConfigError, match=r"^nodes\[n1\]\.env\.VLLM_CPU_KVCACHE_SPACE is '4': vLLM would take that many GiB"):
        serving_env(manifest, ServingPlan(1, 1, 1, kv_cache_gib=0.5), ServeDefaults())


def test_deploy_body_defaults_to_port_8000_on_every_interface():
    # A manifest without a serve section: Serve's proxy on its default port 8000, on every interface.
    manifest = load_manifest("name: m\nnodes:\n  - {name: n0, host: 10.0.0.1, role: head, gpus: 1}\n", Path("/x/m.yaml"))
    body = deploy_body([{"name": "a"}], manifest)
    assert body == {"proxy_location": "EveryNode", "http_options": {"host": "0.0.0.0", "port": 8000}, "applications": [{"name": "a"}]}


def test_mask_api_key_replaces_every_key_in_nested_lists_and_leaves_empty_ones():
    masked = mask_api_key({"a": [{"api_key": "k1"}, {"api_key": ""}], "api_key": ["k2"], "n": 1})
    assert masked == {"a": [{"api_key": [API_KEY_PLACEHOLDER]}, {"api_key": ""}], "api_key": [API_KEY_PLACEHOLDER], "n": 1}


def test_key_digest_is_16_hex_characters_and_none_without_a_key():
    digest = key_digest("s3cret")
    assert len(digest) == 16 and int(digest, 16) >= 0 and digest != key_digest("other")
    assert key_digest("") is None and key_digest(None) is None


def test_renamed_copy_keeps_the_config_and_changes_name_and_route():
    app = {"name": "a", "route_prefix": "/", "args": {"llm_configs": [{"engine_kwargs": {}}]}}
    rendered = RenderedApp(app=app, stage_nodes=("n1",), notes=("x",))
    copy = rendered.renamed("b", "/b")
    assert (copy.name, copy.app["route_prefix"], copy.stage_nodes, copy.notes) == ("b", "/b", ("n1",), ("x",))
    assert rendered.name == "a" and copy.fingerprint() == rendered.fingerprint()


@pytest.mark.parametrize(
    ("item", "message"),
    [("max_num_seqs", "--engine-arg 'max_num_seqs': expected KEY=VALUE"), ("=64", "--engine-arg '=64': expected KEY=VALUE"),
     ("a=&x 1", "--engine-arg a: YAML anchors and aliases (& and *) are not allowed in a value"),
     ("a=[1, 2", "--engine-arg a: the value is not valid YAML: ")],
    ids=["no-equals", "no-key", "anchor", "bad-yaml"],
)  # fmt: skip
def test_bad_engine_args_are_usage_errors(item, message):
    with pytest.raises(ServeConfigError) as err:
        parse_engine_arg(item)
    assert str(err.value).startswith(message) and err.value.exit_code == 2


def test_engine_arg_key_messages():
    with pytest.raises(ServeConfigError) as err:
        check_engine_arg_key("Max")
    assert str(err.value) == "engine argument name 'Max' is not a vLLM engine argument name (lowercase letters, digits and _)"
    assert err.value.hint == "e.g. --engine-arg max_num_seqs=64 (vLLM's flag --max-num-seqs without the dashes)"
    with pytest.raises(ServeConfigError) as err:
        check_engine_arg_key("dtype")
    assert str(err.value) == "engine argument 'dtype' is set by orch"
    assert err.value.hint == "use the matching orch flag (--tp, --pp, --dp, --expert-parallel, --max-model-len, --dtype, --served-name)"
    for key in ("data_parallel_size", "enable_expert_parallel"):
        with pytest.raises(ServeConfigError, match=f"'{key}' is set by orch"):
            check_engine_arg_key(key)
    # DPServer sets these per rank (ray/llm/_internal/serve/serving_patterns/data_parallel/dp_server.py)
    for key in ("data_parallel_rank", "data_parallel_address", "data_parallel_rpc_port"):
        with pytest.raises(ServeConfigError) as err:
            check_engine_arg_key(key)
        assert str(err.value) == f"engine argument {key!r} is set for each data-parallel rank by Ray Serve LLM"
        assert err.value.hint.startswith("leave it out: --dp N deploys the group")


def test_deploy_body_uses_the_manifests_http_port_and_host():
    body = deploy_body([], SimpleNamespace(serve=SimpleNamespace(http_port=8123, http_host="127.0.0.1")))
    assert body["http_options"] == {"host": "127.0.0.1", "port": 8123}


def test_an_engine_arg_value_may_hold_an_equals_sign():
    assert parse_engine_arg("download_dir=/data/a=b") == ("download_dir", "/data/a=b")


@pytest.mark.parametrize(
    ("item", "hint"),
    [("max_num_seqs", "e.g. --engine-arg max_num_seqs=64"), ("a=&x 1", "write the value out in full"),
     ("a=[1, 2", "quote it, e.g. --engine-arg 'name=\"a value\"'")],
    ids=["no-equals", "anchor", "bad-yaml"],
)  # fmt: skip
def test_bad_engine_args_say_how_to_write_them(item, hint):
    with pytest.raises(ServeConfigError) as err:
        parse_engine_arg(item)
    assert err.value.hint == hint


def test_a_bad_yaml_value_quotes_pyyamls_message_on_one_line():
    with pytest.raises(ServeConfigError) as err:
        parse_engine_arg("a=[1, 2")
    # PyYAML 6's message for "[1, 2" (printed over 5 lines), with its line breaks and indents collapsed
    assert str(err.value) == (
        "--engine-arg a: the value is not valid YAML: while parsing a flow sequence in \"<unicode string>\", "
        "line 1, column 1: [1, 2 ^ expected ',' or ']', but got '<stream end>' in \"<unicode string>\", "
        "line 1, column 6: [1, 2 ^"
    )


def test_a_serve_config_error_lists_its_problems_or_its_own_message():
    assert ServeConfigError("bad field").problems == ["bad field"]
    assert ServeConfigError("2 fields", problems=["a: bad", "b: bad"]).problems == ["a: bad", "b: bad"]


def test_an_app_without_llm_configs_still_has_a_fingerprint():
    # Ray Serve's config may hold apps orch did not render: an import path with no args, or args without llm_configs
    plain = {"name": "other", "route_prefix": "/other", "import_path": "mod:app"}
    with_args = {**plain, "args": {"x": 1}}
    assert len({config_fingerprint(plain), config_fingerprint(with_args), config_fingerprint({**plain, "import_path": "m:b"})}) == 3


def test_a_plan_object_without_the_fields_gets_the_same_defaults_as_an_empty_dict():
    assert ServingPlan.from_parallel_plan(SimpleNamespace()) == ServingPlan.from_parallel_plan({})


def test_a_plans_replicas_are_kept_and_empty_fields_fall_back_to_the_defaults():
    assert ServingPlan.from_parallel_plan({"replicas": 2}).replicas == 2
    sp = ServingPlan.from_parallel_plan({"dtype": None, "gpu_memory_utilization": None, "kv_cache_dtype": None})
    assert (sp.dtype, sp.gpu_memory_utilization, sp.kv_cache_dtype) == ("bf16", 0.9, "auto")


def test_the_fingerprint_counts_each_bundles_resources():
    def app(bundle):
        return {"name": "a", "args": {"llm_configs": [{"placement_group_config": {"bundles": [bundle]}}]}}

    prints = {config_fingerprint(app(b)) for b in ({"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 2}, {"CPU": 2, "GPU": 1})}
    assert len(prints) == 3


def test_a_cpu_plan_without_a_kv_size_gets_the_defaults_kv_space():
    env = serving_env(_manifest(accelerator="cpu", interfaces=()), ServingPlan(1, 1, 1), ServeDefaults(cpu_kv_cache_gib=3))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"


def test_a_cpu_worker_gets_one_cpu_unless_told_otherwise():
    # ServeDefaults.cpus_per_cpu_worker's default (1): the same when placement is called without it.
    assert replica_placement(ServingPlan(tp=3, pp=1, max_model_len=1), "cpu", None, str) == ([{"CPU": 1}] * 3, "STRICT_PACK")


def test_a_vendor_prefix_in_any_case_is_dropped_as_ray_does():
    # Ray 2.60 (ray/_private/accelerators/nvidia_gpu.py) matches the name with
    # r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)": any first word, so "Nvidia A100-SXM4-40GB" is A100.
    assert ray_accelerator_type("Nvidia A100-SXM4-40GB") == "A100"
