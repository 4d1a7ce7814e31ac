"""serve/scaling.py and serve/slo_gate.py: replicas for a target rate, what a cluster holds, Serve's
autoscaling bounds, the SLO gate's load. Expected values worked by hand (in the comments) from the
inputs; the cluster shapes are the shipped manifests' (2 x 8 H100, local CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.bench.goodput import Goodput, LoadLevel
from orchestrator.errors import PlanError, UsageError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.manifest.sections import Slo
from orchestrator.plan.shape import shape_from_manifest
from orchestrator.serve.scaling import autoscaling_for, replicas_that_fit, size_for_target
from orchestrator.serve.slo_gate import judge_gate, plan_gate

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"


@pytest.fixture(scope="module")
def h100_2x8():
    return shape_from_manifest(load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml"))


def level(c: int | None, req_s: float, ttft: float, tpot: float = 10.0, rate: float | None = None, e2e: float | None = None, ok: int = 32) -> LoadLevel:
    label = f"concurrency={c}" if c is not None else f"rate={rate:g}/s"
    return LoadLevel(label, c, rate, 32, ok, (32 - ok) / 32, req_s, ttft, tpot, e2e, 128, 64)


def test_replicas_that_fit_inside_and_across_nodes(h100_2x8):
    assert (h100_2x8.gpus_per_node, h100_2x8.nodes) == (8, 2)
    assert replicas_that_fit(1, h100_2x8) == 16  # 8 // 1 per node x 2 nodes
    assert replicas_that_fit(3, h100_2x8) == 4  # 8 // 3 = 2 per node (2 GPUs idle) x 2
    assert replicas_that_fit(8, h100_2x8) == 2
    assert replicas_that_fit(16, h100_2x8) == 1  # TP 8 x PP 2: both nodes
    assert replicas_that_fit(24, h100_2x8) == 0  # three nodes' worth on two
    cpu = shape_from_manifest(load_manifest_file(TEMPLATES / "local.yaml"))
    assert replicas_that_fit(1, cpu) == 1  # one CPU engine per node


def test_a_target_rate_in_replicas_and_gpus(h100_2x8):
    # 4 replicas (4 x 2 = 8 in flight) sustained 10 req/s: 2.5 req/s per replica.
    capacity = Goodput(level(8, 10.0, 400.0), replicas=4, crossed=True)
    # 21 req/s / 2.5 = 8.4 -> 9 replicas; at TP 2: 18 GPUs; the cluster holds 16 // 2 = 8 replicas.
    sizing = size_for_target(21.0, capacity, 2, h100_2x8)
    assert (sizing.replicas, sizing.gpus_needed, sizing.gpus_total, sizing.max_replicas, sizing.fits) == (9, 18, 16, 8, False)
    assert "does NOT fit" in sizing.describe()
    # 20 req/s / 2.5 is exactly 8: no ninth replica for float noise.
    exact = size_for_target(20.0, capacity, 2, h100_2x8)
    assert (exact.replicas, exact.gpus_needed, exact.fits) == (8, 16, True)


def test_autoscaling_from_the_measured_capacity(h100_2x8):
    # one replica sustained 3 req/s at 6 in flight
    capacity = Goodput(level(6, 3.0, 300.0), replicas=1, crossed=True)
    policy = autoscaling_for(capacity, 8, h100_2x8, target_rps=5.0)
    # 5 / 3 = 1.67 -> at least 2; TP 8 on 2 x 8 GPUs -> at most 2; 6 in flight per replica
    assert (policy.min_replicas, policy.max_replicas, policy.target_ongoing_requests) == (2, 2, 6)
    free = autoscaling_for(capacity, 1, h100_2x8)  # no target rate: the plan's one replica up to 16
    assert (free.min_replicas, free.max_replicas, free.target_ongoing_requests) == (1, 16, 6)
    with pytest.raises(PlanError) as err:
        autoscaling_for(capacity, 8, h100_2x8, target_rps=7.0)  # 7 / 3 -> 3 replicas, 2 fit
    assert err.value.message == "the target needs 3 replica(s) and the cluster holds 2"
    # A rate level has no concurrency of its own: Little's law, 2 req/s x 1.5 s = 3 in flight.
    by_rate = Goodput(level(None, 2.0, 300.0, rate=2.0, e2e=1500.0), replicas=1, crossed=False)
    assert autoscaling_for(by_rate, 1, h100_2x8).target_ongoing_requests == 3


SLO = Slo(ttft_p95_ms=500.0, tpot_p95_ms=50.0)


def _entry(levels, replicas=2):
    return {"replicas": replicas, "levels": [lv.to_dict() for lv in levels], "shape": {"prompt_tokens": 128, "output_tokens": 64}}


def test_the_gate_holds_the_candidate_to_the_live_revisions_heaviest_level_meeting_the_slo():
    recorded = [level(2, 3.0, 120.0), level(8, 9.0, 430.0), level(16, 11.0, 900.0)]
    # On 2 replicas concurrency 8 met the SLO (16 missed: TTFT 900 > 500) -> 4 per replica;
    # a candidate of 3 replicas gets 12 in flight.
    gate = plan_gate(_entry(recorded), SLO, live_revision=5, candidate_replicas=3)
    assert (gate.level.label, gate.concurrency, gate.requests, gate.recorded_revision) == ("concurrency=8", 12, 32, 5)
    assert judge_gate(gate, level(12, 8.0, 480.0, tpot=49.0)) == []
    assert judge_gate(gate, level(12, 2.0, 2600.0, tpot=9.0)) == ["TTFT p95 2600 ms > 500 ms"]
    assert judge_gate(gate, level(12, 2.0, 200.0, ok=30)) == ["error rate 6.2% > 1.0%"]  # 2 of 32 failed


@pytest.mark.parametrize(("entry", "objective", "live", "fragment"), [
    ({"levels": []}, SLO, 5, "revision 5 has no recorded load levels"),
    (None, SLO, None, "no revision is serving"),
    (_entry([level(2, 3.0, 120.0)]), None, 5, "sets no slo:"),
    (_entry([level(2, 3.0, 700.0)]), SLO, 5, "revision 5 met the objective at none of its recorded levels (concurrency=2: TTFT p95 700 ms > 500 ms)"),
])  # fmt: skip
def test_the_gate_is_refused_up_front_when_there_is_nothing_to_hold_the_candidate_to(entry, objective, live, fragment):
    with pytest.raises(UsageError) as err:
        plan_gate(entry, objective, live, 1)
    assert fragment in err.value.message and err.value.hint
