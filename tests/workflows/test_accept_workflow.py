"""Acceptance stages and verdicts against a scripted environment (no cluster, no real time)."""

from __future__ import annotations

import pytest

from orchestrator.accept.stages import (
    ERROR,
    FAIL,
    PASS,
    SKIPPED,
    STAGES,
    AcceptancePlan,
    LoadShape,
    Targets,
    failure_stage,
    judge_level,
    overall,
    restart_stage,
    run_acceptance,
    stage_shapes,
    sweep_levels,
    sweep_stage,
)
from orchestrator.errors import RemoteError


def level(c=4, ttft95=100.0, tpot95=10.0, error_rate=0.0, succeeded=16, errors=None):
    return {
        "label": f"concurrency={c}", "concurrency": c, "requests": 16, "succeeded": succeeded, "errors": errors or {},
        "error_rate": error_rate, "output_tok_per_s": 100.0 * c, "req_per_s": 0.5 * c,
        "ttft_ms": {"p50": ttft95 / 2, "p95": ttft95}, "tpot_ms": {"p50": tpot95 / 2, "p95": tpot95},
    }  # fmt: skip


class FakeBg:
    def __init__(self, env):
        self.env = env

    def stop(self):
        self.env.calls.append("bg.stop")
        return {"requests": 40, "failed": 3, "errors": {"http": 3}}


class FakeEnv:
    """A cluster whose latency grows with concurrency (ttft = 50 ms * c) and whose health and
    probe answers follow scripts indexed by poll."""

    def __init__(self, health=None, probes=None, ttft_per_c=50.0):
        self.t = 0.0
        self.calls = []
        self.shapes = []
        self.health = list(health or ["healthy", "unhealthy", "unhealthy", "healthy"])
        self.probes = list(probes or [True])
        self.ttft_per_c = ttft_per_c

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s

    def topology(self):
        return {"head": {"gpus": [{"name": "H100"}] * 8, "nics": ["eth0"]}}

    def cold_load(self):
        return {"seconds": 106.0, "source": "revision 2"}

    def load(self, shape):
        self.shapes.append(shape)
        self.t += 5
        return {"levels": [level(c, ttft95=self.ttft_per_c * c) for c in shape.concurrency]}

    def start_background_load(self, concurrency):
        self.calls.append(f"bg.start({concurrency})")
        return FakeBg(self)

    def kill_engine(self):
        self.calls.append("kill")
        return {"node": "head", "pid": 4242, "process": "VLLM::EngineCore"}

    def serve_health(self):
        return self.health.pop(0) if len(self.health) > 1 else self.health[0]

    def probe(self):
        return self.probes.pop(0) if len(self.probes) > 1 else self.probes[0]

    def redeploy(self):
        self.calls.append("redeploy")
        self.t += 30


TARGETS = Targets(ttft_p95_ms=500.0, tpot_p95_ms=50.0, max_error_rate=0.01)


def test_judge_level_names_each_crossed_target():
    assert judge_level(level(), TARGETS) == []
    assert judge_level(level(ttft95=900), TARGETS) == ["TTFT p95 900 ms > 500 ms"]
    assert judge_level(level(tpot95=60, error_rate=0.05), TARGETS) == ["error rate 5.0% > 1.0%", "TPOT p95 60.0 ms > 50 ms"]
    assert judge_level(level(succeeded=0, errors={"connection": 16}), TARGETS) == ["no request succeeded (connection 16)"]
    # a missing target is not checked; the error budget always is
    assert judge_level(level(ttft95=1e6, tpot95=1e6), Targets()) == []


def test_sweep_doubles_until_a_target_is_crossed_and_reports_the_highest_level_meeting_them():
    assert sweep_levels(64) == [1, 2, 4, 8, 16, 32, 64]
    assert sweep_levels(6) == [1, 2, 4, 6]
    env = FakeEnv(ttft_per_c=50.0)  # ttft p95 = 50*c: 8 -> 400 ok, 16 -> 800 crosses 500
    res = sweep_stage(env, AcceptancePlan(targets=TARGETS, max_concurrency=64))
    assert res.verdict == PASS
    goodput = res.metrics.pop("goodput")
    assert res.metrics == {"highest_concurrency_meeting_targets": 8, "crossed_at": 16}
    # The scripted levels serve 0.5 req/s per request in flight: concurrency 8 (4 req/s) is the
    # heaviest that met the targets, on the plan's one replica.
    assert (goodput["per_replica_req_per_s"], goodput["per_replica_concurrency"], goodput["missed_at"]) == (4.0, 8.0, "concurrency=16")
    assert "goodput 4.00 req/s per replica at concurrency 8" in res.summary
    assert [s.concurrency for s in env.shapes] == [(1,), (2,), (4,), (8,), (16,)]
    assert "crossed at 16" in res.summary and "TTFT p95 800 ms > 500 ms" in res.summary


def test_sweep_fails_when_even_concurrency_one_misses():
    res = sweep_stage(FakeEnv(ttft_per_c=600.0), AcceptancePlan(targets=TARGETS))
    assert res.verdict == FAIL and res.metrics["highest_concurrency_meeting_targets"] is None


def test_long_prompt_stage_fills_the_context_and_output_heavy_asks_for_long_answers():
    shapes = stage_shapes(AcceptancePlan(targets=TARGETS, max_model_len=1024))
    long = shapes["long_prompts"]
    assert long.prompt_tokens + long.output_tokens <= 1024 and long.prompt_tokens >= 900
    assert shapes["output_heavy"].output_tokens >= 8 * shapes["short_prompts"].output_tokens


