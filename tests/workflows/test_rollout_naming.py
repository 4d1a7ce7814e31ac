"""The public application's name says no revision; records, results and messages say which
revision it serves. Over the fake Serve of tests/workflows/rollout_world.py: fresh, side by side,
in place, rollback, restore, repair, and a cluster an older orch left serving ``orch-r1``."""

from __future__ import annotations

import pytest

from orchestrator.errors import RolloutFailed, StateError, UsageError
from orchestrator.serve.config import RenderedApp
from orchestrator.status.serving import pick_app, revision_app
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, TRACEBACK, FakeServe, ServeEndpoint, _nodes, fail_the_switch, make_world
from tests.workflows.test_rollout_faults import Injector

OPTIONS = RolloutOptions(timeout_s=60, probe_timeout_s=10)
IN_PLACE = RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True)
NO_SURGE = [{"name": "LLMServer:tiny", "max_surge_percent": 0}]  # Serve's engine deployment of the tiny model


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def _apps(body):
    return [(a["name"], a["route_prefix"]) for a in body["applications"]]


def _max_len(app):
    return app["args"]["llm_configs"][0]["engine_kwargs"]["max_model_len"]


def _served(world, number):
    """What `orch status` reports for a revision: its application (from the record) in Serve."""
    rev = world.state.get_revision("wf", number)
    name = revision_app(rev)[0]
    return name, pick_app(world.serve.status(), name)


def test_fresh_deploys_the_public_application_under_its_stable_name(world):
    res = world.rollout(options=OPTIONS)
    (app,) = world.serve.bodies[0]["applications"]
    assert (app["name"], app["route_prefix"]) == ("orch", "/") and res.app_name == "orch"
    assert "deployments" not in app  # nothing ran before it: nothing to roll
    assert world.state.get_revision("wf", 1).app_name == "orch"
    assert "applied revision 1 as orch on / (fresh)" in res.steps


def test_side_by_side_proves_a_candidate_named_after_its_revision_then_orch_serves_it(world):
    world.rollout(options=OPTIONS)
    res = world.rollout(options=OPTIONS, max_model_len=2048)
    assert _apps(world.serve.bodies[1]) == [("orch", "/"), ("orch-r2", "/_orch/r2")]
    assert _apps(world.serve.bodies[2]) == [("orch", "/")] and _max_len(world.serve.bodies[2]["applications"][0]) == 2048
    assert res.app_name == "orch" and world.state.get_revision("wf", 2).app_name == "orch"
    assert "applied candidate orch-r2 (revision 2) on /_orch/r2 (side_by_side)" in res.steps
    name, app = _served(world, 2)
    assert name == "orch" and app is not None and _max_len(app.deployed_config) == 2048


def test_in_place_updates_orch_without_a_surge_and_waits_for_the_new_deploy(world):
    world.rollout(options=OPTIONS)
    world.nodes = _nodes(cpus_used=7.5)  # no room for a second copy
    real_apply, real_status = world.serve.apply, world.serve.status
    seen = []

    def apply(body):
        real_apply(body)
        # Serve still reports the old deploy as RUNNING for a poll after the PUT.
        world.serve.scripts["orch"] = ["RUNNING", "DEPLOYING", "RUNNING"]
        world.serve.deployed["orch"] -= 1.0

    def status():
        st = real_status()
        app = st.app("orch")
        if len(world.serve.bodies) == 2 and app is not None:
            seen.append(app.status)
            if app.status == "DEPLOYING":
                world.serve.deployed["orch"] += 1.0  # the new deploy begins
        return st

    world.serve.apply, world.serve.status = apply, status
    res = world.rollout(options=IN_PLACE, max_model_len=2048)
    (body,) = world.serve.bodies[1]["applications"]
    assert res.action == "in_place" and (body["name"], body["route_prefix"]) == ("orch", "/")
    assert body["deployments"] == NO_SURGE and _max_len(body) == 2048
    assert seen[:3] == ["RUNNING", "DEPLOYING", "RUNNING"]  # the old RUNNING was not taken for the new one
    assert res.app_name == "orch" and world.state.get_revision("wf", 2).app_name == "orch"
    # The record is the rendered config (the surge is how Serve rolled to it, not what serves).
    assert "deployments" not in world.state.get_revision("wf", 2).config
    assert world.rollout(options=IN_PLACE, max_model_len=2048).action == "noop"


