"""`orch rollout --slo-gate` over the rollout world's fakes: the candidate gets the live revision's
recorded load level before the switch; a miss fails the rollout and the live revision stays."""

from __future__ import annotations

import pytest

from orchestrator.bench.goodput import LoadLevel
from orchestrator.errors import RolloutFailed, UsageError
from orchestrator.workflows.load_record import record_load, recorded_load
from orchestrator.workflows.rollout import RolloutOptions
from tests.workflows.rollout_world import KEY, MANIFEST, _nodes, make_world

GATED = RolloutOptions(timeout_s=60, probe_timeout_s=10, slo_gate=True)


def bench_level(c: int, ttft95: float, tpot95: float = 8.0, ok: int = 16) -> dict:
    """A level as `orch bench` reports it (bench.report.level_dict's keys the gate reads)."""
    return {"label": f"concurrency={c}", "concurrency": c, "rate": None, "requests": 16, "succeeded": ok, "failed": 16 - ok,
            "errors": {}, "error_rate": (16 - ok) / 16, "req_per_s": 2.0 * c, "ttft_ms": {"p50": ttft95 / 2, "p95": ttft95},
            "tpot_ms": {"p50": tpot95, "p95": tpot95}, "e2e_ms": {"mean": 500.0}}  # fmt: skip


class GateEndpoint:
    """Wraps the world's endpoint: answers the gate's load with a scripted level."""

    def __init__(self, inner, ttft95: float):
        self.inner, self.ttft95, self.loads = inner, ttft95, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def load(self, route, model, key, gate):
        self.loads.append((route, model, key, gate.concurrency, gate.requests))
        return {"config": {"prompt_tokens": 128, "output_tokens": 64, "workload": "random"}, "target": {"endpoint": "completions"},
                "levels": [bench_level(gate.concurrency, self.ttft95)]}  # fmt: skip


@pytest.fixture
def world(tmp_path):
    w = make_world(tmp_path, MANIFEST + "slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}\n")
    w.rollout()  # revision 1 serves on orch
    return w


def _record_live(world, levels):
    live = world.state.current_revision("wf")
    record_load(world.state, live, [LoadLevel.from_level(lv, 128, 64) for lv in levels], {"prompt_tokens": 128, "output_tokens": 64},
                1, world.manifest.slo, "orch bench", 1000.0)  # fmt: skip


def test_a_candidate_meeting_the_slo_at_the_recorded_level_is_switched_in_and_records_its_measurement(world):
    _record_live(world, [bench_level(1, 90.0), bench_level(4, 300.0), bench_level(8, 700.0)])
    world.endpoint = GateEndpoint(world.endpoint, ttft95=350.0)
    res = world.rollout(options=GATED, max_model_len=2048)
    assert res.action == "side_by_side" and res.revision == 2
    # Concurrency 4 was the heaviest level revision 1 met the SLO at (8 missed: 700 > 500 ms).
    assert world.endpoint.loads == [("/_orch/r2", "tiny", KEY, 4, 16)]
    assert res.slo_gate["passed"] is True and res.slo_gate["measured"]["ttft_p95_ms"] == 350.0
    assert world.state.current_revision("wf").number == 2
    meta = world.state.revision_meta("wf", 2)
    assert meta["slo_gate"]["plan"]["recorded_revision"] == 1
    # The candidate's measurement is its own record now: the next gate holds a candidate to it.
    entry = recorded_load(world.state, "wf", 2)
    assert entry["source"] == "slo gate" and entry["goodput"]["level"]["label"] == "concurrency=4"


def test_a_candidate_missing_the_slo_fails_before_the_switch_and_the_live_revision_keeps_serving(world):
    _record_live(world, [bench_level(2, 120.0), bench_level(4, 300.0)])
    world.endpoint = GateEndpoint(world.endpoint, ttft95=2600.0)
    before = len(world.serve.bodies)
    with pytest.raises(RolloutFailed) as err:
        world.rollout(options=GATED, max_num_seqs=1)
    assert err.value.rolled_back and "SLO gate: orch-r2 misses the objective" in err.value.message
    assert "TTFT p95 2600 ms > 500 ms" in err.value.message and "revision 1 is serving" in err.value.message
    # Two PUTs only: the candidate beside the live app, then the live app alone (candidate removed).
    candidate, restore = world.serve.bodies[before:]
    assert [a["name"] for a in candidate["applications"]] == ["orch", "orch-r2"]
    assert [a["name"] for a in restore["applications"]] == ["orch"]
    assert restore["applications"][0] == candidate["applications"][0]  # the live app never changed
    assert world.state.current_revision("wf").number == 1 and world.state.get_revision("wf", 2).status == "failed"
    assert world.state.revision_meta("wf", 2)["slo_gate"]["misses"] == ["TTFT p95 2600 ms > 500 ms"]


def test_the_gate_is_refused_before_anything_is_applied_without_a_recorded_level(world):
    world.endpoint = GateEndpoint(world.endpoint, ttft95=1.0)
    before = len(world.serve.bodies)
    with pytest.raises(UsageError) as err:
        world.rollout(options=GATED, max_model_len=2048)
    assert err.value.message == "--slo-gate: revision 1 has no recorded load levels"
    assert "orch bench" in err.value.hint
    assert len(world.serve.bodies) == before and world.endpoint.loads == []
    assert [r.number for r in world.state.list_revisions("wf")] == [1]


def test_the_gate_needs_a_side_by_side_rollout(world):
    _record_live(world, [bench_level(2, 120.0)])
    world.nodes = _nodes(cpus_used=8.0)  # no room for a second copy
    with pytest.raises(UsageError) as err:
        world.rollout(options=RolloutOptions(timeout_s=60, probe_timeout_s=10, slo_gate=True, allow_downtime=True), max_model_len=2048)
    assert err.value.message.startswith("--slo-gate measures a candidate beside the live revision before the switch; this rollout is in_place")
