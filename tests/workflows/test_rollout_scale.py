"""A change of the replica count alone (``--replicas``, a rollback to a revision that differed only
in it): Serve's lightweight update of the live application, no candidate and no new engine for
the replicas that serve. Over the rollout world's fakes (tests/workflows/rollout_world.py)."""

from __future__ import annotations

import pytest

from orchestrator.errors import RolloutFailed, UsageError
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, _nodes, fail_the_update, make_world

ENGINE = "LLMServer:tiny"  # Serve LLM's name for the tiny model's engine deployment


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def _engine_override(app):
    return [e for e in app.get("deployments") or [] if e.get("name") == ENGINE]


def test_more_replicas_keep_the_live_config_and_add_one_as_an_override(world):
    world.rollout()
    (first,) = world.serve.bodies[0]["applications"]
    res = world.rollout(replicas=2)
    assert res.action == "scale" and res.revision == 2 and res.app_name == "orch", res.decision
    assert "1 -> 2" in res.decision["reason"] and "keep running" in res.decision["reason"]
    assert len(world.serve.bodies) == 2  # no candidate application: one PUT
    (live,) = world.serve.bodies[1]["applications"]
    # The same args (Serve's code version: the serving replica is not restarted), the new count as
    # the engine deployment's override.
    assert live["args"] == first["args"] and live["runtime_env"] == first["runtime_env"] and live["import_path"] == first["import_path"]
    assert _engine_override(live) == [{"name": ENGINE, "num_replicas": 2}]
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "superseded", 2: "ready"}
    # The record: the config as it runs (the key redacted); the cold load stays the one measured
    # when an engine of this config started.
    stored = world.state.get_revision("wf", 2).config
    assert _engine_override(stored) == [{"name": ENGINE, "num_replicas": 2}] and KEY not in str(stored)
    assert world.state.revision_meta("wf", 2)["cold_load_s"] == world.state.revision_meta("wf", 1)["cold_load_s"]
    # The same request again: nothing to do; back to one replica: the override goes, the args stay.
    assert world.rollout(replicas=2).action == "noop"
    back = world.rollout(replicas=1)
    assert back.action == "scale" and "2 -> 1" in back.decision["reason"]
    (live,) = world.serve.bodies[-1]["applications"]
    assert live["args"] == first["args"] and _engine_override(live) == []
    assert world.rollout(replicas=1).action == "noop"


def test_a_change_besides_the_count_is_a_side_by_side_revision(world):
    world.rollout()
    assert world.rollout(replicas=2, max_model_len=2048).action == "side_by_side"
    assert world.rollout(replicas=2, key=KEY + "-rotated").action == "side_by_side"


def test_after_a_scale_a_config_change_starts_from_the_rendered_count(world):
    world.rollout()
    world.rollout(replicas=2)
    res = world.rollout(replicas=2, max_model_len=2048)
    assert res.action == "side_by_side"
    (live,) = world.serve.bodies[-1]["applications"]
    assert live["args"]["llm_configs"][0]["deployment_config"]["num_replicas"] == 2 and _engine_override(live) == []


def test_rollback_to_a_count_only_earlier_revision_scales_back(world):
    world.rollout()
    world.rollout(replicas=2)
    res = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, RolloutOptions(timeout_s=60))
    assert res.action == "scale" and res.revision == 3 and "2 -> 1" in res.decision["reason"]
    assert {r.number: r.status for r in world.state.list_revisions("wf")} == {1: "superseded", 2: "rolled_back", 3: "ready"}
    # ...and rolling back again (to revision 2, which runs 2 through an override) scales up.
    again = execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, RolloutOptions(timeout_s=60))
    assert again.action == "scale" and "1 -> 2" in again.decision["reason"]


def test_no_room_for_the_added_replicas_is_refused_and_fewer_always_fit(world):
    world.rollout(replicas=2)
    world.nodes = _nodes(cpus_used=7.5)
    with pytest.raises(UsageError, match="no room for 1 more replica") as err:
        world.rollout(replicas=3)
    assert "revision 1 keeps serving on 2" in err.value.message
    assert len(world.serve.bodies) == 1  # nothing applied
    assert world.rollout(replicas=1).action == "scale"


def test_a_scale_that_fails_puts_the_old_count_back(world):
    world.rollout()
    (first,) = world.serve.bodies[0]["applications"]
    fail_the_update(world)  # the scale's PUT fails; the restore brings it back
    with pytest.raises(RolloutFailed) as err:
        world.rollout(replicas=2)
    assert err.value.rolled_back and "revision 1 is serving" in err.value.message
    (restored,) = world.serve.bodies[-1]["applications"]
    assert restored == first  # put back as it ran: one replica, the same code version
    assert world.state.current_revision("wf").number == 1 and world.state.get_revision("wf", 2).status == "failed"


def test_the_slo_gate_is_refused_for_a_count_only_change(world):
    world.rollout()
    with pytest.raises(UsageError, match="this rollout is scale"):
        world.rollout(replicas=2, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, slo_gate=True))


def test_a_dry_run_says_scale_and_applies_nothing(world):
    world.rollout()
    res = world.rollout(replicas=2, options=RolloutOptions(timeout_s=60, probe_timeout_s=10, dry_run=True))
    assert res.action == "dry_run:scale" and len(world.serve.bodies) == 1