def test_rollback_keeps_the_public_name_and_records_the_revision_it_serves(world):
    world.rollout(options=OPTIONS)
    world.rollout(options=OPTIONS, max_model_len=2048)
    res = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, OPTIONS)
    assert res.revision == 3 and res.app_name == "orch" and set(world.serve.apps) == {"orch"}
    assert world.state.current_revision("wf").number == 3
    name, app = _served(world, 3)
    assert name == "orch" and _max_len(app.deployed_config) == 1024


def test_a_failed_switch_rolls_back_with_the_surge_even_when_orch_came_in_place(world):
    world.rollout(options=OPTIONS)
    world.nodes = _nodes(cpus_used=7.5)
    world.rollout(options=IN_PLACE, max_model_len=2048)  # orch now runs with NO_SURGE
    world.nodes = _nodes()
    fail_the_switch(world, 4, ["DEPLOYING", "RUNNING"])
    with pytest.raises(RolloutFailed) as err:
        world.rollout(options=OPTIONS, max_model_len=4096)
    assert err.value.rolled_back and "revision 2 is serving" in err.value.message
    candidate, _switch, restore = world.serve.bodies[2:]
    assert candidate["applications"][0]["deployments"] == NO_SURGE  # before the switch: the live app as it ran
    (back,) = restore["applications"]
    assert back["name"] == "orch" and _max_len(back) == 2048
    # There was room for two copies: Serve rolls back with the rendered surge (100), not none.
    assert "deployments" not in back and back["args"]["llm_configs"][0]["deployment_config"]["max_surge_percent"] == 100


# ---------------------------------------------------------------------- a cluster of an older orch


def _older_orch_cluster(world):
    """Revision 1 serving as ``orch-r1``, as an older orch named it."""
    world.rollout(options=OPTIONS)
    app = world.serve.apps.pop("orch")
    world.serve.apply({"applications": [dict(app, name="orch-r1")]})
    stored = world.state.get_revision("wf", 1).config
    world.state.set_served_as("wf", 1, "orch-r1", RenderedApp(app=stored).renamed("orch-r1", "/").app)
    world.serve.bodies.clear()
    world.serve.status()  # Serve has run it for a while: RUNNING


def test_an_older_orch_cluster_side_by_side_keeps_the_live_name_so_the_route_never_moves(world):
    _older_orch_cluster(world)
    res = world.rollout(options=OPTIONS, max_model_len=2048)
    assert res.action == "side_by_side"
    assert _apps(world.serve.bodies[0]) == [("orch-r1", "/"), ("orch-r2", "/_orch/r2")]
    assert _apps(world.serve.bodies[1]) == [("orch-r1", "/")]
    assert any("the name an older orch gave it" in s for s in res.steps)
    # It serves revision 2, which the record says (the name does not).
    assert world.state.get_revision("wf", 2).app_name == "orch-r1"
    name, app = _served(world, 2)
    assert name == "orch-r1" and _max_len(app.deployed_config) == 2048
    assert world.rollout(options=OPTIONS, max_model_len=2048).action == "noop"


def test_an_older_orch_cluster_in_place_moves_to_the_stable_name(world):
    _older_orch_cluster(world)
    world.nodes = _nodes(cpus_used=7.5)
    res = world.rollout(options=IN_PLACE, max_model_len=2048)
    (body,) = world.serve.bodies[0]["applications"]
    assert res.action == "in_place" and body["name"] == "orch" and set(world.serve.apps) == {"orch"}
    assert "deployments" not in body  # a new application: nothing to roll, orch-r1 goes in the same PUT
    assert world.state.get_revision("wf", 2).app_name == "orch"


def test_an_older_orch_cluster_failed_in_place_gets_orch_r1_back(world):
    _older_orch_cluster(world)
    world.nodes = _nodes(cpus_used=7.5)
    world.serve.scripts["orch"] = ["DEPLOYING", "DEPLOY_FAILED"]
    world.serve.message = TRACEBACK
    with pytest.raises(RolloutFailed) as err:
        world.rollout(options=IN_PLACE, max_model_len=2048)
    assert err.value.rolled_back and "revision 1 is serving" in err.value.message
    assert world.state.get_revision("wf", 2).status == "failed" and "in_place" in str(world.state.revision_meta("wf", 2)["decision"])
    (back,) = world.serve.bodies[-1]["applications"]
    assert (back["name"], back["route_prefix"], _max_len(back)) == ("orch-r1", "/", 1024)
    assert set(world.serve.apps) == {"orch-r1"}
    assert world.rollout(options=OPTIONS).action == "noop"


