"""A rollout plans TP x PP until it renders DP groups: `orch plan` may choose DP x EP for an MoE
model, but a plain Serve app must not get ``data_parallel_size`` (issue 23 item 3 renders those)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.catalog import CATALOG
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import shape_from_manifest
from orchestrator.serve.desired import RolloutRequest, desired_for_model

TEMPLATE = Path(__file__).resolve().parents[2] / "cluster-templates" / "2x8-h100-405b.yaml"


def test_the_rollout_plans_deepseek_v3_as_tp_x_pp_where_orch_plan_prefers_dp():
    manifest = load_manifest_file(TEMPLATE)
    assert plan_model(CATALOG["deepseek-v3"], shape_from_manifest(manifest)).dp > 1  # what `orch plan` picks
    desired = desired_for_model(manifest, RolloutRequest(model="deepseek-v3", served_name="ds"))(nodes=[])
    assert (desired.plan["dp"], desired.plan["tp"], desired.plan["pp"]) == (1, 8, 2)
    engine = desired.rendered.app["args"]["llm_configs"][0]["engine_kwargs"]
    assert "data_parallel_size" not in engine and "enable_expert_parallel" not in engine
