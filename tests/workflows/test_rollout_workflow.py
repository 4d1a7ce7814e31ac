"""The rollout/rollback workflow over fakes: a scripted Serve API, a fake endpoint, fake runners,
a real StateStore in a temp dir, and an injected clock (no real sleeping)."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import RolloutFailed, StateError, UsageError
from orchestrator.remote.fake import result
from orchestrator.status.serving import revision_app
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, TRACEBACK, _nodes, fail_the_switch, fail_the_update, make_world


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def test_first_rollout_deploys_on_the_public_route_and_records_a_ready_revision(world):
    res = world.rollout()
    assert res.action == "fresh" and res.revision == 1 and res.app_name == "orch"
    assert len(world.serve.bodies) == 1
    (app,) = world.serve.bodies[0]["applications"]
    assert app["name"] == "orch" and app["route_prefix"] == "/"
    assert app["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == [KEY]
    # A CPU engine computes on the smallest node's cores but one (left to its scheduler process
    # and the front end); Ray would leave it OMP_NUM_THREADS=1.
    assert app["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "3"
    # ...unpinned, so that a candidate engine beside the serving one gets its share of the cores.
    assert app["runtime_env"]["env_vars"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert world.validated and world.validated[0]["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == ["<redacted>"]
    rev = world.state.current_revision("wf")
    assert rev.number == 1 and rev.status == "ready" and KEY not in json.dumps(rev.config)
    assert res.cold_load_s is not None and world.state.revision_meta("wf", 1)["cold_load_s"] == res.cold_load_s
    assert world.endpoint.probes[0] == ("/", "tiny", KEY)
    # Every node was checked for the model folder before anything was applied.
    for runner in world.runners.values():
        assert runner.ran("test", "-f", f"{world.model}/config.json")


def test_same_rollout_again_is_nothing_to_do(world):
    world.rollout()
    again = world.rollout()
    assert again.action == "noop" and again.revision == 1 and len(world.serve.bodies) == 1


def test_a_rotated_key_is_a_new_revision(world):
    world.rollout()
    assert world.rollout(key=KEY + "-rotated").action == "side_by_side"


def _llm(app):
    return app["args"]["llm_configs"][0]


def test_change_with_room_is_proved_as_a_candidate_then_the_live_app_takes_it_with_a_surge(world):
    world.rollout()
    res = world.rollout(max_model_len=2048)
    assert res.action == "side_by_side" and res.revision == 2
    first, switch = world.serve.bodies[1:]
    assert [(a["name"], a["route_prefix"]) for a in first["applications"]] == [("orch", "/"), ("orch-r2", "/_orch/r2")]
    assert _llm(first["applications"][0])["engine_kwargs"]["max_model_len"] == 1024  # the live app untouched
    # The switch: the live application keeps its name and route and takes the new config; Serve
    # surges it (new replica beside the old one); the candidate goes.
    (live,) = switch["applications"]
    assert (live["name"], live["route_prefix"]) == ("orch", "/")
    assert _llm(live)["engine_kwargs"]["max_model_len"] == 2048
    assert _llm(live)["deployment_config"]["max_surge_percent"] == 100
    probes = world.endpoint.probes
    assert probes.index(("/_orch/r2", "tiny", KEY)) < len(probes) - 1 and probes[-1] == ("/", "tiny", KEY)
    assert res.app_name == "orch" and world.state.revision_meta("wf", 2)["app_name"] == "orch"
    # The revision records what it serves as (orch status finds its application from it).
    stored = world.state.get_revision("wf", 2).config
    assert (stored["name"], stored["route_prefix"]) == ("orch", "/") and revision_app(world.state.get_revision("wf", 2))[0] == "orch"
    assert (res.config["name"], res.config["route_prefix"]) == ("orch", "/")
    statuses = {r.number: r.status for r in world.state.list_revisions("wf")}
    assert statuses == {1: "superseded", 2: "ready"}
    # The next rollout finds revision 2 serving in orch: the same request is a no-op.
    assert world.rollout(max_model_len=2048).action == "noop"


def test_switch_waits_until_the_live_app_has_taken_the_new_config(world):
    world.rollout()
    # Serve still reports the old deployment as RUNNING for two polls after the switch's PUT.
    real_apply = world.serve.apply

    def apply(body):
        real_apply(body)
        if len(world.serve.bodies) == 3:
            world.serve.scripts["orch"] = ["RUNNING", "DEPLOYING", "RUNNING"]
            world.serve.deployed["orch"] -= 1.0  # not moved on yet

    world.serve.apply = apply
    statuses = []
    real_status = world.serve.status

    def status():
        st = real_status()
        app = st.app("orch")
        if app is not None and len(world.serve.bodies) == 3:
            statuses.append(app.status)
            if app.status == "DEPLOYING":
                world.serve.deployed["orch"] += 1.0
        return st

    world.serve.status = status
    res = world.rollout(max_model_len=2048)
    assert res.action == "side_by_side"
    assert statuses[:3] == ["RUNNING", "DEPLOYING", "RUNNING"]  # the first RUNNING was not taken for done


def test_failed_surge_puts_the_old_config_back_on_the_live_app(world):
    world.rollout()
    fail_the_switch(world, 3, ["RUNNING"])
    with pytest.raises(RolloutFailed) as err:
        world.rollout(max_model_len=2048)
    assert err.value.rolled_back and "orch is DEPLOY_FAILED" in err.value.message
    (restored,) = world.serve.bodies[-1]["applications"]
    assert restored["name"] == "orch" and _llm(restored)["engine_kwargs"]["max_model_len"] == 1024
    assert world.state.current_revision("wf").number == 1 and world.state.get_revision("wf", 2).status == "failed"


def test_failed_side_by_side_leaves_the_old_revision_serving_and_quotes_the_replica(world):
    world.rollout()
    world.serve.scripts["orch-r2"] = ["DEPLOYING", "DEPLOY_FAILED"]
    world.serve.message = TRACEBACK
    with pytest.raises(RolloutFailed) as err:
        world.rollout(max_model_len=2048)
    assert err.value.rolled_back
    assert "orch-r2 is DEPLOY_FAILED" in err.value.message
    assert "RuntimeError: Failed to create vLLM engine config: max_num_batched_tokens (1)" in err.value.message
    assert "revision 1 is serving" in err.value.message
    assert [a["name"] for a in world.serve.bodies[-1]["applications"]] == ["orch"]
    assert world.state.current_revision("wf").number == 1
    assert world.state.get_revision("wf", 2).status == "failed"


def test_no_healthy_replica_within_the_timeout_fails(world):
    world.rollout()
    world.serve.scripts["orch-r2"] = ["DEPLOYING"]
    with pytest.raises(RolloutFailed, match="no healthy replica of orch-r2 within 60 s"):
        world.rollout(max_model_len=2048)
    assert world.clock.now >= 60


def test_failed_probe_fails_the_revision(world):
    world.endpoint.ok = False
    with pytest.raises(RolloutFailed, match="readiness probe failed") as err:
        world.rollout()
    assert not err.value.rolled_back  # nothing served before
    assert world.serve.bodies[-1]["applications"] == []


def test_endpoint_without_401_is_not_ready(world):
    world.endpoint.unauth = 200
    with pytest.raises(RolloutFailed, match="without the API key"):
        world.rollout()


def test_missing_model_path_fails_before_anything_is_applied(world):
    world.rollout()
    world.runners["w1"].on(("test", "-f", "/nowhere/tiny/config.json"), result(exit_code=1))
    world.runners["head"].on(("test", "-f", "/nowhere/tiny/config.json"), result(exit_code=1))
    bodies = len(world.serve.bodies)
    with pytest.raises(RolloutFailed) as err:
        world.rollout(model="tiny", model_path="/nowhere/tiny")
    assert "/nowhere/tiny" in err.value.message and "head, w1" in err.value.message and err.value.rolled_back
    assert len(world.serve.bodies) == bodies


def test_no_room_refuses_with_a_downtime_estimate_then_replaces_in_place(world):
    world.rollout()
    world.nodes = _nodes(cpus_used=7.5)
    with pytest.raises(UsageError, match="no room for a second copy") as err:
        world.rollout(max_model_len=2048)
    assert "--allow-downtime" in err.value.hint
    res = world.rollout(max_model_len=2048, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True))
    assert res.action == "in_place"
    # The public application updated in place; without a surge (no room for a second replica).
    (app,) = world.serve.bodies[-1]["applications"]
    assert (app["name"], app["route_prefix"]) == ("orch", "/")
    assert app["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 0}]


def test_failed_in_place_change_redeploys_the_previous_revision(world):
    world.rollout()
    world.nodes = _nodes(cpus_used=7.5)
    fail_the_update(world)  # the in-place update of orch fails; the restore (the next PUT) brings it back
    with pytest.raises(RolloutFailed) as err:
        world.rollout(max_model_len=2048, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True))
    assert err.value.rolled_back and "revision 1 is serving" in err.value.message
    restored = world.serve.bodies[-1]["applications"]
    assert [(a["name"], a["route_prefix"]) for a in restored] == [("orch", "/")]
    assert restored[0]["args"]["llm_configs"][0]["engine_kwargs"]["max_model_len"] == 1024
    assert restored[0]["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 0}]  # rolled back without a surge too
    assert restored[0]["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == [KEY]


def test_rollback_redeploys_the_earlier_config_as_a_new_revision(world):
    world.rollout()
    world.rollout(max_model_len=2048)
    res = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, RolloutOptions(timeout_s=60))
    assert res.action == "side_by_side" and res.revision == 3
    served = world.serve.bodies[-1]["applications"][0]["args"]["llm_configs"][0]
    assert served["engine_kwargs"]["max_model_len"] == 1024
    statuses = {r.number: r.status for r in world.state.list_revisions("wf")}
    assert statuses == {1: "superseded", 2: "rolled_back", 3: "ready"}
    assert world.state.get_revision("wf", 3).config_fingerprint == world.state.get_revision("wf", 1).config_fingerprint


def test_rollback_without_an_earlier_revision_says_so(world):
    world.rollout()
    with pytest.raises(StateError, match="no earlier revision"):
        desired_for_revision(world.state, "wf", None)


def test_no_key_and_cluster_not_up(world, tmp_path):
    with pytest.raises(UsageError, match="WF_KEY"):
        world.rollout(key=None)
    world.state.set_cluster_state("wf", "down")
    with pytest.raises(StateError, match="not up"):
        world.rollout()
    dry = world.rollout(key=None, options=RolloutOptions(dry_run=True))
    assert dry.action == "dry_run:fresh" and dry.config["args"]["llm_configs"][0]["engine_kwargs"]["api_key"] == ["<redacted>"]
    assert world.serve.bodies == []