# ---------------------------------------------------------------------- repair


def test_an_interrupted_in_place_update_of_orch_is_repaired_without_a_surge(tmp_path):
    world = make_world(tmp_path)
    world.serve = FakeServe(keep_in=tmp_path / "serve.json")
    world.endpoint = ServeEndpoint(world)
    world.rollout(options=OPTIONS)
    world.nodes = _nodes(cpus_used=7.5)
    injector = Injector(world, "probe", "tunnel_drop")  # orch loses Serve after the in-place PUT
    injector.arm()
    with pytest.raises(RolloutFailed, match="stays pending|putting revision 1 back failed"):
        world.rollout(options=IN_PLACE, max_model_len=2048)
    injector.disarm()
    assert _max_len(world.serve.apps["orch"]) == 2048  # the interrupted revision's config is live
    again = world.rollout(options=IN_PLACE)
    assert again.repaired and "revision 2" in again.repaired[0] and again.action == "noop"
    (back,) = world.serve.bodies[-1]["applications"]
    assert (back["name"], _max_len(back)) == ("orch", 1024)
    assert back["deployments"] == NO_SURGE  # no room for two copies: back without a surge


def _without_route(app):
    return {k: v for k, v in app.items() if k != "route_prefix"}


def _front_models(app):
    (dep,) = app["deployments"]
    return {m["model_id"]: (m["app"], m["deployment"]) for m in dep["user_config"]["models"]}, dep["user_config"]["api_key"]


def test_another_served_name_comes_up_beside_the_served_model_behind_one_front(world):
    """Several models per cluster: a rollout under another served name is a new application on
    its own route; every PUT carries the served model's application as Serve runs it (no
    application moves). Once the new one answered, the front comes up on its staging route,
    answers for both models, then takes /v1 (the OpenAI paths: the longest route prefix wins)
    while the first model keeps "/"."""
    said: list[str] = []
    world.deps = world.deps.__class__(**{**world.deps.__dict__, "progress": said.append})
    world.endpoint = ServeEndpoint(world)
    world.rollout()
    tiny_config = world.serve.apps["orch"]
    res = world.rollout(served_name="other")
    assert res.action == "fresh" and res.model == "other" and res.app_name == "orch-m-other"
    (note,) = res.decision["notes"]
    assert note == "'other' comes up as its own application orch-m-other on /_orch/m/other, beside 'tiny' (orch): they keep serving, untouched"
    assert note in said
    fresh, staged, final = world.serve.bodies[1:]
    assert [a["name"] for a in fresh["applications"]] == ["orch", "orch-m-other"]
    assert [(a["name"], a["route_prefix"]) for a in staged["applications"]] == [("orch", "/"), ("orch-m-other", "/_orch/m/other"),
                                                                             ("orch-front", "/_orch/front/v1")]  # fmt: skip
    assert [(a["name"], a["route_prefix"]) for a in final["applications"]] == [("orch", "/"), ("orch-m-other", "/_orch/m/other"),
                                                                            ("orch-front", "/v1")]  # fmt: skip
    assert all(b["applications"][0] == tiny_config for b in (fresh, staged, final))  # never moved, never changed
    models, key = _front_models(world.serve.apps["orch-front"])
    assert models == {"tiny": ("orch", "LLMServer:tiny"), "other": ("orch-m-other", "LLMServer:other")} and key == [KEY]
    # both models answered through the staging route (the front), then through "/" (/v1: the front)
    probes = [(route, model) for route, model, _ in world.endpoint.probes]
    assert probes[-5:] == [("/_orch/m/other", "other"), ("/_orch/front", "other"), ("/_orch/front", "tiny"), ("/", "other"), ("/", "tiny")]
    assert world.endpoint.taken_by[-4:] == ["orch-front"] * 4
    assert world.state.get_revision("wf", 2).config["route_prefix"] == "/_orch/m/other"
    assert [(r.number, r.status) for r in world.state.list_revisions("wf")] == [(1, "ready"), (2, "ready")]
    # a new revision of 'other' is side by side on its own route; 'tiny' and the front untouched
    tiny_now, front_now = world.serve.apps["orch"], world.serve.apps["orch-front"]
    tiny_deployed, front_deployed = world.serve.deployed["orch"], world.serve.deployed["orch-front"]
    again = world.rollout(served_name="other", max_model_len=2048)
    assert again.action == "side_by_side" and again.previous_revision == 2 and again.app_name == "orch-m-other"
    assert world.serve.apps["orch"] == tiny_now and world.serve.deployed["orch"] == tiny_deployed
    assert world.serve.apps["orch-front"] == front_now and world.serve.deployed["orch-front"] == front_deployed
    assert world.serve.apps["orch-m-other"]["route_prefix"] == "/_orch/m/other"
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "ready", 2: "superseded", 3: "ready"}
    # and a new revision of 'tiny' keeps its own route and leaves 'other' as it runs
    other_config, other_deployed = world.serve.apps["orch-m-other"], world.serve.deployed["orch-m-other"]
    back = world.rollout(max_model_len=2048)
    assert back.action == "side_by_side" and back.previous_revision == 1 and back.app_name == "orch"
    assert world.serve.apps["orch-m-other"] == other_config and world.serve.deployed["orch-m-other"] == other_deployed
    assert world.serve.apps["orch"]["route_prefix"] == "/" and world.serve.apps["orch-front"] == front_now
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "superseded", 2: "superseded", 3: "ready", 4: "ready"}


