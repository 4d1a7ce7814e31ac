"""The report folder of ``orch accept``: acceptance.json, acceptance.md and plots. Writes files;
the rendering functions are pure."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.accept.stages import PASS, AcceptancePlan, StageResult, overall
from orchestrator.bench.report import levels_table, plot_tradeoff
from orchestrator.runbooks import runbook

SCHEMA = "orch.accept/1"
RUNBOOK = runbook("acceptance")
_MARK = {"pass": "PASS", "fail": "**FAIL**", "error": "**ERROR**", "skipped": "skipped"}


def acceptance_dict(results: Sequence[StageResult], plan: AcceptancePlan, target: Mapping[str, Any], started_at: str | None) -> dict:
    return {
        "schema": SCHEMA,
        "started_at": started_at,
        "target": dict(target),
        "targets": {"ttft_p95_ms": plan.targets.ttft_p95_ms, "tpot_p95_ms": plan.targets.tpot_p95_ms,
                    "max_error_rate": plan.targets.max_error_rate},  # fmt: skip
        "verdict": overall(results),
        "stages": [r.to_dict() for r in results],
    }


def _sweep_levels(data: Mapping[str, Any]) -> list[dict]:
    for st in data["stages"]:
        if st["name"] == "concurrency_sweep":
            return list(st["details"].get("levels", []))
    return []


def render_markdown(data: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    t, tg = data["target"], data["targets"]
    lines = [
        f"# orch accept: {t.get('cluster')} ({t.get('model')})",
        "",
        f"**Verdict: {'PASS' if data['verdict'] == PASS else 'FAIL'}** - started {data.get('started_at') or '-'}; endpoint {t.get('url')}",
        "",
        f"Targets (cluster.yaml): TTFT p95 <= {tg['ttft_p95_ms'] or 'not set'} ms, TPOT p95 <= {tg['tpot_p95_ms'] or 'not set'} ms, "
        f"error rate <= {tg['max_error_rate']:.1%}. What to do when a stage fails: {RUNBOOK}.",
        "",
        "| stage | verdict | seconds | result |",
        "|---|---|---|---|",
    ]
    for st in data["stages"]:
        lines.append(f"| {st['name']} | {_MARK.get(st['verdict'], st['verdict'])} | {st['seconds']:.0f} | {st['summary']} |")
    for st in data["stages"]:
        lines += ["", f"## {st['name']}: {_MARK.get(st['verdict'], st['verdict'])}", "", st["summary"]]
        det = st.get("details") or {}
        if st["name"] == "topology" and det.get("nodes"):
            lines += ["", "| node | GPUs | NICs | collective env |", "|---|---|---|---|"]
            for name, n in det["nodes"].items():
                if n.get("error"):
                    lines.append(f"| {name} | unreachable: {n['error']} | | |")
                    continue
                gpus = ", ".join(sorted({g['name'] for g in n.get("gpus", [])})) or "none"
                nics = ", ".join(f"{x['name']} ({x['state']}, mtu {x['mtu']})" for x in n.get("nics", []))
                env = ", ".join(f"{k}={v}" for k, v in n.get("collective_env", {}).items()) or "-"
                lines.append(f"| {name} | {len(n.get('gpus', []))} x {gpus} | {nics} | {env} |")
        if det.get("bench"):
            lines += ["", *levels_table(det["bench"]["levels"])]
        if st["name"] == "concurrency_sweep" and det.get("levels"):
            lines += ["", *levels_table(det["levels"])]
        if st["name"] == "failure" and st.get("metrics"):
            m = st["metrics"]
            lines += ["", f"- killed: {m.get('killed')}", f"- health timeline (s after the kill, state): {det.get('health_timeline')}",
                      f"- traffic during the test: {det.get('traffic')}"]  # fmt: skip
    for p in plots:
        lines += ["", f"![{p}]({p})"]
    return "\n".join(lines) + "\n"


def write_acceptance_report(data: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "acceptance.json", "markdown": out_dir / "acceptance.md"}
    plots = []
    levels = _sweep_levels(data)
    if levels:
        paths["plot"] = plot_tradeoff(levels, out_dir / "sweep.png", title=f"concurrency sweep: {data['target'].get('model')}",
                                      targets=data["targets"])  # fmt: skip
        plots.append("sweep.png")
    paths["json"].write_text(json.dumps(data, indent=2, default=str) + "\n")
    paths["markdown"].write_text(render_markdown(data, plots))
    return paths
