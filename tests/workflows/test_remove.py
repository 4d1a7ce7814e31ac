"""`orch remove NAME`: over the fake Serve of tests/workflows/rollout_world.py (its apply keeps
exactly the applications of the body, as Serve's declarative PUT does)."""

from __future__ import annotations

import copy

import pytest

from orchestrator.cluster_lock import ClusterBusy
from orchestrator.errors import ServeError, UsageError
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.remove import RemoveOptions, remove
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, make_world


@pytest.fixture
def world(tmp_path):
    w = make_world(tmp_path)
    w.rollout()
    return w


def _names(body):
    return [a["name"] for a in body["applications"]]


def test_remove_deletes_the_models_application_and_records_the_revision_removed(world):
    said: list[str] = []
    deps = world.deps.__class__(**{**world.deps.__dict__, "progress": said.append})
    res = remove(world.manifest, "tiny", deps)
    assert (res.action, res.model, res.revision, res.apps, res.kept) == ("removed", "tiny", 1, ["orch"], [])
    assert _names(world.serve.bodies[-1]) == [] and world.serve.apps == {}
    assert world.state.get_revision("wf", 1).status == "removed" and world.state.current_revision("wf") is None
    assert said == res.steps and any("nothing serves 'tiny'" in s for s in said)
    # nothing serves: the next rollout deploys fresh, and rollback brings the removed revision back
    assert world.rollout(max_model_len=2048).action == "fresh"
    remove(world.manifest, "tiny", world.deps)
    back = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps,
                   RolloutOptions(timeout_s=60, probe_timeout_s=10, command="rollback"))  # fmt: skip
    assert back.action == "fresh" and back.config["args"]["llm_configs"][0]["engine_kwargs"]["max_model_len"] == 2048


def test_applications_orch_does_not_own_are_kept_as_serve_runs_them(world):
    other = copy.deepcopy(world.serve.apps["orch"])
    other.update(name="team-embedder", route_prefix="/embed")
    world.serve.apps["team-embedder"], world.serve.deployed["team-embedder"] = other, 1.0
    candidate = copy.deepcopy(world.serve.apps["orch"])
    candidate.update(name="orch-r7", route_prefix="/_orch/r7")  # left by an unfinished rollout of the same model
    world.serve.apps["orch-r7"], world.serve.deployed["orch-r7"] = candidate, 1.0
    res = remove(world.manifest, "tiny", world.deps)
    assert (res.apps, res.kept) == (["orch", "orch-r7"], ["team-embedder"])
    assert world.serve.bodies[-1]["applications"] == [other]


def test_dry_run_changes_nothing(world):
    bodies = len(world.serve.bodies)
    res = remove(world.manifest, "tiny", world.deps, RemoveOptions(dry_run=True))
    assert (res.action, res.apps) == ("dry_run", ["orch"])
    assert len(world.serve.bodies) == bodies and world.state.current_revision("wf").number == 1


def test_another_name_or_nothing_served_is_refused_naming_what_is_served(world):
    with pytest.raises(UsageError) as err:
        remove(world.manifest, "llama", world.deps)
    assert err.value.message == "cluster 'wf' serves no model named 'llama'; it serves 'tiny' (revision 1)" and err.value.hint == "orch remove tiny ..."
    assert err.value.exit_code == 2 and world.state.current_revision("wf").number == 1
    remove(world.manifest, "tiny", world.deps)
    with pytest.raises(UsageError, match="serves no model"):
        remove(world.manifest, "tiny", world.deps)


def test_serve_still_deleting_after_the_timeout_is_an_error_the_revision_stays_removed(world):
    real_apply, kept = world.serve.apply, dict(world.serve.apps)

    def apply(body):  # Serve accepts the PUT but keeps listing the application (DELETING)
        real_apply(body)
        world.serve.apps.update(kept)

    world.serve.apply = apply
    with pytest.raises(ServeError, match="still lists orch 30 s after"):
        remove(world.manifest, "tiny", world.deps, RemoveOptions(timeout_s=30, poll_s=5))
    assert world.state.get_revision("wf", 1).status == "removed"


def test_remove_waits_for_no_lock_it_cannot_take(world):
    from orchestrator import cluster_lock

    with cluster_lock.hold(world.state.cluster_dir("wf"), "wf", "rollout"):
        with pytest.raises(ClusterBusy):
            remove(world.manifest, "tiny", world.deps)
    assert world.state.current_revision("wf").number == 1


def test_removing_one_of_two_models_leaves_the_other_serving_untouched(world):
    world.rollout(served_name="other")
    tiny_config, tiny_deployed = copy.deepcopy(world.serve.apps["orch"]), world.serve.deployed["orch"]
    assert tiny_config["route_prefix"] == "/" and world.serve.apps["orch-front"]["route_prefix"] == "/v1"
    res = remove(world.manifest, "other", world.deps)
    # one model left, on "/" itself: the front goes with 'other' (/v1 falls back to "/")
    assert (res.apps, res.kept) == (["orch-front", "orch-m-other"], ["orch"])
    assert world.serve.apps == {"orch": tiny_config} and world.serve.deployed["orch"] == tiny_deployed  # not redeployed
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "ready", 2: "removed"}
    with pytest.raises(UsageError, match="serves no model named 'other'; it serves 'tiny' \\(revision 1\\)"):
        remove(world.manifest, "other", world.deps)


def test_removing_the_first_model_keeps_the_front_for_the_one_on_its_own_route(world):
    world.rollout(served_name="other")
    other_config = copy.deepcopy(world.serve.apps["orch-m-other"])
    res = remove(world.manifest, "tiny", world.deps)
    assert (res.apps, res.kept) == (["orch"], ["orch-front", "orch-m-other"])  # nothing moves: /v1 stays the front's
    assert world.serve.apps["orch-m-other"] == other_config and world.serve.apps["orch-front"]["route_prefix"] == "/v1"
    (dep,) = world.serve.apps["orch-front"]["deployments"]
    assert [m["model_id"] for m in dep["user_config"]["models"]] == ["other"]


def test_removing_one_of_three_models_keeps_the_front_for_the_two_left(world):
    world.rollout(served_name="b")
    world.rollout(served_name="c")
    tiny_config = copy.deepcopy(world.serve.apps["orch"])
    res = remove(world.manifest, "b", world.deps)
    assert (res.apps, res.kept) == (["orch-m-b"], ["orch", "orch-front", "orch-m-c"])
    assert world.serve.apps["orch"] == tiny_config  # untouched
    (dep,) = world.serve.apps["orch-front"]["deployments"]  # the front routes to what is left, with the key it had
    assert dep["user_config"] == {"models": [{"model_id": "c", "app": "orch-m-c", "deployment": "LLMServer:c", "adapters": []},
                                             {"model_id": "tiny", "app": "orch", "deployment": "LLMServer:tiny", "adapters": []}],
                                  "api_key": [KEY]}  # fmt: skip
    # down to one on "/": the front goes; then the last model
    remove(world.manifest, "c", world.deps)
    assert set(world.serve.apps) == {"orch"} and world.serve.apps["orch"] == tiny_config
    remove(world.manifest, "tiny", world.deps)
    assert world.serve.apps == {}