def test_a_model_that_does_not_fit_beside_the_others_is_refused_naming_what_holds_the_capacity(world):
    world.rollout()
    world.nodes = _nodes(cpus_used=7.5)  # what the served model's replica holds leaves half a CPU per node
    bodies = len(world.serve.bodies)
    with pytest.raises(UsageError) as err:
        world.rollout(served_name="other")
    assert err.value.message.startswith("'other' does not fit beside the models this cluster serves: it needs CPU ")
    assert "free now: head: CPU 0.5; w1: CPU 0.5" in err.value.message and "'tiny' (orch) holds CPU " in err.value.message
    assert "orch remove" in err.value.hint
    assert len(world.serve.bodies) == bodies and world.state.list_revisions("wf")[-1].number == 1  # nothing applied or recorded


def test_rollback_of_one_model_touches_only_it(world):
    world.rollout()
    world.rollout(served_name="other")
    world.rollout(served_name="other", max_model_len=2048)  # revision 3 supersedes 2
    tiny_config, tiny_deployed = world.serve.apps["orch"], world.serve.deployed["orch"]
    with pytest.raises(UsageError, match="serves 2 models \\(other, tiny\\): name the one to roll back") as err:
        desired_for_revision(world.state, "wf", None)
    assert err.value.hint == "orch rollback --model other (or --to N)"
    with pytest.raises(UsageError, match="revision 2 served 'other', not 'tiny'"):
        desired_for_revision(world.state, "wf", 2, "tiny")
    res = execute(world.manifest, desired_for_revision(world.state, "wf", None, "other"), KEY, world.deps,
                  RolloutOptions(timeout_s=60, probe_timeout_s=10, command="rollback"))  # fmt: skip
    assert res.action == "side_by_side" and res.model == "other" and res.app_name == "orch-m-other"
    assert _max_len(world.serve.apps["orch-m-other"]) == 1024  # revision 2's config is back
    assert world.serve.apps["orch"] == tiny_config and world.serve.deployed["orch"] == tiny_deployed
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "ready", 2: "superseded", 3: "rolled_back", 4: "ready"}
    # 'tiny' has no earlier revision of its own: the other model's are not its
    with pytest.raises(StateError, match="has no earlier revision of 'tiny' to roll back to"):
        desired_for_revision(world.state, "wf", None, "tiny")


def test_the_front_learns_a_models_lora_adapters_without_a_restart(world):
    from orchestrator.serve.lora import LoraAdapter

    world.rollout()
    world.rollout(served_name="other")
    front_deployed = world.serve.deployed["orch-front"]
    res = world.rollout(served_name="other", adapters=(LoraAdapter("sql", "/models/adapters/sql"),))
    assert res.action == "side_by_side"
    models, _ = _front_models(world.serve.apps["orch-front"])
    (dep,) = world.serve.apps["orch-front"]["deployments"]
    assert {m["model_id"]: m["adapters"] for m in dep["user_config"]["models"]} == {"other": ["sql"], "tiny": []}
    assert models == {"tiny": ("orch", "LLMServer:tiny"), "other": ("orch-m-other", "LLMServer:other")}
    # a user_config change: Serve deploys the app's new config (the fake counts it), no new args or code
    assert world.serve.deployed["orch-front"] == front_deployed + 1 and world.serve.apps["orch-front"]["args"] == {"replicas": 1}


