"""rollout: the decision table, the placement simulation that says whether a second copy fits,
and the downtime estimate."""

from __future__ import annotations

import pytest

from orchestrator.cluster.node_state import NodeState
from orchestrator.serve import decisions as r

LIVE = r.Serving(revision=3, fingerprint="abc", app_name="orch-r3", app_status="RUNNING", cold_load_s=95.0)


def test_same_fingerprint_and_running_is_nothing_to_do():
    d = r.decide("abc", LIVE, room_for_copy=True, allow_downtime=False, downtime_s=None)
    assert d.kind == r.NOOP and "revision 3" in d.reason


@pytest.mark.parametrize("status", [None, "DEPLOY_FAILED", "DEPLOYING"])
def test_recorded_revision_that_does_not_run_is_deployed_fresh(status):
    serving = r.Serving(revision=3, fingerprint="abc", app_name="orch-r3", app_status=status)
    d = r.decide("abc", serving, room_for_copy=False, allow_downtime=False, downtime_s=10)
    assert d.kind == r.FRESH and "orch-r3" in d.reason


def test_first_rollout_is_fresh():
    assert r.decide("x", r.Serving(), room_for_copy=False, allow_downtime=False, downtime_s=None).kind == r.FRESH


def test_room_for_a_copy_goes_side_by_side():
    d = r.decide("new", LIVE, room_for_copy=True, allow_downtime=False, downtime_s=95.0)
    assert d.kind == r.SIDE_BY_SIDE and d.downtime_s is None


def test_allow_downtime_still_goes_side_by_side_when_there_is_room():
    # --allow-downtime permits an outage when nothing else works; it never causes one when a second
    # copy fits (issue 17's planted bug: in place although there was room).
    d = r.decide("new", LIVE, room_for_copy=True, allow_downtime=True, downtime_s=95.0)
    assert (d.kind, d.downtime_s) == (r.SIDE_BY_SIDE, None)
    assert "beside revision 3" in d.reason


def test_no_room_refuses_with_the_estimate_unless_downtime_is_allowed():
    refuse = r.decide("new", LIVE, room_for_copy=False, allow_downtime=False, downtime_s=95.0)
    assert refuse.kind == r.REFUSE and "about 95 s" in refuse.reason and refuse.downtime_s == 95.0
    inplace = r.decide("new", LIVE, room_for_copy=False, allow_downtime=True, downtime_s=95.0)
    assert inplace.kind == r.IN_PLACE and inplace.downtime_s == 95.0


def test_names_and_routes():
    # The public application's name names no revision; a candidate is revision N on its own route.
    assert r.public_app_name() == "orch" and r.revision_of_app(r.public_app_name()) is None
    assert r.candidate_app_name(4) == "orch-r4" and r.revision_of_app("orch-r4") == 4 and r.revision_of_app("other") is None
    assert r.candidate_route(4) == "/_orch/r4"


# ------------------------------------------------------------------ capacity

CPU_LLM = {
    "placement_group_config": {"strategy": "STRICT_PACK", "bundles": [{"CPU": 1}]},
    "deployment_config": {"num_replicas": 1},
}


def tp_app(llm_config):
    """A tensor/pipeline-parallel application around one rendered llm_config."""
    return {"import_path": "ray.serve.llm:build_openai_app", "args": {"llm_configs": [llm_config]}}


def _pinned_405b(nodes=("a", "b")):
    bundles = [{"GPU": 1, f"orch_node_{n}": 0.001} for n in nodes for _ in range(8)]
    return {"placement_group_config": {"strategy": "PACK", "bundles": bundles}, "deployment_config": {"num_replicas": 1}}


def test_replica_actor_cpu_is_merged_into_the_first_bundle():
    bundles, strategy = r.replica_bundles(CPU_LLM)
    assert bundles == [{"CPU": 2.0}] and strategy == "STRICT_PACK"
    groups, _ = r.copy_demand(tp_app({**CPU_LLM, "deployment_config": {"num_replicas": 3}}))
    assert len(groups) == 3


