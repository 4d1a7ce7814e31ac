"""The data-parallel (+ expert parallel) Serve application orch renders: ``build_dp_openai_app``,
its one ``llm_config``, the gang as the unit of capacity, the key and the secrets in its shape.

Expected values come from Ray 2.60's source (``ray/llm/_internal/serve/serving_patterns/
data_parallel/``, ``ray/serve/_private/deployment_scheduler.py``) and from the DP=2 + EP
application that ran on two test hosts (tests/data/serve/status-dp-ep-two-hosts-starting.json:
Serve accepted that config and formed the gang, docs/moe.md).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import ServeConfigError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve import decisions
from orchestrator.serve.config import AppTarget, RenderedApp, ServingPlan, render_app
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, config_fingerprint
from orchestrator.serve.ray_io.validate import validate_app
from orchestrator.serve.shapes import DP_IMPORT_PATH, api_key_of, llm_config_of, shape_of_app
from orchestrator.workflows.secrets import fill_secrets, unfilled

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
CAPTURED = json.loads((DATA / "serve/status-dp-ep-two-hosts-starting.json").read_text())["applications"]["moe-dp"]
TARGET = AppTarget("orch-r1", "/", "tiny", "/models/tiny-moe")


@pytest.fixture(scope="module")
def h100():
    return load_manifest_file(REPO / "cluster-templates" / "2x8-h100-405b.yaml")


@pytest.fixture(scope="module")
def local():
    return load_manifest_file(REPO / "cluster-templates" / "local.yaml")


def dp_plan(**kw):
    base = dict(tp=1, pp=1, max_model_len=4096, dp=16, expert_parallel=True, replicas=1, max_concurrency=160.0)
    base.update(kw)
    return ServingPlan(**base)


def test_a_dp_plan_renders_the_dp_builder_with_one_llm_config(h100):
    app = render_app(h100, dp_plan(max_num_seqs=128), TARGET, node_resource=node_resource, accelerator_type="H100").app
    captured = CAPTURED["deployed_app_config"]
    # The shape Serve ran on the test bed: the DP builder, args.llm_config (no list).
    assert app["import_path"] == captured["import_path"] == DP_IMPORT_PATH == "ray.serve.llm:build_dp_openai_app"
    assert set(app["args"]) == set(captured["args"]) == {"llm_config"}
    llm = app["args"]["llm_config"]
    kw = llm["engine_kwargs"]
    assert (kw["data_parallel_size"], kw["enable_expert_parallel"], kw["tensor_parallel_size"]) == (16, True, 1)
    assert set(captured["args"]["llm_config"]["engine_kwargs"]) <= set(kw)  # every key the run had, orch renders
    # One rank's bundles; Serve gangs dp of them with PACK (DPServer drops a per-replica strategy).
    assert llm["placement_group_config"] == {"strategy": "PACK", "bundles": [{"GPU": 1}]}
    # num_replicas counts groups (DPServer.get_deployment_options multiplies it by the DP size).
    assert llm["deployment_config"]["num_replicas"] == 1
    # Each replica is one rank's engine: its own batch (max_num_seqs 128) with the 1.25 headroom.
    assert llm["deployment_config"]["max_ongoing_requests"] == 160
    assert shape_of_app(app).name == "dp" and shape_of_app(app).config_path == "args.llm_config" and llm_config_of(app) is llm
    validate_app(app)


def test_expert_parallel_without_dp_stays_on_the_openai_builder(h100):
    app = render_app(h100, dp_plan(dp=1, tp=8), TARGET, node_resource=node_resource).app
    # orch's build_openai_app (Serve LLM's, less the LLMRouter hop), not the DP builder
    assert app["import_path"] == "orch_serve_hooks:build_openai_app" and shape_of_app(app).name == "tp_pp"
    kw = app["args"]["llm_configs"][0]["engine_kwargs"]
    assert kw["enable_expert_parallel"] is True and "data_parallel_size" not in kw
    plain = render_app(h100, dp_plan(dp=1, tp=8, expert_parallel=False), TARGET, node_resource=node_resource).app
    assert "enable_expert_parallel" not in plain["args"]["llm_configs"][0]["engine_kwargs"]


def test_a_cpu_dp_plan_has_cpu_bundles_per_rank(local):
    app = render_app(local, dp_plan(dp=2, tp=1), TARGET, node_resource=node_resource).app
    llm = app["args"]["llm_config"]
    assert llm["accelerator_config"] == {"kind": "cpu"} and llm["placement_group_config"]["bundles"] == [{"CPU": 1}]
    validate_app(app)


def test_dp_with_pp_and_a_bad_dp_are_refused(h100):
    with pytest.raises(ServeConfigError, match="data parallel 2 with pipeline parallel 2"):
        render_app(h100, dp_plan(dp=2, pp=2), TARGET, node_resource=node_resource)
    with pytest.raises(ServeConfigError, match=r"invalid plan: dp=0"):
        render_app(h100, dp_plan(dp=0), TARGET, node_resource=node_resource)


def test_the_config_serve_ran_passes_validation_and_bad_dp_fields_are_named(h100):
    validate_app(CAPTURED["deployed_app_config"])
    app = render_app(h100, dp_plan(), TARGET, node_resource=node_resource, accelerator_type="H100").app
    bad = copy.deepcopy(app)
    bad["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] = "two"
    with pytest.raises(ServeConfigError) as err:
        validate_app(bad)
    assert err.value.message.startswith("invalid Serve LLM config: applications[orch-r1].args.llm_config.engine_kwargs")
    extra = copy.deepcopy(app)
    extra["args"]["llm_configs"] = [extra["args"]["llm_config"]]  # the list form is not DPOpenAiServingArgs
    with pytest.raises(ServeConfigError) as err:
        validate_app(extra)
    assert "applications[orch-r1].args.llm_configs" in err.value.message


def test_the_key_lives_in_the_put_copy_only_and_secrets_are_checked_in_the_dp_shape(h100):
    rendered = render_app(h100, dp_plan(), TARGET, node_resource=node_resource)
    assert rendered.llm_config["engine_kwargs"]["api_key"] == [API_KEY_PLACEHOLDER]
    body = rendered.with_api_key("k-123")
    assert api_key_of(body) == "k-123" and api_key_of(rendered.app) == API_KEY_PLACEHOLDER
    assert rendered.fingerprint("k-123") == config_fingerprint(body, "k-123") != rendered.fingerprint("k-456")
    # The key's own placeholder is expected; any other one is named.
    assert unfilled(rendered.app) == []
    stored = copy.deepcopy(rendered.app)
    stored["runtime_env"]["env_vars"]["HF_TOKEN"] = "<redacted>"
    assert unfilled(stored) == ["runtime_env.env_vars.HF_TOKEN"]
    assert unfilled(fill_secrets(stored, {"HF_TOKEN": "hf_x"}, {})) == []
    renamed = RenderedApp(app=rendered.app).renamed("orch-r2", "/_orch/r2")
    assert renamed.fingerprint("k") == rendered.fingerprint("k")


def test_a_dp_group_is_the_unit_of_capacity(h100):
    app = render_app(h100, dp_plan(dp=2, replicas=2), TARGET, node_resource=node_resource).app
    groups, strategy = decisions.copy_demand(app)
    # Serve reserves each gang as one placement group: the per-rank bundles (replica actor's CPU
    # merged into bundle 0, as LLMServer does) repeated for each rank, PACK.
    assert strategy == "PACK" and groups == [[{"GPU": 1, "CPU": 1.0}, {"GPU": 1, "CPU": 1.0}]] * 2
    two_hosts = {"node0": {"GPU": 1.0, "CPU": 8.0}, "node1": {"GPU": 1.0, "CPU": 8.0}}
    # One group of 2 ranks over two 1-GPU hosts: one rank per host, as Ray placed it on the test
    # bed (replicas 5jlsombh and klw5xacc on the two hosts in the capture).
    assert decisions.fits(groups[:1], strategy, two_hosts)
    placed = {r["node_ip"] for d in CAPTURED["deployments"].values() if d["name"].startswith("DPServer") for r in d["replicas"]}
    assert len(placed) == 2
    # A second group (a side-by-side copy) has no room: the decision is in place, not side by side.
    assert not decisions.fits(groups, strategy, two_hosts)
    assert decisions.fits(groups, strategy, {**two_hosts, "node2": {"GPU": 2.0, "CPU": 8.0}})


def test_the_captured_deployment_is_one_gang_of_two_ranks():
    dep = CAPTURED["deployments"]["DPServer:tiny"]["deployment_config"]
    # What Serve made of num_replicas: 1 with data_parallel_size: 2 (DPServer.get_deployment_options).
    assert dep["num_replicas"] == 2
    assert dep["gang_scheduling_config"] == {"gang_size": 2, "gang_placement_strategy": "PACK", "runtime_failure_policy": "RESTART_GANG"}
    groups, strategy = decisions.copy_demand(CAPTURED["deployed_app_config"])
    assert len(groups) == 1 and len(groups[0]) == dep["gang_scheduling_config"]["gang_size"]
    assert strategy == dep["gang_scheduling_config"]["gang_placement_strategy"]


def test_a_switch_between_the_two_builders_is_not_side_by_side():
    tp_config = json.loads((DATA / "serve/status-running-direct-streaming.json").read_text())["applications"]["orch-r1"]["deployed_app_config"]
    dp_config = CAPTURED["deployed_app_config"]
    why = decisions.engine_change(tp_config, dp_config)
    assert why is not None and "tensor/pipeline-parallel application (LLMServer)" in why and "data-parallel application (DPServer" in why
    assert decisions.engine_change(dp_config, tp_config).startswith("the switch turns a data-parallel application")
    assert decisions.engine_change(dp_config, dp_config) is None and decisions.engine_change(None, dp_config) is None
    live = decisions.Serving(revision=1, fingerprint="old", app_name="orch-r1", app_status="RUNNING", running_apps=("orch-r1",))
    refused = decisions.decide("new", live, room_for_copy=True, allow_downtime=False, downtime_s=95.0, engine_changes=why)
    assert refused.kind == decisions.REFUSE and refused.reason == f"{why}: replacing revision 1 would stop serving for about 95 s"
    assert refused.downtime_s == 95.0  # the refusal's JSON says what --allow-downtime would cost, as every refusal does
    in_place = decisions.decide("new", live, room_for_copy=True, allow_downtime=True, downtime_s=95.0, engine_changes=why)
    assert in_place.kind == decisions.IN_PLACE and in_place.downtime_s == 95.0 and "(--allow-downtime)" in in_place.reason
    # The same builder keeps the surge switch when there is room.
    assert decisions.decide("new", live, room_for_copy=True, allow_downtime=False, downtime_s=95.0).kind == decisions.SIDE_BY_SIDE
