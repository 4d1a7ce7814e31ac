"""``orch bench``: flags, progress bar, results table, exit codes.

bench: load against an OpenAI-compatible endpoint (the cluster's Serve endpoint from
CLUSTER_YAML, or --url), a concurrency sweep or Poisson arrivals at --rate, cross-checked with
vLLM's own Prometheus histograms. accept: seed 001's staged acceptance test (see
orchestrator/accept/stages.py); exit code 7 when a stage fails.
"""

from __future__ import annotations

import click

from orchestrator.cli.params import FiniteFloat, load_target_options
from orchestrator.cli.wiring import resolve_load_target
from orchestrator.errors import UsageError

_LEVEL_HELP = "Concurrency levels, e.g. 1,4,16,64 (a sweep: one level after another)."


def _levels(text: str) -> tuple[int, ...]:
    from orchestrator.bench.latency import parse_levels

    try:
        return tuple(parse_levels(text))
    except ValueError as exc:
        raise UsageError(f"--concurrency: {exc}", hint="give positive integers separated by commas, e.g. 1,4,16") from exc


def _progress_runner(opts, json_mode: bool):
    """Run the bench under a rich progress bar (stderr), one task per level."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from orchestrator.bench.session import run_bench
    from orchestrator.cli.output import console

    labels = [f"rate={opts.rate:g}/s"] if opts.rate else [f"concurrency={c}" for c in opts.concurrency]
    with Progress(
        TextColumn("{task.description:>16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console(stderr=True),
        transient=json_mode,
    ) as progress:
        tasks = {label: progress.add_task(label, total=opts.requests, errors=0) for label in labels}
        errors = dict.fromkeys(labels, 0)

        def on_record(label, rec):
            if label not in tasks:
                return
            if not rec.ok:
                errors[label] += 1
            progress.update(tasks[label], advance=1, errors=errors[label])

        return run_bench(opts, on_record=on_record)


def print_results(result: dict) -> None:
    from rich.table import Table

    from orchestrator.cli.output import console

    def f(v, d=1):
        return "-" if v is None else f"{v:,.{d}f}"

    table = Table(title=f"{result['target']['model']} @ {result['target']['url']} (ms)")
    for col in ("level", "ok/sent", "errors", "tok/s", "req/s", "TTFT p50", "TTFT p95", "TTFT p99", "TPOT p50", "TPOT p95", "TPOT p99", "ITL p95"):
        table.add_column(col, justify="right" if col not in ("level", "errors") else "left")
    for lv in result["levels"]:
        t, p = lv["ttft_ms"], lv["tpot_ms"]
        errs = ", ".join(f"{k} {v}" for k, v in lv["errors"].items()) or "0"
        table.add_row(
            lv["label"], f"{lv['succeeded']}/{lv['requests']}", errs, f(lv["output_tok_per_s"]), f(lv["req_per_s"], 2),
            f(t["p50"]), f(t["p95"]), f(t["p99"]), f(p["p50"], 2), f(p["p95"], 2), f(p["p99"], 2), f(lv["itl_ms"]["p95"], 2),
        )
    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 150)  # piped or captured: keep the table's columns whole
    out.print(table)
    whole = result.get("crosscheck")
    if whole:
        for fig, c in whole.items():
            if c["agrees"] is None:
                out.print(f"cross-check {fig.upper()}: vLLM recorded nothing for this run")
                continue
            estimated = " (vLLM's from bucket midpoints, Ray's export)" if c.get("server_mean_estimated") else ""
            out.print(
                f"cross-check {fig.upper()}: vLLM median {f(c['server_median_ms'], 2)} ms, orch {f(c['client_median_binned_ms'], 2)} ms "
                f"({c['median_diff'] * 100:+.1f}%) -> medians {'agree' if c['agrees'] else 'DIFFER'} within 10%; "
                f"mean vLLM {f(c['server_mean_ms'], 2)}, orch {f(c['client_mean_ms'], 2)} ({c['mean_diff'] * 100:+.1f}%){estimated}"
            )
    else:
        out.print("cross-check: no metrics page (give --metrics-url)")
    if result.get("goodput") is not None:
        from orchestrator.bench.report import goodput_text

        out.print(goodput_text(result["goodput"]), markup=False)


@click.command("bench")
@load_target_options
@click.option("--concurrency", default="1,4,16", show_default=True, help=_LEVEL_HELP)
@click.option("--rate", type=FiniteFloat(), help="Requests per second with Poisson arrivals (instead of --concurrency).")
@click.option("--requests", type=click.IntRange(min=1), default=32, show_default=True, help="Requests per level.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--output-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Unmeasured requests first.")
@click.option("--stream-interval", type=click.IntRange(min=1), help="vLLM: tokens per streamed chunk (first and last chunk still at once).")
@click.option("--workload", type=click.Choice(["random", "shared-prefix"]), default="random", show_default=True,
              help="random: every prompt different; shared-prefix: --prefixes system prompts of --prefix-tokens, each "
                   "followed by --prompt-tokens user turns, shuffled.")
@click.option("--prefixes", type=click.IntRange(min=1), default=8, show_default=True, help="shared-prefix: system prompts.")
@click.option("--prefix-tokens", type=click.IntRange(min=1), default=1024, show_default=True, help="shared-prefix: tokens per system prompt.")
@click.pass_context
def bench(ctx, cluster_yaml, url, model, api_key_env, metrics_url, tokenizer, chat, seed, timeout_s, json_mode, out,
          concurrency, rate, requests, prompt_tokens, output_tokens, warmup, stream_interval, workload, prefixes, prefix_tokens):
    """Measure TTFT, TPOT and throughput against an OpenAI-compatible endpoint."""
    from orchestrator.bench.session import BenchOptions
    from orchestrator.cli.output import console, print_json

    if rate is not None and rate <= 0:
        raise UsageError("--rate must be > 0", hint="e.g. --rate 4")
    target = resolve_load_target(ctx.obj["state_dir"], cluster_yaml, url, model, api_key_env, metrics_url)
    opts = BenchOptions(
        base_url=target["url"], model=target["model"], concurrency=_levels(concurrency), rate=rate, requests=requests,
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, endpoint="chat" if chat else "completions",
        tokenizer=tokenizer, api_key=target["api_key"], metrics_urls=target["metrics"], seed=seed, warmup=warmup,
        timeout_s=timeout_s, stream_interval=stream_interval, settle_timeout_s=target["settle_s"],
        workload=workload.replace("-", "_"), prefixes=prefixes, prefix_tokens=prefix_tokens,
    )
    result, runs = _progress_runner(opts, json_mode)
    if target["manifest"] is not None and url is None:
        import time

        from orchestrator.state import StateStore
        from orchestrator.workflows.load_record import record_bench

        result["goodput"] = record_bench(StateStore(ctx.obj["state_dir"]), target["manifest"], result, runs, "orch bench", time.time())
    if out is not None:
        from orchestrator.bench.report import write_bench_report

        paths = write_bench_report(result, out, targets=target["targets"])
        result["files"] = {k: str(v) for k, v in paths.items()}
    if json_mode:
        print_json(result)
    else:
        print_results(result)
        if out is not None:
            console().print(f"report: {result['files']['markdown']}  plot: {result['files']['plot']}")