def test_cpu_copy_fits_while_logical_cpus_remain():
    groups, strategy = r.copy_demand(tp_app(CPU_LLM))
    assert r.fits(groups, strategy, {"local": {"CPU": 6.0}})
    assert not r.fits(groups, strategy, {"local": {"CPU": 1.5}})
    # STRICT_PACK: the two CPUs must be on one node, not split.
    assert not r.fits(groups, strategy, {"a": {"CPU": 1.0}, "b": {"CPU": 1.0}})


def test_pinned_stages_need_their_own_nodes_free():
    groups, strategy = r.copy_demand(tp_app(_pinned_405b()))
    free = {"a": {"GPU": 8.0, "CPU": 10.0, "orch_node_a": 1000.0}, "b": {"GPU": 8.0, "CPU": 10.0, "orch_node_b": 1000.0}}
    assert r.fits(groups, strategy, free)
    busy = {**free, "b": {**free["b"], "GPU": 0.0}}  # the serving copy holds b's GPUs
    assert not r.fits(groups, strategy, busy)
    # Free GPUs elsewhere do not help bundles pinned to b.
    assert not r.fits(groups, strategy, {**busy, "c": {"GPU": 8.0, "CPU": 10.0, "orch_node_c": 1000.0}})


def test_pack_fills_nodes_in_order_and_fails_when_short():
    groups = [[{"GPU": 1.0}] * 12]
    assert r.fits(groups, "PACK", {"a": {"GPU": 8.0}, "b": {"GPU": 4.0}})
    assert not r.fits(groups, "PACK", {"a": {"GPU": 8.0}, "b": {"GPU": 3.0}})


def test_free_resources_skips_dead_nodes_and_subtracts_usage():
    alive = NodeState("id1", "a", "10.0.0.1", "ALIVE", True, {"CPU": 8.0, "GPU": 8.0}, {"CPU": 2.0, "GPU": 8.0})
    dead = NodeState("id2", "b", "10.0.0.2", "DEAD", False, {"CPU": 8.0, "GPU": 8.0})
    assert r.free_resources([alive, dead]) == {"a": {"CPU": 6.0, "GPU": 0.0}}


def test_cold_load_estimate_prefers_the_measurement():
    assert r.estimate_cold_load_s("gpu", 378.0, 250.0) == 250.0
    assert r.estimate_cold_load_s("gpu", 378.0, None) == pytest.approx(r.ENGINE_START_S["gpu"] + 378.0 / r.DISK_GIB_PER_S)
    assert r.estimate_cold_load_s("cpu", None, None) == r.ENGINE_START_S["cpu"]


# ------------------------------------------------------------------ the decision's words (user-facing)


def test_every_decision_explains_itself_in_full():
    noop = r.decide("abc", LIVE, room_for_copy=False, allow_downtime=False, downtime_s=None)
    assert noop.reason == "revision 3 already serves this config (orch-r3 RUNNING)"
    first = r.decide("x", r.Serving(), room_for_copy=True, allow_downtime=False, downtime_s=None)
    assert first.reason == "no revision serves yet: deploy on the public route"
    gone = r.decide("x", r.Serving(revision=3, fingerprint="abc", app_name="orch-r3"), room_for_copy=True, allow_downtime=False, downtime_s=None)
    assert gone.reason == "revision 3's application orch-r3 is not in Serve: deploy on the public route"
    side = r.decide("new", LIVE, room_for_copy=True, allow_downtime=False, downtime_s=95.0)
    assert side.reason == ("the cluster has room for a second copy: the new revision comes up beside revision 3, "
                           "traffic moves after its readiness probe")  # fmt: skip
    inplace = r.decide("new", LIVE, room_for_copy=False, allow_downtime=True, downtime_s=None)
    assert inplace.reason == ("no room for a second copy: revision 3 is replaced in place (--allow-downtime); "
                              "expected downtime one cold load of the model")  # fmt: skip
    refuse = r.decide("new", LIVE, room_for_copy=False, allow_downtime=False, downtime_s=94.6)
    assert refuse.reason == ("no room for a second copy beside revision 3: an in-place change would stop serving "
                             "for about 95 s")  # fmt: skip
    assert refuse.to_dict() == {"kind": "refuse", "reason": refuse.reason, "downtime_s": 94.6, "notes": []}


