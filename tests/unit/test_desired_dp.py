"""A rollout deploys the layout `orch plan` chooses: for DeepSeek-V3 on 2 x 8 H100 that is DP x EP,
rendered as Ray Serve LLM's ``build_dp_openai_app`` (one llm_config, ``data_parallel_size`` and
``enable_expert_parallel`` in its engine_kwargs); a plain app never gets ``data_parallel_size``."""

from __future__ import annotations

from pathlib import Path

from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import shape_from_manifest
from orchestrator.serve.desired import RolloutRequest
from orchestrator.workflows.desired import desired_for_model

TEMPLATE = Path(__file__).resolve().parents[2] / "cluster-templates" / "2x8-h100-405b.yaml"


def test_the_rollout_deploys_the_dp_layout_orch_plan_chooses_for_deepseek_v3():
    manifest = load_manifest_file(TEMPLATE)
    plan = plan_model(CATALOG["deepseek-v3"], shape_from_manifest(manifest))
    assert plan.dp > 1 and plan.expert_parallel  # what `orch plan` picks (MLA: DP x EP)
    desired = desired_for_model(manifest, RolloutRequest(model="deepseek-v3", served_name="ds"))(nodes=[])
    assert (desired.plan["dp"], desired.plan["tp"], desired.plan["pp"]) == (plan.dp, plan.tp, 1)
    app = desired.rendered.app
    assert app["import_path"] == "ray.serve.llm:build_dp_openai_app" and list(app["args"]) == ["llm_config"]
    engine = app["args"]["llm_config"]["engine_kwargs"]
    assert (engine["data_parallel_size"], engine["tensor_parallel_size"], engine["enable_expert_parallel"]) == (plan.dp, plan.tp, True)


def test_a_tp_x_pp_rollout_renders_the_plain_app_without_dp_keys():
    manifest = load_manifest_file(TEMPLATE)
    desired = desired_for_model(manifest, RolloutRequest(model="llama3-405b", served_name="l"))(nodes=[])
    assert desired.plan["dp"] == 1 and desired.rendered.app["import_path"] != "ray.serve.llm:build_dp_openai_app"
    engine = desired.rendered.app["args"]["llm_configs"][0]["engine_kwargs"]
    assert "data_parallel_size" not in engine and "enable_expert_parallel" not in engine
