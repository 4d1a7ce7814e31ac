"""The staged acceptance test of ``orch accept`` (seed 001): stages, verdicts, the whole verdict.
No I/O of its own: everything it touches goes through ``AcceptanceEnv`` (the endpoint's load
generator, the cluster's topology, a "kill one engine process" action, Serve's health, a probe,
a "redeploy" action, a clock and a sleep), so each stage is tested with fakes and wired to a real
cluster by ``orchestrator.workflows.accept``.

Stages, in order: topology, cold_load, short_prompts, long_prompts, concurrency_sweep,
output_heavy, failure, restart. A load stage passes when its TTFT p95 and TPOT p95 are within the
manifest's targets (a missing target is not checked) and its error rate is at most
max_error_rate. The sweep doubles the concurrency until a target is crossed and reports the
highest concurrency that met them all. The failure stage kills one engine process of the serving
replica under load and passes when orch saw the replica unhealthy and then answering again within
the recovery timeout. The restart stage redeploys the same revision and times the first answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.bench.goodput import LoadLevel, goodput, misses
from orchestrator.errors import OrchError
from orchestrator.manifest.sections import Targets

PASS, FAIL, SKIPPED, ERROR = "pass", "fail", "skipped", "error"
STAGES = ("topology", "cold_load", "short_prompts", "long_prompts", "concurrency_sweep", "output_heavy", "failure", "restart")


@dataclass(frozen=True)
class LoadShape:
    """One load run: prompt/output lengths in tokens, concurrency levels, requests per level."""

    name: str
    prompt_tokens: int
    output_tokens: int
    concurrency: tuple[int, ...]
    requests: int


@dataclass(frozen=True)
class AcceptancePlan:
    targets: Targets
    max_model_len: int = 1024
    requests: int = 16
    max_concurrency: int = 64
    short_prompt_tokens: int = 32
    short_output_tokens: int = 64
    heavy_output_tokens: int = 512
    stage_concurrency: int = 4
    failure_concurrency: int = 2
    recovery_timeout_s: float = 600.0
    restart_timeout_s: float = 900.0
    poll_s: float = 2.0
    skip: tuple[str, ...] = ()
    replicas: int = 1  # replicas serving the revision (the sweep's goodput is divided by them)


class BackgroundLoad(Protocol):
    def stop(self) -> dict:
        """Stop sending; return {"requests": n, "failed": n, "errors": {kind: n}}."""
        ...


class AcceptanceEnv(Protocol):
    def topology(self) -> dict[str, dict]: ...
    def cold_load(self) -> dict | None: ...
    def load(self, shape: LoadShape) -> dict: ...  # a bench results dict (report.bench_result)
    def start_background_load(self, concurrency: int) -> BackgroundLoad: ...
    def kill_engine(self) -> dict: ...  # {"node", "pid", "process"}
    def serve_health(self) -> str: ...  # "healthy" or a word for anything else
    def probe(self) -> bool: ...
    def redeploy(self) -> None: ...
    def clock(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class StageResult:
    name: str
    verdict: str  # pass | fail | skipped | error
    summary: str
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "summary": self.summary,
            "seconds": round(self.seconds, 2),
            "metrics": self.metrics,
            "details": self.details,
        }


def judge_level(level: Mapping[str, Any], targets: Targets) -> list[str]:
    """Why a load level misses the targets ([] = it meets them)."""
    if level["succeeded"] == 0:
        return [f"no request succeeded ({', '.join(f'{k} {v}' for k, v in level['errors'].items()) or 'no request sent'})"]
    return misses(LoadLevel.from_level(level), targets)


def _level_metrics(level: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "concurrency": level.get("concurrency"),
        "ttft_p95_ms": level["ttft_ms"]["p95"],
        "tpot_p95_ms": level["tpot_ms"]["p95"],
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "tpot_p50_ms": level["tpot_ms"]["p50"],
        "output_tok_per_s": level["output_tok_per_s"],
        "error_rate": level["error_rate"],
        "requests": level["requests"],
    }


def load_stage(env: AcceptanceEnv, plan: AcceptancePlan, shape: LoadShape) -> StageResult:
    t0 = env.clock()
    result = env.load(shape)
    levels = result["levels"]
    failing = {lv["label"]: judge_level(lv, plan.targets) for lv in levels}
    bad = {k: v for k, v in failing.items() if v}
    main = levels[-1]
    m = _level_metrics(main)
    desc = f"{shape.prompt_tokens}-token prompts, {shape.output_tokens} tokens out, concurrency {main.get('concurrency')}"
    if bad:
        summary = f"{desc}: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in bad.items())
    else:
        summary = f"{desc}: TTFT p95 {m['ttft_p95_ms']:.0f} ms, TPOT p95 {m['tpot_p95_ms'] or 0:.1f} ms, errors {m['error_rate']:.1%}"
    return StageResult(shape.name, FAIL if bad else PASS, summary, env.clock() - t0, m, {"bench": result})


def sweep_levels(max_concurrency: int) -> list[int]:
    levels, c = [], 1
    while c < max_concurrency:
        levels.append(c)
        c *= 2
    return [*levels, max_concurrency]


def sweep_stage(env: AcceptanceEnv, plan: AcceptancePlan) -> StageResult:
    """Double the concurrency until a p95 target (or the error budget) is crossed."""
    t0 = env.clock()
    met: int | None = None
    crossed: tuple[int, list[str]] | None = None
    levels: list[dict] = []
    for c in sweep_levels(plan.max_concurrency):
        shape = LoadShape("concurrency_sweep", plan.short_prompt_tokens, plan.short_output_tokens, (c,), max(plan.requests, 2 * c))
        level = env.load(shape)["levels"][0]
        levels.append(level)
        reasons = judge_level(level, plan.targets)
        if reasons:
            crossed = (c, reasons)
            break
        met = c
    found = goodput([LoadLevel.from_level(lv, plan.short_prompt_tokens, plan.short_output_tokens) for lv in levels], plan.targets, plan.replicas)
    metrics = {"highest_concurrency_meeting_targets": met, "crossed_at": crossed[0] if crossed else None,
               "goodput": found.to_dict() if found else None}  # fmt: skip
    details = {"levels": levels, "crossed_because": crossed[1] if crossed else []}
    if met is None:
        return StageResult("concurrency_sweep", FAIL, f"even concurrency 1 misses the targets: {', '.join(crossed[1]) if crossed else ''}",
                           env.clock() - t0, metrics, details)  # fmt: skip
    if crossed:
        summary = f"targets met up to concurrency {met}; crossed at {crossed[0]} ({', '.join(crossed[1])})"
    else:
        summary = f"targets met at every level up to {met} (not crossed: raise --max-concurrency to find the limit)"
    if found is not None:
        summary += f"; goodput {found.per_replica_req_per_s:.2f} req/s per replica at concurrency {found.per_replica_concurrency:g}"
    return StageResult("concurrency_sweep", PASS, summary, env.clock() - t0, metrics, details)


def topology_stage(env: AcceptanceEnv) -> StageResult:
    t0 = env.clock()
    nodes = env.topology()
    broken = {name: info["error"] for name, info in nodes.items() if info.get("error")}
    gpus = sum(len(info.get("gpus", [])) for info in nodes.values())
    summary = f"{len(nodes)} node(s), {gpus} GPU(s) captured"
    if broken:
        return StageResult("topology", FAIL, summary + "; unreachable: " + ", ".join(f"{k} ({v})" for k, v in broken.items()),
                           env.clock() - t0, {"nodes": len(nodes), "gpus": gpus}, {"nodes": nodes})  # fmt: skip
    return StageResult("topology", PASS, summary, env.clock() - t0, {"nodes": len(nodes), "gpus": gpus}, {"nodes": nodes})


def cold_load_stage(env: AcceptanceEnv) -> StageResult:
    t0 = env.clock()
    rec = env.cold_load()
    if not rec or rec.get("seconds") is None:
        return StageResult("cold_load", FAIL, "no ready revision records a rollout-to-first-token time", env.clock() - t0, {}, rec or {})
    return StageResult("cold_load", PASS, f"rollout start to first token: {rec['seconds']:.1f} s ({rec.get('source', '')})",
                       env.clock() - t0, {"cold_load_s": rec["seconds"]}, rec)  # fmt: skip


def failure_stage(env: AcceptanceEnv, plan: AcceptancePlan) -> StageResult:
    """Kill one engine process under load; orch must see the replica unhealthy, then answering."""
    t0 = env.clock()
    bg = env.start_background_load(plan.failure_concurrency)
    try:
        env.sleep(plan.poll_s)
        killed = env.kill_engine()
        t_kill = env.clock()
        unhealthy_at = recovered_at = None
        states: list[tuple[float, str]] = []
        while env.clock() - t_kill < plan.recovery_timeout_s:
            state = env.serve_health()
            now = env.clock() - t_kill
            if not states or states[-1][1] != state:
                states.append((round(now, 1), state))
            if state != "healthy" and unhealthy_at is None:
                unhealthy_at = now
            if unhealthy_at is not None and state == "healthy" and env.probe():
                recovered_at = env.clock() - t_kill
                break
            env.sleep(plan.poll_s)
    finally:
        traffic = bg.stop()
    metrics = {
        "killed": killed,
        "unhealthy_seen_after_s": None if unhealthy_at is None else round(unhealthy_at, 1),
        "time_to_recovery_s": None if recovered_at is None else round(recovered_at, 1),
        "failed_requests": traffic.get("failed", 0),
        "requests": traffic.get("requests", 0),
    }
    details = {"health_timeline": states, "traffic": traffic}
    what = f"killed {killed.get('process')} pid {killed.get('pid')} on {killed.get('node')}"
    if unhealthy_at is None:
        return StageResult("failure", FAIL, f"{what}; Serve never reported the replica unhealthy within {plan.recovery_timeout_s:g} s",
                           env.clock() - t0, metrics, details)  # fmt: skip
    if recovered_at is None:
        return StageResult("failure", FAIL, f"{what}; unhealthy after {unhealthy_at:.1f} s, not answering again within {plan.recovery_timeout_s:g} s",
                           env.clock() - t0, metrics, details)  # fmt: skip
    summary = (f"{what}; unhealthy after {unhealthy_at:.1f} s, answering again after {recovered_at:.1f} s; "
               f"{metrics['failed_requests']} of {metrics['requests']} requests failed meanwhile")  # fmt: skip
    return StageResult("failure", PASS, summary, env.clock() - t0, metrics, details)


def restart_stage(env: AcceptanceEnv, plan: AcceptancePlan) -> StageResult:
    t0 = env.clock()
    env.redeploy()
    while env.clock() - t0 < plan.restart_timeout_s:
        if env.probe():
            secs = env.clock() - t0
            return StageResult("restart", PASS, f"redeployed the same revision; answering again after {secs:.1f} s",
                               secs, {"time_to_answer_s": round(secs, 1)})  # fmt: skip
        env.sleep(plan.poll_s)
    return StageResult("restart", FAIL, f"redeployed; no answer within {plan.restart_timeout_s:g} s", env.clock() - t0, {"time_to_answer_s": None})


def stage_shapes(plan: AcceptancePlan) -> dict[str, LoadShape]:
    c = (plan.stage_concurrency,)
    long_out = 32
    long_prompt = max(16, plan.max_model_len - long_out - 16)  # near max_model_len; room for BOS/template
    heavy_out = max(64, min(plan.heavy_output_tokens, plan.max_model_len - plan.short_prompt_tokens - 16))
    return {
        "short_prompts": LoadShape("short_prompts", plan.short_prompt_tokens, plan.short_output_tokens, c, plan.requests),
        "long_prompts": LoadShape("long_prompts", long_prompt, long_out, c, plan.requests),
        "output_heavy": LoadShape("output_heavy", plan.short_prompt_tokens, heavy_out, c, plan.requests),
    }


def run_acceptance(env: AcceptanceEnv, plan: AcceptancePlan, on_stage: Callable[[StageResult], None] | None = None) -> list[StageResult]:
    """Run every stage in order; one stage's error is that stage's verdict, the rest still run."""
    shapes = stage_shapes(plan)
    runners: dict[str, Callable[[], StageResult]] = {
        "topology": lambda: topology_stage(env),
        "cold_load": lambda: cold_load_stage(env),
        "short_prompts": lambda: load_stage(env, plan, shapes["short_prompts"]),
        "long_prompts": lambda: load_stage(env, plan, shapes["long_prompts"]),
        "concurrency_sweep": lambda: sweep_stage(env, plan),
        "output_heavy": lambda: load_stage(env, plan, shapes["output_heavy"]),
        "failure": lambda: failure_stage(env, plan),
        "restart": lambda: restart_stage(env, plan),
    }
    results = []
    for name in STAGES:
        if name in plan.skip:
            res = StageResult(name, SKIPPED, "skipped (--skip)")
        else:
            t0 = env.clock()
            try:
                res = runners[name]()
            except OrchError as exc:
                res = StageResult(name, ERROR, f"{exc.message}" + (f" (hint: {exc.hint})" if exc.hint else ""), env.clock() - t0)
        results.append(res)
        if on_stage:
            on_stage(res)
    return results


def overall(results: Sequence[StageResult]) -> str:
    """pass when no stage failed or errored (skipped stages are listed, not failed)."""
    return FAIL if any(r.verdict in (FAIL, ERROR) for r in results) else PASS