def test_plan_cluster_capacity_says_what_each_served_model_holds(world):
    from orchestrator.workflows.served_models import capacity, describe_capacity

    world.rollout()
    world.rollout(served_name="other", replicas=2)
    cap = capacity(world.manifest, world.state)
    # each replica's placement group as rendered, plus the replica actor's CPU that Serve LLM merges
    # into bundle 0 (LLMServer.get_deployment_options: ray_actor_options num_cpus, default 1)
    def cpus(number, replicas):
        llm = world.state.get_revision("wf", number).config["args"]["llm_configs"][0]
        return replicas * (sum(b.get("CPU", 0) for b in llm["placement_group_config"]["bundles"]) + 1)

    assert cap["total"] == {"GPU": 0.0, "CPU": 16.0}  # two nodes of `cpus: 8`
    assert [(h["served_name"], h["revision"], h["application"], h["resources"]) for h in cap["held"]] == [
        ("other", 2, "orch-m-other", {"GPU": 0.0, "CPU": cpus(2, 2)}), ("tiny", 1, "orch", {"GPU": 0.0, "CPU": cpus(1, 1)})]
    assert cap["free"] == {"GPU": 0.0, "CPU": 16.0 - cpus(1, 1) - cpus(2, 2)}
    line = describe_capacity(cap)
    assert line.startswith("CPU 16 in all; 'other' (revision 2) holds CPU ") and "; free: CPU " in line


def test_logs_of_several_models_need_the_model_named(world):
    from contextlib import contextmanager

    from orchestrator.workflows.logs import LogRequest, LogsDeps, find_logs

    world.rollout()
    world.rollout(served_name="other")
    asked: list[str] = []

    @contextmanager
    def open_serve(_runner, _port, _token):
        asked.append("serve")
        raise AssertionError("Serve is not asked before the model is known")
        yield

    deps = LogsDeps(state=world.state, open_runners=lambda m: world.deps.open_runners(m), open_serve=open_serve)
    with pytest.raises(UsageError, match="serves 2 models \\(other, tiny\\): name one with --model") as err:
        find_logs(world.manifest, LogRequest(), deps)
    assert err.value.hint == "orch logs --model other"
    with pytest.raises(UsageError, match="--model nope: cluster wf serves no model of that name") as err:
        find_logs(world.manifest, LogRequest(model="nope"), deps)
    assert err.value.hint == "served: other, tiny" and asked == []
    with pytest.raises(AssertionError, match="Serve is not asked"):  # a named model goes on to Serve
        find_logs(world.manifest, LogRequest(model="other"), deps)


def test_an_interrupted_rollout_of_one_model_is_repaired_without_touching_the_other(tmp_path):
    """'other' is interrupted (orch loses Serve after its fresh apply, so nothing is put back and
    its revision stays pending); the next command repairs it: 'other' removed, 'tiny' as it ran."""
    world = make_world(tmp_path)
    world.serve = FakeServe(keep_in=tmp_path / "serve.json")
    world.endpoint = ServeEndpoint(world)
    world.rollout(options=OPTIONS)
    tiny_config, tiny_deployed = world.serve.apps["orch"], world.serve.deployed["orch"]
    injector = Injector(world, "probe", "tunnel_drop")
    injector.arm()
    with pytest.raises(RolloutFailed, match="stays pending|putting revision - back failed|failed too"):
        world.rollout(options=OPTIONS, served_name="other")
    injector.disarm()
    assert world.state.get_revision("wf", 2).status == "pending" and "orch-m-other" in world.serve.apps
    again = world.rollout(options=OPTIONS)  # a command on 'tiny' repairs 'other' first
    assert again.action == "noop" and again.repaired and "revision 2" in again.repaired[0]
    assert set(world.serve.apps) == {"orch"} and world.serve.apps["orch"] == tiny_config
    assert world.serve.deployed["orch"] == tiny_deployed
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "ready", 2: "failed"}
