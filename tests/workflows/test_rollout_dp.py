"""The rollout promises (docs/promises.md) for a data-parallel application, over the rollout
workflow's fakes (tests/workflows/rollout_world.py): fresh deploy gated by a completion with the
key, side by side with a DP group as the unit of capacity, the surge switch, the refusal when the
switch would change the engine deployment's kind, rollback and the restore of a failed change,
secrets and the API key in the ``build_dp_openai_app`` shape, dry-run.

The desired application is rendered by orch's own renderer from a data-parallel serving plan
(``ServingPlan(dp=2, expert_parallel=True)``); the Serve fake names a DP application's engine
deployment ``DPServer:tiny`` with one replica per rank, as Serve did on the test bed
(tests/data/serve/status-dp-ep-two-hosts-starting.json).
"""

from __future__ import annotations

import json

import pytest

from orchestrator.cluster.node_state import NodeState
from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import RolloutFailed, UsageError
from orchestrator.serve.config import AppTarget, ServingPlan, render_app
from orchestrator.serve.desired import Desired
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, make_world

OPTIONS = RolloutOptions(timeout_s=60, probe_timeout_s=10)


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def dp_rollout(world, dp=2, max_model_len=1024, key=KEY, options=OPTIONS):
    """`orch rollout` of the tiny model as a DP group of ``dp`` ranks with expert parallelism."""
    plan = ServingPlan(tp=1, pp=1, max_model_len=max_model_len, dp=dp, expert_parallel=True, replicas=1)
    manifest = world.manifest

    def build(nodes, cores=None):
        rendered = render_app(manifest, plan, AppTarget("orch-candidate", "/", "tiny", str(world.model)),
                              node_resource=node_resource, node_cores=cores)  # fmt: skip
        return Desired(model=str(world.model), served_name="tiny", model_source=str(world.model), rendered=rendered,
                       plan={"tp": 1, "pp": 1, "dp": dp, "expert_parallel": True, "replicas": 1, "max_model_len": max_model_len})  # fmt: skip

    return execute(manifest, build, key, world.deps, options)


def _llm(app):
    return app["args"]["llm_config"]


def test_a_fresh_dp_rollout_deploys_the_dp_builder_gated_by_a_completion_with_the_key(world):
    res = dp_rollout(world)
    assert res.action == "fresh" and res.revision == 1
    (app,) = world.serve.bodies[0]["applications"]
    assert app["import_path"] == "ray.serve.llm:build_dp_openai_app" and (app["name"], app["route_prefix"]) == ("orch", "/")
    assert _llm(app)["engine_kwargs"]["api_key"] == [KEY]  # only in the body of the PUT
    assert (_llm(app)["engine_kwargs"]["data_parallel_size"], _llm(app)["engine_kwargs"]["enable_expert_parallel"]) == (2, True)
    assert world.validated[0]["args"]["llm_config"]["engine_kwargs"]["api_key"] == ["<redacted>"]
    assert world.endpoint.probes == [("/", "tiny", KEY)]
    rev = world.state.current_revision("wf")
    assert rev.status == "ready" and KEY not in json.dumps(rev.config) and rev.config["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] == 2
    assert dp_rollout(world).action == "noop"


def test_a_dp_change_with_room_for_a_second_group_goes_side_by_side_then_surges(world):
    dp_rollout(world)
    res = dp_rollout(world, max_model_len=2048)
    assert res.action == "side_by_side" and res.revision == 2
    first, switch = world.serve.bodies[1:]
    assert [(a["name"], a["route_prefix"]) for a in first["applications"]] == [("orch", "/"), ("orch-r2", "/_orch/r2")]
    (live,) = switch["applications"]
    assert (live["name"], _llm(live)["engine_kwargs"]["max_model_len"], _llm(live)["deployment_config"]["max_surge_percent"]) == ("orch", 2048, 100)
    assert ("/_orch/r2", "tiny", KEY) in world.endpoint.probes and world.endpoint.probes[-1] == ("/", "tiny", KEY)


def test_no_room_for_a_second_group_refuses_then_replaces_in_place(world):
    dp_rollout(world)
    # Each rank takes 2 CPUs (its worker's bundle and the replica actor): a second group of 2
    # ranks needs 4 more CPUs, and only 3 are free on the two nodes together.
    world.nodes = [NodeState("n-head", "head", "10.0.0.1", "ALIVE", True, {"CPU": 8.0}, {"CPU": 6.0}),
                   NodeState("n-w1", "w1", "10.0.0.2", "ALIVE", False, {"CPU": 8.0}, {"CPU": 7.0})]  # fmt: skip
    with pytest.raises(UsageError, match="no room for a second copy beside revision 1"):
        dp_rollout(world, max_model_len=2048)
    res = dp_rollout(world, max_model_len=2048, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True))
    assert res.action == "in_place" and world.state.current_revision("wf").number == 2  # the refusal recorded nothing