def test_a_changed_config_on_a_running_app_is_not_a_noop():
    d = r.decide("other", LIVE, room_for_copy=True, allow_downtime=False, downtime_s=None)
    assert d.kind == r.SIDE_BY_SIDE
    assert r.revision_of_app("orch-r") is None and r.revision_of_app("orch-rx1") is None


# ------------------------------------------------------------------ placement as Ray does it


def test_replica_bundles_defaults_and_the_actor_cpu_of_the_config():
    # Serve LLM adds the replica actor's CPUs (ray_actor_options.num_cpus, default 1) to bundle 0;
    # Ray's default placement strategy is PACK.
    assert r.replica_bundles({}) == ([{"CPU": 1.0}], "PACK")
    config = {"placement_group_config": {"bundles": [{"GPU": 1, "CPU": 2}, {"GPU": 1}]},
              "deployment_config": {"ray_actor_options": {"num_cpus": 0.5}}}  # fmt: skip
    assert r.replica_bundles(config) == ([{"GPU": 1, "CPU": 2.5}, {"GPU": 1}], "PACK")
    assert config["placement_group_config"]["bundles"][0] == {"GPU": 1, "CPU": 2}  # the config is not changed


def test_copy_demand_counts_replicas_from_autoscaling_too():
    one = {"placement_group_config": {"strategy": "STRICT_PACK", "bundles": [{"CPU": 1}]}}
    assert r.copy_demand(tp_app(one)) == ([[{"CPU": 2.0}]], "STRICT_PACK")
    auto = {**one, "deployment_config": {"autoscaling_config": {"min_replicas": 2, "max_replicas": 4}}}
    assert r.copy_demand(tp_app(auto)) == ([[{"CPU": 2.0}], [{"CPU": 2.0}]], "STRICT_PACK")
    zero = {**one, "deployment_config": {"num_replicas": "auto", "autoscaling_config": {"min_replicas": 0}}}
    assert len(r.copy_demand(tp_app(zero))[0]) == 1  # a copy needs at least one replica


def test_strategies_place_bundles_as_ray_documents_them():
    # Ray placement strategies: STRICT_PACK all bundles on one node; STRICT_SPREAD each bundle on
    # its own node; SPREAD spreads when it can and reuses nodes when it must; PACK packs.
    two = [[{"GPU": 1.0}, {"GPU": 1.0}]]
    split = {"a": {"GPU": 1.0}, "b": {"GPU": 1.0}}
    assert (r.fits(two, "STRICT_PACK", split), r.fits(two, "PACK", split)) == (False, True)
    assert r.fits(two, "STRICT_PACK", {"a": {"GPU": 1.0}, "b": {"GPU": 2.0}}) is True
    three = [[{"GPU": 1.0}] * 3]
    uneven = {"a": {"GPU": 2.0}, "b": {"GPU": 1.0}}
    assert (r.fits(three, "SPREAD", uneven), r.fits(three, "STRICT_SPREAD", uneven)) == (True, False)
    assert r.fits(three, "STRICT_SPREAD", {"a": {"GPU": 1.0}, "b": {"GPU": 1.0}, "c": {"GPU": 1.0}}) is True
    # Groups are placed one after another on what the earlier ones left.
    assert r.fits([[{"GPU": 1.0}]] * 3, "PACK", split) is False
    assert r.fits([[{"GPU": 1.0}]] * 2, "STRICT_PACK", split) is True
    # A zero amount asks for nothing; a resource the node lacks is zero there.
    assert r.fits([[{"GPU": 1.0, "memory": 0.0}]], "PACK", {"a": {"GPU": 1.0}}) is True
    assert r.fits([[{"GPU": 1.0, "TPU": 1.0}]], "PACK", {"a": {"GPU": 1.0}}) is False


