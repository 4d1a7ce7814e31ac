"""``orch accept`` behind its flags: build the plan from the manifest and the current revision,
wire the cluster, print each stage as it ends, write the report folder, exit 7 on a failed stage."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import click

from orchestrator.cli.params import load_target_options
from orchestrator.cli.wiring import resolve_load_target
from orchestrator.errors import AcceptanceFailed, UsageError


def run_accept(ctx: click.Context, target: dict, *, tokenizer: Path | None, chat: bool, seed: int, timeout_s: float,
               json_mode: bool, out: Path | None, requests: int, max_concurrency: int, max_model_len: int | None,
               skip: tuple[str, ...]) -> None:  # fmt: skip
    from orchestrator.accept.report import RUNBOOK, acceptance_dict, write_acceptance_report
    from orchestrator.accept.stages import STAGES, AcceptancePlan, run_acceptance
    from orchestrator.bench.session import BenchOptions
    from orchestrator.cli.output import console, print_json
    from orchestrator.cli.wiring import known_hosts_path
    from orchestrator.errors import UsageError
    from orchestrator.manifest.sections import Targets
    from orchestrator.remote.connect import open_runners
    from orchestrator.serve.ray_io.client import open_serve_client
    from orchestrator.state import StateStore
    from orchestrator.workflows.accept import ClusterAcceptanceEnv, deployed_max_model_len, model_revision
    from orchestrator.workflows.load_record import configured_replicas, record_sweep

    unknown = [s for s in skip if s not in STAGES]
    if unknown:
        raise UsageError(f"--skip {', '.join(unknown)}: no such stage", hint="stages: " + ", ".join(STAGES))
    manifest = target["manifest"]
    state_dir = ctx.obj["state_dir"]
    state = StateStore(state_dir)
    targets = manifest.targets or manifest.slo or Targets()
    mml = max_model_len or deployed_max_model_len(state, manifest.name, target["model"]) or 1024
    current = model_revision(state, manifest.name, target["model"])
    replicas = (configured_replicas(current.config) if current is not None else None) or 1
    plan = AcceptancePlan(targets=targets, max_model_len=mml, requests=requests, max_concurrency=max_concurrency, skip=skip, replicas=replicas)
    bench = BenchOptions(
        base_url=target["url"], model=target["model"], tokenizer=tokenizer, api_key=target["api_key"],
        metrics_urls=target["metrics"], seed=seed, timeout_s=timeout_s, endpoint="chat" if chat else "completions", warmup=1,
        settle_timeout_s=target["settle_s"],
    )  # fmt: skip
    out_dir = out or Path(f"accept-{manifest.name}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    err = console(stderr=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")

    def on_stage(res) -> None:
        mark = {"pass": "[green]PASS[/]", "fail": "[red]FAIL[/]", "error": "[red]ERROR[/]", "skipped": "[yellow]skipped[/]"}[res.verdict]
        err.print(f"{mark} {res.name} ({res.seconds:.0f} s): {res.summary}")

    token = state.read_token(manifest.name)
    with open_runners(manifest, known_hosts_path(manifest, state_dir)) as runners:
        head = runners[manifest.head.name]
        with open_serve_client(head, manifest.ray.dashboard_port, token) as serve:
            env = ClusterAcceptanceEnv(manifest, state, runners, serve, bench)
            err.print(f"accepting {manifest.name}: {target['model']} at {target['url']} (max_model_len {mml}); report in {out_dir}")
            results = run_acceptance(env, plan, on_stage)
    data = acceptance_dict(results, plan, {"cluster": manifest.name, "model": target["model"], "url": target["url"]}, started)
    if current is not None:
        import time

        data["recorded_revision"] = record_sweep(state, current, results, plan, "chat" if chat else "completions", time.time())
    paths = write_acceptance_report(data, out_dir)
    data["files"] = {k: str(v) for k, v in paths.items()}
    if json_mode:
        print_json(data)
    else:
        console().print(f"verdict: {data['verdict'].upper()}  report: {paths['markdown']}")
    failed = [s["name"] for s in data["stages"] if s["verdict"] in ("fail", "error")]
    if failed:
        raise AcceptanceFailed(f"acceptance failed: {', '.join(failed)}", hint=f"read {paths['markdown']} and {RUNBOOK}")


@click.command("accept")
@load_target_options
@click.option("--requests", type=click.IntRange(min=1), default=16, show_default=True, help="Requests per load stage level.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=64, show_default=True, help="Upper end of the sweep.")
@click.option("--max-model-len", type=click.IntRange(min=16), help="Context length of the deployment (default: read from the revision).")
@click.option("--skip", multiple=True, help="Stage(s) to skip (reported as skipped), e.g. --skip restart.")
@click.pass_context
def accept(ctx, cluster_yaml, url, model, api_key_env, metrics_url, tokenizer, chat, seed, timeout_s, json_mode, out,
           requests, max_concurrency, max_model_len, skip):
    """Run the staged acceptance test on the running cluster (exit 7 when a stage fails)."""
    if cluster_yaml is None:
        raise UsageError("orch accept needs CLUSTER_YAML", hint="orch accept cluster.yaml --out accept-report")
    target = resolve_load_target(ctx.obj["state_dir"], cluster_yaml, url, model, api_key_env, metrics_url)
    run_accept(
        ctx, target, tokenizer=tokenizer, chat=chat, seed=seed, timeout_s=timeout_s, json_mode=json_mode, out=out,
        requests=requests, max_concurrency=max_concurrency, max_model_len=max_model_len, skip=tuple(skip),
    )