def test_failure_stage_sees_unhealthy_then_recovery_and_counts_failed_requests():
    env = FakeEnv(health=["healthy", "unhealthy", "unhealthy", "healthy"], probes=[True])
    res = failure_stage(env, AcceptancePlan(targets=TARGETS, poll_s=2.0))
    assert res.verdict == PASS
    assert env.calls == ["bg.start(2)", "kill", "bg.stop"]
    assert res.metrics["unhealthy_seen_after_s"] == 2.0
    assert res.metrics["time_to_recovery_s"] == 6.0
    assert res.metrics["failed_requests"] == 3 and res.metrics["requests"] == 40
    assert res.details["health_timeline"] == [(0.0, "healthy"), (2.0, "unhealthy"), (6.0, "healthy")]


def test_failure_stage_fails_when_serve_never_reports_the_replica_unhealthy():
    env = FakeEnv(health=["healthy"])
    res = failure_stage(env, AcceptancePlan(targets=TARGETS, recovery_timeout_s=20, poll_s=2))
    assert res.verdict == FAIL and "never reported the replica unhealthy" in res.summary
    assert env.calls[-1] == "bg.stop"  # background load always stopped


def test_failure_stage_fails_when_the_replica_does_not_come_back():
    env = FakeEnv(health=["unhealthy"])
    res = failure_stage(env, AcceptancePlan(targets=TARGETS, recovery_timeout_s=20, poll_s=2))
    assert res.verdict == FAIL and res.metrics["time_to_recovery_s"] is None


def test_restart_times_the_first_answer_after_the_redeploy():
    env = FakeEnv(probes=[False, False, True])
    res = restart_stage(env, AcceptancePlan(targets=TARGETS, poll_s=5))
    assert res.verdict == PASS and res.metrics["time_to_answer_s"] == 40.0  # 30 s redeploy + 2 polls
    env = FakeEnv(probes=[False])
    assert restart_stage(env, AcceptancePlan(targets=TARGETS, restart_timeout_s=60, poll_s=5)).verdict == FAIL


def test_run_acceptance_runs_every_stage_records_errors_and_skips():
    class Broken(FakeEnv):
        def kill_engine(self):
            raise RemoteError("no engine process found on any node", hint="is the app RUNNING?")

    seen = []
    results = run_acceptance(Broken(), AcceptancePlan(targets=TARGETS, max_concurrency=4, skip=("restart",)), seen.append)
    assert [r.name for r in results] == list(STAGES) == [r.name for r in seen]
    verdicts = {r.name: r.verdict for r in results}
    # The scripted cluster meets the targets up to concurrency 10 (TTFT 50 ms per stream, 500 ms
    # target) and every load stage stays within 4; only the kill raises and restart is skipped.
    assert verdicts == {
        "topology": PASS, "cold_load": PASS, "short_prompts": PASS, "long_prompts": PASS,
        "concurrency_sweep": PASS, "output_heavy": PASS, "failure": ERROR, "restart": SKIPPED,
    }  # fmt: skip
    assert "no engine process" in results[6].summary
    assert overall(results) == FAIL


@pytest.mark.parametrize("verdicts, expected", [([PASS, SKIPPED], PASS), ([PASS, FAIL], FAIL), ([ERROR], FAIL)])
def test_overall_verdict(verdicts, expected):
    from orchestrator.accept.stages import StageResult

    assert overall([StageResult(str(i), v, "") for i, v in enumerate(verdicts)]) == expected


def test_load_stage_fails_on_the_error_budget():
    class Erroring(FakeEnv):
        def load(self, shape: LoadShape):
            return {"levels": [level(4, error_rate=0.25)]}

    res = run_acceptance(Erroring(), AcceptancePlan(targets=TARGETS, skip=tuple(s for s in STAGES if s != "short_prompts")))
    short = next(r for r in res if r.name == "short_prompts")
    assert short.verdict == FAIL and "error rate 25.0% > 1.0%" in short.summary


def test_the_sweep_is_recorded_against_the_serving_revision(tmp_path):
    from orchestrator.state import StateStore
    from orchestrator.workflows.load_record import record_sweep, recorded_load

    state = StateStore(tmp_path / "state", clock=lambda: 1000.0)
    rev = state.add_revision("c", "tiny", plan={}, config_fingerprint="f", config={})
    state.update_revision("c", rev.number, "ready")
    plan = AcceptancePlan(targets=TARGETS, max_concurrency=64, replicas=2)
    results = [sweep_stage(FakeEnv(ttft_per_c=50.0), plan)]
    assert record_sweep(state, state.current_revision("c"), results, plan, "completions", 1234.0) == rev.number
    entry = recorded_load(state, "c", rev.number)
    assert (entry["source"], entry["at"], entry["replicas"]) == ("orch accept", 1234.0, 2)
    assert [lv["concurrency"] for lv in entry["levels"]] == [1, 2, 4, 8, 16]
    assert entry["shape"] == {"prompt_tokens": 32, "output_tokens": 64, "workload": "random", "endpoint": "completions"}
    # concurrency 8 (4 req/s in the scripted levels) met the targets, on 2 replicas: 2 req/s, 4 in flight each
    assert (entry["goodput"]["per_replica_req_per_s"], entry["goodput"]["per_replica_concurrency"]) == (2.0, 4.0)
    assert record_sweep(state, state.current_revision("c"), [], plan, "completions", 1.0) is None  # --skip concurrency_sweep
