"""`orch rollout` and `orch rollback`: flags, live view, result. CLI only.

The work is done by ``orchestrator.workflows.rollout``; this module loads the manifest (the
CLUSTER_YAML argument, or the cluster recorded by `orch up` when there is exactly one), reads the
API key from the environment variable the manifest names (never printed), builds the real
dependencies and prints the decision, the plan, the rendered config (key redacted) or the result.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.output import console, print_json
from orchestrator.errors import StateError, UsageError


def load_cluster_manifest(cluster_yaml: Path | None, state_dir: Path):
    from orchestrator.manifest.load import load_manifest, load_manifest_file
    from orchestrator.state import StateStore

    if cluster_yaml is not None:
        return load_manifest_file(cluster_yaml)
    up = [c for c in StateStore(state_dir).list_clusters() if c.state == "up"]
    if len(up) != 1:
        names = ", ".join(c.name for c in up) or "none"
        raise UsageError(f"give CLUSTER_YAML: {len(up)} clusters are up ({names})", hint="orch rollout --model NAME cluster.yaml")
    rec = up[0]
    if rec.manifest_path and Path(rec.manifest_path).exists():
        return load_manifest_file(Path(rec.manifest_path))
    if rec.manifest_json:
        return load_manifest(rec.manifest_json, Path(rec.manifest_path or f"{rec.name}.yaml"))
    raise StateError(f"cluster {rec.name!r} has no manifest recorded", hint="pass CLUSTER_YAML")


def _deps(manifest: Any, state_dir: Path, progress):
    from orchestrator.cli.cluster import known_hosts_path
    from orchestrator.remote import open_runners
    from orchestrator.serve.validate import validate_app
    from orchestrator.state import StateStore
    from orchestrator.workflows.rollout import ServingDeps
    from orchestrator.workflows.rollout_setup import open_cluster_apis

    known_hosts = known_hosts_path(manifest, state_dir)
    return ServingDeps(
        state=StateStore(state_dir),
        open_runners=lambda m: open_runners(m, known_hosts),
        open_apis=open_cluster_apis,
        validate=validate_app,
        progress=progress,
    )


def _engine_args(values: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    import yaml

    out = []
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--engine-arg {item!r}: expected KEY=VALUE", hint="e.g. --engine-arg max_num_seqs=64")
        out.append((key.strip().replace("-", "_"), yaml.safe_load(raw)))
    return tuple(out)


def _print_result(result, as_json: bool, dry_run: bool) -> None:
    if as_json:
        print_json(result.to_dict())
        return
    out = console()
    d = result.decision
    if not dry_run:
        # The plan's warnings (e.g. an explicit TP that spans nodes) are said on every rollout.
        for line in [*result.plan.get("reasons", []), *result.plan.get("notes", [])]:
            if str(line).startswith("warning:"):
                console(stderr=True).print(line, markup=False, style="yellow")
    if result.action == "noop":
        out.print(f"nothing to do: {d['reason']}")
        return
    if dry_run:
        import yaml

        from orchestrator.serve.config import redact

        out.print(f"[bold]plan[/bold] for {result.model}: TP={result.plan.get('tp')} PP={result.plan.get('pp')} "
                  f"replicas={result.plan.get('replicas')} max_model_len={result.plan.get('max_model_len')}")  # fmt: skip
        for reason in [*result.plan.get("reasons", []), *result.plan.get("notes", [])]:
            out.print(f"  - {reason}", markup=False)
        out.print(f"[bold]decision[/bold]: {d['kind']}: {d['reason']}")
        out.print("[bold]rendered Serve application[/bold] (API key redacted):")
        click.echo(yaml.safe_dump(redact(result.config), sort_keys=False))
        return
    out.print(f"revision {result.revision} ready: {result.app_name} serves '{result.model}' ({d['kind']})")
    if result.cold_load_s is not None:
        out.print(f"cold load {result.cold_load_s:.1f} s from apply to the first completion"
                  + (f"; first token of the probe {result.first_token_s * 1000:.0f} ms" if result.first_token_s else ""))  # fmt: skip


@click.command("rollout")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--model", required=True, help="Catalog name (found in the manifest's model_store) or a model folder path on the nodes.")
@click.option("--served-name", default=None, help="Model name clients use [default: the catalog name or folder name].")
@click.option("--model-path", default=None, help="Folder of the weights on the nodes, when --model is a catalog name.")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Force the tensor-parallel size (checked by the planner).")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="Force the pipeline-parallel size (checked by the planner).")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None, help="Longest sequence [default: the model's].")
@click.option("--gpu-memory-utilization", type=click.FloatRange(min=0, max=1, min_open=True), default=None)
@click.option("--kv-cache-gib", type=click.FloatRange(min=0, min_open=True), default=None, help="Fix the KV cache per GPU.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8", "int8", "int4"]), default=None)
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True)
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Replicas [default: as many as the cluster holds].")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE", help="Extra vLLM engine argument (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the plan, the decision and the rendered config; change nothing.")
@click.option("--allow-downtime", is_flag=True, help="Replace the serving revision in place when there is no room for a second copy.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900.0, show_default=True, help="Seconds for the new revision to be RUNNING.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def rollout(ctx, cluster_yaml, model, served_name, model_path, tp, pp, max_model_len, gpu_memory_utilization, kv_cache_gib, dtype, kv_cache_dtype,
            replicas, engine_args, dry_run, allow_downtime, timeout_s, as_json) -> None:  # fmt: skip
    """Deploy MODEL as a Ray Serve LLM application, gated by a real completion.

    \b
    Examples:
      orch rollout --model tiny cluster-templates/local.yaml
      orch rollout --model llama3-405b cluster.yaml --dry-run
      orch rollout --model /models/my-llama --served-name my-llama --max-model-len 8192
    """
    from orchestrator.cli.cluster import progress_display
    from orchestrator.state import StateStore
    from orchestrator.workflows.cluster import planning_shape
    from orchestrator.workflows.rollout import RolloutOptions, execute
    from orchestrator.workflows.rollout_setup import RolloutRequest, desired_for_model

    state_dir = ctx.obj["state_dir"]
    manifest = load_cluster_manifest(cluster_yaml, state_dir)
    request = RolloutRequest(
        model=model, served_name=served_name, model_path=model_path, tp=tp, pp=pp, max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype, replicas=replicas, engine_args=_engine_args(engine_args),
    )  # fmt: skip
    options = RolloutOptions(dry_run=dry_run, allow_downtime=allow_downtime, timeout_s=timeout_s)
    api_key = os.environ.get(manifest.serve.api_key_env) or None
    with progress_display(enabled=not as_json) as progress:
        shape = planning_shape(manifest, StateStore(state_dir))
        result = execute(manifest, desired_for_model(manifest, request, shape=shape), api_key, _deps(manifest, state_dir, progress), options)
    _print_result(result, as_json, dry_run)


@click.command("rollback")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--to", "to", type=click.IntRange(min=1), default=None, help="Revision number [default: the one before the current].")
@click.option("--dry-run", is_flag=True, help="Print what would be deployed; change nothing.")
@click.option("--allow-downtime", is_flag=True, help="Replace in place when there is no room for a second copy.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=900.0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def rollback(ctx, cluster_yaml, to, dry_run, allow_downtime, timeout_s, as_json) -> None:
    """Return to an earlier revision (its recorded config, as a new revision).

    \b
    Examples:
      orch rollback            # the revision that served before the current one
      orch rollback --to 3 cluster.yaml
    """
    from orchestrator.cli.cluster import progress_display
    from orchestrator.state import StateStore
    from orchestrator.workflows.rollout import RolloutOptions, execute
    from orchestrator.workflows.rollout_setup import desired_for_revision

    state_dir = ctx.obj["state_dir"]
    manifest = load_cluster_manifest(cluster_yaml, state_dir)
    build = desired_for_revision(StateStore(state_dir), manifest.name, to)
    options = RolloutOptions(dry_run=dry_run, allow_downtime=allow_downtime, timeout_s=timeout_s)
    api_key = os.environ.get(manifest.serve.api_key_env) or None
    with progress_display(enabled=not as_json) as progress:
        result = execute(manifest, build, api_key, _deps(manifest, state_dir, progress), options)
    _print_result(result, as_json, dry_run)
