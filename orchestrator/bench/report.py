"""Benchmark results as data, markdown and a plot. Writes files (``write_bench_report``); the
rest is pure. matplotlib is imported lazily with the Agg backend (no display).

``results.json`` schema (``orch.bench/1``): target, config, percentile_method, levels[] (one per
concurrency or rate: counts, errors by kind, throughput, ttft/tpot/itl/e2e distributions in ms,
and the cross-check against vLLM's own metrics when it was scraped), crosscheck (the whole run).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.bench.crosscheck import FigureCheck
from orchestrator.bench.goodput import Goodput
from orchestrator.bench.latency import PERCENTILE_METHOD, LevelStats

SCHEMA = "orch.bench/1"


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def check_dict(checks: Mapping[str, FigureCheck] | None) -> dict | None:
    if not checks:
        return None
    out = {}
    for fig, c in checks.items():
        out[fig] = {
            "server_count": c.server_count,
            "client_count": c.client_count,
            "server_mean_ms": _ms(c.server_mean),
            "client_mean_ms": _ms(c.client_mean),
            "server_median_ms": _ms(c.server_median),
            "client_median_binned_ms": _ms(c.client_median_binned),
            "client_median_exact_ms": _ms(c.client_median_exact),
            "mean_diff": c.mean_diff,
            "median_diff": c.median_diff,
            "agrees": c.agrees,
            "server_mean_estimated": c.server_mean_estimated,
        }
    return out


def level_dict(stats: LevelStats, checks: Mapping[str, FigureCheck] | None = None) -> dict:
    return {
        "label": stats.label,
        "concurrency": stats.concurrency,
        "rate": stats.rate,
        "requests": stats.requests,
        "succeeded": stats.succeeded,
        "failed": stats.failed,
        "errors": stats.errors,
        "error_samples": list(stats.error_samples),
        "error_rate": stats.error_rate,
        "duration_s": stats.duration_s,
        "output_tokens": stats.output_tokens,
        "prompt_tokens": stats.prompt_tokens,
        "output_tok_per_s": stats.output_tok_per_s,
        "req_per_s": stats.req_per_s,
        "ttft_ms": stats.ttft.as_ms(),
        "tpot_ms": stats.tpot.as_ms(),
        "itl_ms": stats.itl.as_ms(),
        "e2e_ms": stats.e2e.as_ms(),
        "headers_ms": stats.headers.as_ms(),
        "server_ttft_ms": stats.server_ttft.as_ms(),
        "crosscheck": check_dict(checks),
    }


def bench_result(
    target: Mapping[str, Any],
    config: Mapping[str, Any],
    levels: Sequence[dict],
    crosscheck: Mapping[str, FigureCheck] | None = None,
    started_at: str | None = None,
) -> dict:
    return {
        "schema": SCHEMA,
        "started_at": started_at,
        "target": dict(target),
        "config": dict(config),
        "percentile_method": PERCENTILE_METHOD,
        "levels": list(levels),
        "crosscheck": check_dict(crosscheck),
    }


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def levels_table(levels: Sequence[dict]) -> list[str]:
    lines = [
        "| level | ok/sent | errors | out tok/s | req/s | TTFT p50 | TTFT p95 | TTFT p99 | TPOT p50 | TPOT p95 | TPOT p99 | ITL p95 | e2e p95 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        errs = ", ".join(f"{k} {v}" for k, v in lv["errors"].items()) or "0"
        t, p, i, e = lv["ttft_ms"], lv["tpot_ms"], lv["itl_ms"], lv["e2e_ms"]
        lines.append(
            f"| {lv['label']} | {lv['succeeded']}/{lv['requests']} | {errs} | {_f(lv['output_tok_per_s'])} | "
            f"{_f(lv['req_per_s'], 2)} | {_f(t['p50'])} | {_f(t['p95'])} | {_f(t['p99'])} | {_f(p['p50'], 2)} | "
            f"{_f(p['p95'], 2)} | {_f(p['p99'], 2)} | {_f(i['p95'], 2)} | {_f(e['p95'])} |"
        )
    return lines


def crosscheck_table(rows: Sequence[tuple[str, dict | None]]) -> list[str]:
    lines = [
        "| level | figure | vLLM mean | orch mean | diff | vLLM median | orch median (same buckets) | diff | orch median (exact) | medians agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, checks in rows:
        if not checks:
            continue
        for fig, c in checks.items():
            agrees = {True: "yes", False: "**no**", None: "no data"}[c["agrees"]]
            lines.append(
                f"| {label} | {fig.upper()} | {_f(c['server_mean_ms'], 2)}{'*' if c.get('server_mean_estimated') else ''} | "
                f"{_f(c['client_mean_ms'], 2)} | {_pct(c['mean_diff'])} | "
                f"{_f(c['server_median_ms'], 2)} | {_f(c['client_median_binned_ms'], 2)} | {_pct(c['median_diff'])} | "
                f"{_f(c['client_median_exact_ms'], 2)} | {agrees} |"
            )
    return lines


def goodput_text(info: Mapping[str, Any]) -> str:
    """What the run says one replica sustains with the manifest's objective met (one line)."""
    where = f"; recorded against revision {info['revision']}" if info.get("revision") is not None else ""
    if info.get("objective") is None:
        return "goodput: the manifest sets no slo: (or targets:) to judge the levels by" + where
    if info.get("goodput") is None:
        return "goodput: no level met the objective" + where
    return "goodput: " + Goodput.from_dict(info["goodput"]).describe() + where


