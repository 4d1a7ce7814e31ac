"""`orch rollout` and `orch rollback`: flags, live view, result. CLI only.

The work is done by ``orchestrator.workflows.rollout``; this module loads the manifest (the
CLUSTER_YAML argument, or the cluster recorded by `orch up` when there is exactly one), reads the
API key from the environment variable the manifest names (never printed), builds the real
dependencies and prints the decision, the plan, the rendered config (key redacted) or the result.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.feature_flags import feature_flags, feature_options
from orchestrator.cli.output import console, print_json
from orchestrator.cli.params import FiniteFloat, engine_flags
from orchestrator.cli.wiring import progress_display, resolve_manifest, rollout_deps


def _engine_args(values: tuple[str, ...]) -> tuple[tuple[str, Any], ...]:
    """--engine-arg KEY=VALUE, checked before anything slow: the syntax, the names orch sets, and
    the names Ray Serve LLM accepts (read from the installed sources, without importing them)."""
    from orchestrator.serve.engine_args import parse_engine_arg
    from orchestrator.serve.ray_io.engine_arg_names import check_engine_arg_names

    parsed = tuple(parse_engine_arg(item) for item in values)
    if parsed:
        check_engine_arg_names([key for key, _ in parsed])
    return parsed


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """`kill PID` stops a rollout the way Ctrl-C does: the previous revision is put back first."""

    def interrupt(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (an embedding caller): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_result(result, as_json: bool, dry_run: bool) -> None:
    if as_json:
        print_json(result.to_dict())
        return
    out = console()
    d = result.decision
    for note in getattr(result, "repaired", []):
        out.print(f"repaired: {note}", markup=False)
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

        from orchestrator.serve.in_flight import InFlight
        from orchestrator.workflows.secrets import for_display

        dp = int(result.plan.get("dp") or 1)
        layout = f"TP={result.plan.get('tp')} PP={result.plan.get('pp')}"
        if dp > 1:
            layout = f"DP={dp} x TP={result.plan.get('tp')}" + (" EP" if result.plan.get("expert_parallel") else "")
        groups = " (DP groups)" if dp > 1 else ""
        out.print(f"[bold]plan[/bold] for {result.model}: {layout} "
                  f"replicas={result.plan.get('replicas')}{groups} max_model_len={result.plan.get('max_model_len')}")  # fmt: skip
        if result.plan.get("in_flight"):
            out.print(f"  - in flight: {InFlight.from_json(result.plan['in_flight']).describe()}", markup=False)
        for reason in [*result.plan.get("reasons", []), *result.plan.get("notes", [])]:
            out.print(f"  - {reason}", markup=False)
        out.print(f"[bold]decision[/bold]: {d['kind']}: {d['reason']}")
        for note in d.get("notes") or []:
            out.print(f"  - {note}", markup=False)
        out.print("[bold]rendered Serve application[/bold] (API key redacted):")
        click.echo(yaml.safe_dump(for_display(result.config), sort_keys=False))
        return
    out.print(f"revision {result.revision} ready: {result.app_name} serves '{result.model}' ({d['kind']})")
    if result.cold_load_s is not None:
        what = {"scale": "replica count changed and answering", "adapters": "adapters loaded and answering"}.get(d["kind"], "cold load")
        out.print(f"{what} {result.cold_load_s:.1f} s from apply to the first completion"
                  + (f"; first token of the probe {result.first_token_s * 1000:.0f} ms" if result.first_token_s else ""))  # fmt: skip
    if getattr(result, "calibration_note", None):
        out.print(result.calibration_note, markup=False)
    gate = getattr(result, "slo_gate", None)
    if gate and gate.get("measured"):
        m = gate["measured"]
        out.print(f"SLO gate passed at concurrency {gate['plan']['concurrency']}: TTFT p95 {m['ttft_p95_ms'] or 0:.0f} ms, "
                  f"TPOT p95 {m['tpot_p95_ms'] or 0:.1f} ms, {m['req_per_s']:.2f} req/s (recorded against revision {result.revision})",
                  markup=False)  # fmt: skip


@click.command("rollout")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--model", required=True, help="Catalog name or folder name (both: <model_store>/<name> on the nodes), a Hugging Face repo id (org/name), or a model folder path on the nodes.")
@click.option("--served-name", default=None, help="Model name clients use [default: the catalog name or folder name].")
@click.option("--model-path", default=None, help="Folder of the weights on the nodes, when --model is a catalog name.")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Force the tensor-parallel size (checked by the planner).")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="Force the pipeline-parallel size (checked by the planner).")
@click.option("--dp", type=click.IntRange(min=1), default=None,
              help="Force the data-parallel size of a group (MoE models: each rank one engine, deployed with Ray Serve LLM's "
                   "build_dp_openai_app); 1: no DP.")
@click.option("--expert-parallel/--no-expert-parallel", "expert_parallel", default=None,
              help="Whole experts per GPU (vLLM enable_expert_parallel) [default: on for DP layouts of MoE models].")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None, help="Longest sequence [default: the model's].")
@click.option("--gpu-memory-utilization", type=FiniteFloat(min=0, max=1, min_open=True), default=None,
              help="vLLM's memory fraction per GPU [default: the vLLM version's: 0.92 from 0.21, 0.90 before].")  # fmt: skip
@click.option("--kv-cache-gib", type=FiniteFloat(min=0, min_open=True), default=None, help="Fix the KV cache per GPU.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8", "int8", "int4"]), default=None,
              help="Weight dtype (fp8: vLLM's fp8 quantization; int8/int4: a pre-quantized checkpoint) [default: the checkpoint's].")  # fmt: skip
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="vLLM kv_cache_dtype: auto keeps the model's dtype, fp8 halves the KV bytes per token.")  # fmt: skip
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Replicas [default: as many as the cluster holds]. A change of this alone adds or stops replicas; the serving ones keep running.")
@click.option("--max-ongoing-requests", type=click.IntRange(min=1), default=None,
              help="Requests one engine replica takes at once (Serve's max_ongoing_requests) [default: the manifest's serve.max_ongoing_requests, else the engine's max_num_seqs x 1.25].")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE", help="Extra vLLM engine argument (repeatable; not the ones that size memory, which have their own flags).")
@engine_flags
@feature_flags
@click.option("--lora", "loras", multiple=True, metavar="NAME=SOURCE",
              help="Serve a LoRA adapter on the model as NAME (the request's model field; repeatable): SOURCE is its folder on "
                   "the nodes (absolute; `orch model sync` places it) or s3://bucket/prefix (downloaded on each node; "
                   "AWS_ENDPOINT_URL_S3 in the manifest's env for a store other than AWS). Implies --enable-lora, one slot per adapter.")
@click.option("--dry-run", is_flag=True, help="Print the plan, the decision and the rendered config; change nothing.")
@click.option("--allow-downtime", is_flag=True, help="Replace the serving revision in place when there is no room for a second copy.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=1), default=900.0, show_default=True, help="Seconds for the new revision to be RUNNING.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--sync-model", is_flag=True, help="First copy the model to <model_store>/<name> on every node (`orch model sync`); without it nothing is copied.")
@click.option("--sync-from", default="local", show_default=True, help="With --sync-model: where the model is, local (this machine, same path) or a node name.")
@click.option("--request-router", type=click.Choice(["default", "session-affinity"]), default=None,
              help="How Serve picks a replica per request [default: the manifest's serve.request_router].")
@click.option("--slo-gate", is_flag=True, help="Before the switch, the candidate must meet the manifest's slo: at the load "
              "level recorded for the live revision (`orch bench`/`orch accept`); else the rollout fails and the live revision keeps serving.")
@click.pass_context
def rollout(ctx, cluster_yaml, model, served_name, model_path, tp, pp, dp, expert_parallel, max_model_len, gpu_memory_utilization, kv_cache_gib, dtype,
            kv_cache_dtype, replicas, max_ongoing_requests, engine_args, vllm_version, max_num_seqs, max_num_batched_tokens, enforce_eager, block_size,
            sampler, loras, dry_run, allow_downtime, timeout_s, as_json, sync_model, sync_from, request_router, slo_gate) -> None:  # fmt: skip
    """Deploy MODEL as a Ray Serve LLM application, gated by a real completion.

    \b
    Examples:
      orch rollout --model tiny cluster-templates/local.yaml
      orch rollout --model llama3-405b cluster.yaml --dry-run
      orch rollout --model /models/my-llama --served-name my-llama --max-model-len 8192
      orch rollout --model tiny --lora sql=/models/adapters/sql --lora chat=s3://bucket/adapters/chat
    """
    from orchestrator.serve.desired import RolloutRequest
    from orchestrator.serve.lora import parse_lora
    from orchestrator.state import StateStore
    from orchestrator.workflows.desired import desired_for_model
    from orchestrator.workflows.plan import planning_shape, recorded_goodput, sampler_for, vllm_version_for
    from orchestrator.workflows.rollout import RolloutOptions, execute

    adapters = tuple(parse_lora(value) for value in loras)  # bad input: exit 2 before anything slow
    state_dir = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, "rollout")
    version, _ = vllm_version_for(vllm_version, manifest, state_dir)
    flashinfer, _ = sampler_for(sampler, version, manifest, state_dir)
    lora, speculative = feature_options(ctx, len(adapters))
    request = RolloutRequest(
        model=model, served_name=served_name, model_path=model_path, tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype, replicas=replicas, engine_args=_engine_args(engine_args),
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, enforce_eager=enforce_eager,
        block_size=int(block_size) if block_size else None, vllm_version=version, flashinfer_sampler=flashinfer,
        request_router=request_router.replace("-", "_") if request_router else None,
        max_ongoing_requests=max_ongoing_requests, lora=lora, speculative=speculative, adapters=adapters,
    )  # fmt: skip
    options = RolloutOptions(dry_run=dry_run, allow_downtime=allow_downtime, timeout_s=timeout_s, slo_gate=slo_gate)
    api_key = os.environ.get(manifest.serve.api_key_env) or None
    if sync_model:
        _sync_first(manifest, state_dir, request, sync_from, dry_run, as_json)
    with progress_display(enabled=not as_json) as progress, _sigterm_as_interrupt():
        state = StateStore(state_dir)
        shape = planning_shape(manifest, state)
        progress(f"planning {model} on {shape.describe()}")
        desired = desired_for_model(manifest, request, shape=shape, capacity_for=lambda spec, tp, pp: recorded_goodput(manifest, state, spec, tp, pp),
                                    state=state)  # fmt: skip
        result = execute(manifest, desired, api_key, rollout_deps(manifest, state_dir, progress), options)
    _print_result(result, as_json, dry_run)


def _sync_first(manifest: Any, state_dir: Path, request: Any, source: str, dry_run: bool, as_json: bool) -> None:
    """`--sync-model`: the model's folder on the nodes must be <model_store>/<name>; it is synced
    (or, with --dry-run, what would be copied is printed) before anything is planned or deployed."""
    from orchestrator.cli.sync_display import SyncProgress, print_plan, print_summary
    from orchestrator.cli.wiring import model_sync_deps
    from orchestrator.errors import ModelSyncError
    from orchestrator.plan.tinymodel import build_tiny_model
    from orchestrator.serve.location import locate
    from orchestrator.workflows.model_sync import SyncOptions, check_rollout_target, sync_model

    location = locate(manifest, request.model, request.served_name, request.model_path)
    if location.build_demo is not None:  # the local demo's model, built where the manifest says models live
        build_tiny_model(location.build_demo)
    node_path = location.node_path
    check_rollout_target(manifest, node_path)
    deps = model_sync_deps(manifest, state_dir, False, SyncProgress(not as_json))
    result = sync_model(manifest, deps, SyncOptions(model=node_path, source=source, dry_run=dry_run))
    if not as_json:
        (print_plan if dry_run else print_summary)(result)
    if not result.ok:
        failed = ", ".join(n.node for n in result.nodes if not n.verified)
        raise ModelSyncError(f"model sync failed on {failed}; nothing was rolled out", hint="re-run: verified files are not sent again")


@click.command("rollback")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--to", "to", type=click.IntRange(min=1), default=None, help="Revision number [default: the one before the current].")
@click.option("--model", "served_name", default=None,
              help="The served name of the model to roll back [default: the only one served].")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print what would be deployed; change nothing.")
@click.option("--allow-downtime", is_flag=True, help="Replace in place when there is no room for a second copy.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=1), default=900.0, show_default=True,
              help="Seconds for the revision to be RUNNING (then it is rolled back).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def rollback(ctx, cluster_yaml, to, served_name, dry_run, allow_downtime, timeout_s, as_json) -> None:
    """Return a model to an earlier revision (its recorded config, as a new revision); the other
    models the cluster serves are not touched.

    \b
    Examples:
      orch rollback            # the revision that served before the current one
      orch rollback --model chat cluster.yaml
      orch rollback --to 3 cluster.yaml
    """
    from orchestrator.state import StateStore
    from orchestrator.workflows.desired import desired_for_revision
    from orchestrator.workflows.rollout import RolloutOptions, execute

    state_dir = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, "rollback")
    build = desired_for_revision(StateStore(state_dir), manifest.name, to, served_name)
    options = RolloutOptions(dry_run=dry_run, allow_downtime=allow_downtime, timeout_s=timeout_s, command="rollback")
    api_key = os.environ.get(manifest.serve.api_key_env) or None
    with progress_display(enabled=not as_json) as progress, _sigterm_as_interrupt():
        result = execute(manifest, build, api_key, rollout_deps(manifest, state_dir, progress), options)
    _print_result(result, as_json, dry_run)


@click.command("remove")
@click.argument("name")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--dry-run", is_flag=True, help="Print what would be removed; change nothing.")
@click.option("--timeout", "timeout_s", type=FiniteFloat(min=1), default=300.0, show_default=True,
              help="Seconds for Serve to delete the model's applications.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def remove(ctx, name, cluster_yaml, dry_run, timeout_s, as_json) -> None:
    """Stop serving the model NAME (its served name) and free what its replicas held; Ray stays up.

    \b
    Examples:
      orch remove tiny --dry-run
      orch remove llama3-405b cluster.yaml
    """
    from orchestrator.workflows.remove import RemoveOptions
    from orchestrator.workflows.remove import remove as remove_model

    state_dir = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, f"remove {name}")
    with progress_display(enabled=not as_json) as progress, _sigterm_as_interrupt():
        result = remove_model(manifest, name, rollout_deps(manifest, state_dir, progress), RemoveOptions(dry_run=dry_run, timeout_s=timeout_s))
    if as_json:
        print_json(result.to_dict())
        return
    out = console()
    apps = ", ".join(result.apps) or "no application (not in Serve)"
    if dry_run:
        out.print(f"would remove '{result.model}' (revision {result.revision}): {apps}; "
                  f"kept: {', '.join(result.kept) or 'no other application'}", markup=False)  # fmt: skip
        return
    out.print(f"removed '{result.model}' (revision {result.revision}): {apps} deleted in {result.seconds:.1f} s; "
              f"`orch rollback` brings it back", markup=False)  # fmt: skip