def test_free_resources_names_a_node_orch_did_not_start_by_its_id():
    foreign = NodeState("id9", None, "10.0.0.9", "ALIVE", False, {"CPU": 4.0}, {"CPU": 1.0})
    assert r.free_resources([foreign]) == {"id9": {"CPU": 3.0}}


def test_cold_load_estimate_without_a_measurement():
    assert r.estimate_cold_load_s("gpu", 10.0, 0.0) == 90.0 + 10.0  # a zero measurement is no measurement
    assert r.estimate_cold_load_s("gpu", -5.0, None) == 90.0  # no negative reading time
    assert r.estimate_cold_load_s("tpu", None, None) == 90.0  # an unknown accelerator starts like a GPU engine


def test_later_groups_see_what_earlier_groups_took():
    split = {"a": {"GPU": 1.0}, "b": {"GPU": 1.0}}
    assert r.fits([[{"GPU": 1.0}]] * 3, "STRICT_PACK", split) is False  # the third replica finds no GPU
    # PACK keeps a group on the nodes it already uses: the pinned first bundle puts the group on b,
    # so its second bundle goes to b too and a stays free for the next group pinned to a.
    free = {"a": {"GPU": 1.0, "pa": 1.0}, "b": {"GPU": 2.0, "pb": 1.0}}
    groups = [[{"GPU": 1.0, "pb": 0.001}, {"GPU": 1.0}], [{"GPU": 1.0, "pa": 0.001}]]
    assert r.fits(groups, "PACK", free) is True
    # SPREAD puts the second bundle on a new node even though the first node could hold it, so the
    # next group, pinned to b, finds b's only GPU taken.
    free = {"a": {"GPU": 2.0}, "b": {"GPU": 1.0, "pb": 1.0}}
    groups = [[{"GPU": 1.0}, {"GPU": 1.0}], [{"GPU": 1.0, "pb": 0.001}]]
    assert r.fits(groups, "SPREAD", free) is False


def test_free_resources_reads_every_alive_node_after_a_dead_one():
    dead = NodeState("id2", "b", "10.0.0.2", "DEAD", False, {"CPU": 8.0})
    alive = NodeState("id1", "a", "10.0.0.1", "ALIVE", True, {"CPU": 8.0}, {"CPU": 2.0})
    assert r.free_resources([dead, alive]) == {"a": {"CPU": 6.0}}


def test_a_record_without_its_application_name_refuses_or_replaces_with_the_downtime_estimate():
    # docs/rollout.md, step 8: when the serving revision's application name is unknown the rollout
    # refuses; with --allow-downtime it deploys fresh, replacing whatever Serve runs. Either way the
    # caller is told the estimated downtime (the cold load of the model).
    lost = r.Serving(revision=3, fingerprint="abc", app_name=None, app_status=None)
    why = "revision 3 is recorded as serving but the name of its Serve application is not (its record is incomplete)"
    refuse = r.decide("abc", lost, room_for_copy=True, allow_downtime=False, downtime_s=95.0)
    assert refuse.to_dict() == {
        "kind": "refuse",
        "reason": f"{why}: orch will not replace what Serve runs without --allow-downtime",
        "downtime_s": 95.0,
        "notes": [],
    }
    fresh = r.decide("abc", lost, room_for_copy=True, allow_downtime=True, downtime_s=95.0)
    assert fresh.to_dict() == {
        "kind": "fresh",
        "reason": f"{why}: replacing whatever Serve runs (--allow-downtime)",
        "downtime_s": 95.0,
        "notes": [],
    }