def render_markdown(result: Mapping[str, Any], plot_name: str | None = "tradeoff.png") -> str:
    t, c = result["target"], result["config"]
    lines = [
        f"# orch bench: {t.get('model')} at {t.get('url')}",
        "",
        f"- started: {result.get('started_at') or '-'}; endpoint `{t.get('endpoint')}`",
        f"- prompt {c.get('prompt_tokens')} tokens ({c.get('prompt_source')}), output {c.get('output_tokens')} tokens "
        f"(ignore_eos), {c.get('requests')} requests per level",
        f"- percentiles: {result['percentile_method']}; times in ms",
        "- TTFT: request sent -> first output token; TPOT = (t_last_token - TTFT) / (N - 1); ITL: gap between token chunks",
        "",
        "## Results",
        "",
        *levels_table(result["levels"]),
    ]
    goodput = result.get("goodput")
    if goodput is not None:
        lines += ["", "## Goodput", "", goodput_text(goodput)]
    rows = [(lv["label"], lv.get("crosscheck")) for lv in result["levels"]]
    if result.get("crosscheck"):
        rows.append(("whole run", result["crosscheck"]))
    if any(r[1] for r in rows):
        lines += [
            "",
            "## Cross-check with vLLM's own metrics",
            "",
            "vLLM's figures are the deltas of `vllm:time_to_first_token_seconds` and "
            "`vllm:request_time_per_output_token_seconds` between scrapes around each level. Medians on both "
            "sides are read from vLLM's buckets with Prometheus' interpolation, and they give the verdict; "
            "orch's means are exact, vLLM's too on its own `/metrics` (marked * where Ray's export rebuilt the sum "
            "from bucket midpoints, under Ray Serve LLM: not a measurement). vLLM's TTFT starts when the request "
            "reaches the engine frontend (after HTTP parsing), orch's when it is sent.",
            "",
            *crosscheck_table(rows),
        ]
    if plot_name:
        lines += ["", "## Throughput against latency", "", f"![throughput vs latency]({plot_name})"]
    return "\n".join(lines) + "\n"


def plot_tradeoff(levels: Sequence[dict], path: Path, title: str = "", targets: Mapping[str, float | None] | None = None) -> Path:
    """Seed 000's trade-off figure: output throughput against TTFT p95 and TPOT p95, one point per
    level (labelled), p50 dashed beside p95. Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = targets or {}
    pts = [lv for lv in levels if lv["succeeded"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for ax, key, name, target in (
        (axes[0], "ttft_ms", "TTFT", targets.get("ttft_p95_ms")),
        (axes[1], "tpot_ms", "TPOT", targets.get("tpot_p95_ms")),
    ):
        xs = [lv["output_tok_per_s"] for lv in pts]
        p95 = [lv[key]["p95"] for lv in pts]
        p50 = [lv[key]["p50"] for lv in pts]
        ax.plot(xs, p95, "o-", color="tab:red", label=f"{name} p95")
        ax.plot(xs, p50, "s--", color="tab:blue", alpha=0.7, label=f"{name} p50")
        for lv, x, y in zip(pts, xs, p95):
            short = lv["label"].replace("concurrency=", "c=").replace("rate=", "")
            ax.annotate(short, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=8)
        if target:
            ax.axhline(target, color="gray", linestyle=":", label=f"target p95 {target:g} ms")
        ax.set_xlabel("output throughput (tokens/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"throughput vs {name}")
        ax.grid(True, alpha=0.3)
        top = max([y for y in p95 + [target or 0] if y is not None] or [1.0]) or 1.0
        ax.set_ylim(0, top * 1.25)  # room for the labels and the legend
        ax.set_xlim(0, (max(xs or [1.0]) or 1.0) * 1.15)
        ax.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def write_bench_report(result: Mapping[str, Any], out_dir: Path, targets: Mapping[str, float | None] | None = None) -> dict[str, Path]:
    """results.json, report.md and tradeoff.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "report.md", "plot": out_dir / "tradeoff.png"}
    paths["json"].write_text(json.dumps(result, indent=2, default=str) + "\n")
    t = result["target"]
    plot_tradeoff(result["levels"], paths["plot"], title=f"{t.get('model')} @ {t.get('url')}", targets=targets)
    paths["markdown"].write_text(render_markdown(result, paths["plot"].name))
    return paths
