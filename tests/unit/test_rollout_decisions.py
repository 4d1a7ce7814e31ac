"""rollout: the decision table, the placement simulation that says whether a second copy fits,
and the downtime estimate."""

from __future__ import annotations

import pytest

from orchestrator.cluster.ray_nodes import NodeState
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
    assert r.app_name(4) == "orch-r4" and r.revision_of_app("orch-r4") == 4 and r.revision_of_app("other") is None
    assert r.candidate_route(4) == "/_orch/r4"


# ------------------------------------------------------------------ capacity

CPU_LLM = {
    "placement_group_config": {"strategy": "STRICT_PACK", "bundles": [{"CPU": 1}]},
    "deployment_config": {"num_replicas": 1},
}


def _pinned_405b(nodes=("a", "b")):
    bundles = [{"GPU": 1, f"orch_node_{n}": 0.001} for n in nodes for _ in range(8)]
    return {"placement_group_config": {"strategy": "PACK", "bundles": bundles}, "deployment_config": {"num_replicas": 1}}


def test_replica_actor_cpu_is_merged_into_the_first_bundle():
    bundles, strategy = r.replica_bundles(CPU_LLM)
    assert bundles == [{"CPU": 2.0}] and strategy == "STRICT_PACK"
    groups, _ = r.copy_demand({**CPU_LLM, "deployment_config": {"num_replicas": 3}})
    assert len(groups) == 3


def test_cpu_copy_fits_while_logical_cpus_remain():
    groups, strategy = r.copy_demand(CPU_LLM)
    assert r.fits(groups, strategy, {"local": {"CPU": 6.0}})
    assert not r.fits(groups, strategy, {"local": {"CPU": 1.5}})
    # STRICT_PACK: the two CPUs must be on one node, not split.
    assert not r.fits(groups, strategy, {"a": {"CPU": 1.0}, "b": {"CPU": 1.0}})


def test_pinned_stages_need_their_own_nodes_free():
    groups, strategy = r.copy_demand(_pinned_405b())
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