def test_a_fresh_deploy_over_running_apps_names_them_all_and_the_downtime():
    # docs/rollout.md, step 8: a fresh deploy replaces every application Serve runs, so it is refused
    # while any is RUNNING (unless --allow-downtime); the refusal names them and the estimated downtime.
    nothing = r.Serving(running_apps=("orch-r7", "orch-r9"))
    refuse = r.decide("x", nothing, room_for_copy=True, allow_downtime=False, downtime_s=95.0)
    assert refuse.to_dict() == {
        "kind": "refuse",
        "reason": "no revision serves yet, but Serve runs orch-r7, orch-r9: a fresh deploy would delete it",
        "downtime_s": 95.0,
        "notes": [],
    }
    assert r.decide("x", nothing, room_for_copy=True, allow_downtime=True, downtime_s=95.0).kind == r.FRESH


def test_a_model_coming_up_beside_others_is_noted_only_when_it_is_fresh_beside_them():
    from orchestrator.serve.decisions import FRESH, IN_PLACE, NOOP, REFUSE, SIDE_BY_SIDE, Decision, beside

    (note,) = beside({"tiny": "orch", "b": "orch-m-b"}, "c", Decision(FRESH, "why"), "orch-m-c", "/_orch/m/c").notes
    assert note == "'c' comes up as its own application orch-m-c on /_orch/m/c, beside 'b' (orch-m-b), 'tiny' (orch): they keep serving, untouched"
    for kind in (SIDE_BY_SIDE, IN_PLACE, NOOP, REFUSE):  # a model that serves already, or nothing done
        assert beside({"tiny": "orch"}, "c", Decision(kind, "why"), "orch-m-c", "/").notes == ()
    assert beside({}, "c", Decision(FRESH, "why"), "orch", "/").notes == ()  # nothing beside it
    kept = Decision(FRESH, "why", notes=("earlier",))
    assert beside({"a": "orch"}, "b", kept, "orch-m-b", "/_orch/m/b").notes[0] == "earlier"
    assert len(beside({"a": "orch"}, "b", kept, "orch-m-b", "/_orch/m/b").notes) == 2


def test_a_new_models_application_name_and_route_beside_others():
    # the first model keeps the name and route an older orch gave its only model
    assert r.public_app_name("tiny", set()) == "orch" and r.public_app_name("tiny", {"orch-m-x"}) == "orch"
    assert r.model_route("tiny", set()) == "/" and r.model_route("tiny", {"/_orch/m/x"}) == "/"
    # beside a model that holds them: its own, named after the served name
    assert r.public_app_name("qwen-0.5b_chat", {"orch"}) == "orch-m-qwen-0.5b_chat"
    assert r.model_route("qwen-0.5b_chat", {"/"}) == "/_orch/m/qwen-0.5b_chat"
    # a name that cannot stand in a route as it is gets a digest: two names never share one
    slash, dash = r.model_slug("meta-llama/Llama-3.1-8B"), r.model_slug("meta-llama-Llama-3.1-8B")
    assert slash.startswith("meta-llama-Llama-3.1-8B-") and len(slash) == len("meta-llama-Llama-3.1-8B") + 9 and slash != dash
    assert dash == "meta-llama-Llama-3.1-8B"
    assert r.model_slug("a b") != r.model_slug("a  b") and r.model_slug("a b").startswith("a-b-")
    assert r.model_slug("///").startswith("model-") and r.model_slug(".hidden").startswith("hidden-")
    # a name of allowed characters is its own slug, whatever its first and last letters
    assert [r.model_slug(n) for n in ("Xtiny", "tinyX", "Qwen3-8B", "a.b_c")] == ["Xtiny", "tinyX", "Qwen3-8B", "a.b_c"]
    assert r.revision_of_app(r.public_app_name("r4", {"orch"})) is None  # never read as a candidate