def test_turning_a_tp_application_into_a_dp_one_is_refused_without_downtime_allowed(world):
    world.rollout()  # revision 1: the TP x PP builder (LLMServer)
    with pytest.raises(UsageError) as err:
        dp_rollout(world)
    assert "turns a tensor/pipeline-parallel application (LLMServer) into a data-parallel application" in err.value.message
    assert len(world.serve.bodies) == 1  # nothing applied
    res = dp_rollout(world, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True))
    assert res.action == "in_place" and world.serve.bodies[-1]["applications"][0]["import_path"].endswith("build_dp_openai_app")


def test_a_failed_dp_candidate_leaves_the_serving_group_untouched_and_quotes_serve(world):
    dp_rollout(world)
    world.serve.scripts["orch-r2"] = ["DEPLOYING", "DEPLOY_FAILED"]
    world.serve.message = "NotImplementedError raised in the data-parallel group"
    with pytest.raises(RolloutFailed) as err:
        dp_rollout(world, max_model_len=2048)
    assert "revision 1 is serving" in err.value.message
    (last,) = world.serve.bodies[-1]["applications"]
    assert last["name"] == "orch" and _llm(last)["engine_kwargs"]["max_model_len"] == 1024
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "ready", 2: "failed"}


def test_rollback_redeploys_the_earlier_dp_revision_with_the_key(world):
    dp_rollout(world)
    dp_rollout(world, max_model_len=2048)
    res = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, OPTIONS)
    assert res.revision == 3
    live = world.serve.bodies[-1]["applications"][0]
    assert _llm(live)["engine_kwargs"]["max_model_len"] == 1024 and _llm(live)["engine_kwargs"]["api_key"] == [KEY]
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "superseded", 2: "rolled_back", 3: "ready"}


def test_a_dp_revision_holding_a_secret_placeholder_is_restored_with_the_real_value(world):
    world.manifest.env["HF_TOKEN"] = "hf_from_manifest"  # type: ignore[index]
    try:
        dp_rollout(world)
        stored = world.state.get_revision("wf", 1).config
        assert stored["runtime_env"]["env_vars"]["HF_TOKEN"] == "<redacted>"
        dp_rollout(world, max_model_len=2048)
        execute(world.manifest, desired_for_revision(world.state, "wf", 1), KEY, world.deps, OPTIONS)
        live = world.serve.bodies[-1]["applications"][0]
        assert live["runtime_env"]["env_vars"]["HF_TOKEN"] == "hf_from_manifest"
    finally:
        world.manifest.env.pop("HF_TOKEN", None)  # type: ignore[attr-defined]


def test_dry_run_shows_the_dp_application_without_the_key_and_applies_nothing(world):
    res = dp_rollout(world, options=RolloutOptions(timeout_s=60, dry_run=True))
    assert res.action == "dry_run:fresh" and world.serve.bodies == []
    assert _llm(res.config)["engine_kwargs"]["api_key"] == ["<redacted>"] and KEY not in json.dumps(res.config)
