"""What `orch bench`, `orch accept` and the SLO gate measured, recorded against a revision. Does
I/O: the state store (the revision's meta file ``revisions/<n>.json``, key ``load``).

A record holds the run's shape (prompt and output tokens, workload: what the SLO gate replays),
every load level's figures (``bench.goodput.LoadLevel``), the replicas that served it, the
objective it was judged by and the goodput found (``bench.goodput.goodput``). Readers judge the
stored levels again by the objective they hold now (``goodput_of``), so a changed ``slo:`` does
not leave a stale figure behind. The latest run replaces the previous record of that revision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator import engine_metrics as prom
from orchestrator.bench.goodput import Goodput, LoadLevel, Objective, goodput, replicas_that_served
from orchestrator.serve.shapes import effective_app, llm_configs
from orchestrator.state import Revision, StateStore

LOAD_KEY = "load"


def configured_replicas(config: Mapping[str, Any]) -> int | None:
    """The fixed replica count of a stored Serve config; None when it autoscales (or says none)."""
    llm = (((effective_app(config or {})).get("args") or {}).get("llm_configs") or [{}])[0]
    replicas = (llm.get("deployment_config") or {}).get("num_replicas")
    return replicas if isinstance(replicas, int) and replicas >= 1 else None


def candidate_replicas(app: Mapping[str, Any]) -> int:
    """The replicas a rendered application starts with (fixed, or its autoscaling minimum)."""
    fixed = configured_replicas(app)
    if fixed is not None:
        return fixed
    llm = (llm_configs(app) or [{}])[0]
    return int(((llm.get("deployment_config") or {}).get("autoscaling_config") or {}).get("min_replicas") or 1)


def objective_dict(objective: Objective | None) -> dict[str, Any] | None:
    if objective is None:
        return None
    return {"ttft_p95_ms": objective.ttft_p95_ms, "tpot_p95_ms": objective.tpot_p95_ms, "max_error_rate": objective.max_error_rate}


def levels_of(result: Mapping[str, Any]) -> list[LoadLevel]:
    """The levels of a bench results dict (``bench.report.bench_result``)."""
    config = result.get("config") or {}
    return [LoadLevel.from_level(lv, config.get("prompt_tokens"), config.get("output_tokens")) for lv in result.get("levels") or []]


def shape_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """What the SLO gate needs to send the same kind of requests again."""
    config = result.get("config") or {}
    keys = ("prompt_tokens", "output_tokens", "workload", "prefixes", "prefix_tokens")
    return {k: config[k] for k in keys if config.get(k) is not None} | {"endpoint": (result.get("target") or {}).get("endpoint", "completions")}


def record_load(state: StateStore, revision: Revision, levels: Sequence[LoadLevel], shape: Mapping[str, Any], replicas: int,
                objective: Objective | None, source: str, at: float) -> dict[str, Any]:  # fmt: skip
    """Record a run against ``revision`` (replacing its previous record); returns the record."""
    found = goodput(levels, objective, replicas) if objective is not None else None
    entry = {
        "source": source,
        "at": at,
        "replicas": replicas,
        "shape": dict(shape),
        "objective": objective_dict(objective),
        "levels": [lv.to_dict() for lv in levels],
        "goodput": found.to_dict() if found else None,
    }
    meta = state.revision_meta(revision.cluster, revision.number) or {}
    meta[LOAD_KEY] = entry
    state.save_revision_meta(revision.cluster, revision.number, meta)
    return entry


def recorded_load(state: StateStore, cluster: str, number: int) -> dict[str, Any] | None:
    entry = (state.revision_meta(cluster, number) or {}).get(LOAD_KEY)
    return entry if isinstance(entry, dict) and entry.get("levels") else None


def goodput_of(entry: Mapping[str, Any], objective: Objective) -> Goodput | None:
    """The goodput of a record judged by ``objective`` (the one the manifest holds now)."""
    levels = [LoadLevel.from_dict(lv) for lv in entry.get("levels") or []]
    return goodput(levels, objective, int(entry.get("replicas") or 1))


def record_bench(state: StateStore, manifest: Any, result: Mapping[str, Any], runs: Sequence[Any], source: str, at: float) -> dict[str, Any]:
    """`orch bench`/`orch accept` against a cluster's endpoint: the goodput of the run by the
    manifest's objective, recorded against the revision serving now (when one is). ``runs``: the
    bench's raw level runs, whose metrics pages count the replicas that served when the revision
    autoscales. Returns what the report shows under ``goodput``."""
    from_metrics = None
    if runs and runs[0].metrics_before is not None and runs[-1].metrics_after is not None:
        from_metrics = replicas_that_served(prom.parse_text(runs[0].metrics_before), prom.parse_text(runs[-1].metrics_after),
                                            (result.get("target") or {}).get("model"))  # fmt: skip
    revision = state.current_revision(manifest.name)
    replicas = (configured_replicas(revision.config) if revision is not None else None) or from_metrics or 1
    objective = manifest.objective
    levels, shape = levels_of(result), shape_of(result)
    out: dict[str, Any] = {"objective": objective_dict(objective), "replicas": replicas, "revision": None, "goodput": None}
    if revision is not None:
        entry = record_load(state, revision, levels, shape, replicas, objective, source, at)
        out.update(revision=revision.number, goodput=entry["goodput"])
    elif objective is not None:
        found = goodput(levels, objective, replicas)
        out["goodput"] = found.to_dict() if found else None
    return out


def record_sweep(state: StateStore, revision: Revision, results: Sequence[Any], plan: Any, endpoint: str, at: float) -> int | None:
    """`orch accept`: record its concurrency sweep's levels against ``revision`` (judged by the
    plan's targets); the revision's number, or None when the sweep did not run."""
    sweep = next((r for r in results if r.name == "concurrency_sweep" and r.details.get("levels")), None)
    if sweep is None:
        return None
    levels = [LoadLevel.from_level(lv, plan.short_prompt_tokens, plan.short_output_tokens) for lv in sweep.details["levels"]]
    shape = {"prompt_tokens": plan.short_prompt_tokens, "output_tokens": plan.short_output_tokens, "workload": "random", "endpoint": endpoint}
    record_load(state, revision, levels, shape, plan.replicas, plan.targets, "orch accept", at)
    return revision.number
