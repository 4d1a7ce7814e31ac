"""`orch plan`: memory math and the TP/PP choice for a model on a cluster shape.

Reads a model's config.json (or a catalog entry) and, with --cluster, cluster.yaml; prints.
Everything else is the pure planner (orchestrator.plan.planner, .capacity, .memory).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from orchestrator.cli.feature_flags import feature_flags, feature_options
from orchestrator.cli.output import console, print_json
from orchestrator.cli.params import FiniteFloat, engine_flags
from orchestrator.errors import PlanError, UsageError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import CATALOG, DTYPE_BYTES, ModelSpec
from orchestrator.plan.memory import KIB
from orchestrator.plan.model_ref import resolve_ref
from orchestrator.plan.planner import ParallelPlan
from orchestrator.plan.seed import seed_tables
from orchestrator.plan.shape import (
    CPU,
    DEFAULT_GPU_TYPE,
    DEFAULT_GPUS_PER_NODE,
    GPU_TYPES,
    ClusterShape,
    shape_from_flags,
    shape_from_manifest,
)
from orchestrator.serve.config import ServingPlan, serve_in_flight
from orchestrator.serve.desired import serve_defaults
from orchestrator.serve.in_flight import InFlight
from orchestrator.serve.location import stored_copy
from orchestrator.state import StateStore
from orchestrator.workflows.plan import planning_shape, sampler_for, size_model, vllm_version_for
from orchestrator.workflows.served_models import capacity, describe_capacity


@click.command("plan")
@click.option("--model", "model", required=True, help=f"Catalog name ({', '.join(CATALOG)}), a Hugging Face repo id (org/name: the local HF cache, else the Hub), a model folder, or a config.json.")
@click.option("--cluster", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Take the shape from this cluster.yaml (from the GPUs `orch up` probed when it is up).")
@click.option("--gpu-type", default=None, help=f"GPU type: {', '.join(GPU_TYPES)} or {CPU} [default {DEFAULT_GPU_TYPE}].")
@click.option("--gpu-memory-gib", type=FiniteFloat(min=0, min_open=True), default=None, help="Memory per GPU in GiB (CUDA's total), instead of the type's.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, help=f"GPUs per node [default {DEFAULT_GPUS_PER_NODE}].")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="Number of nodes [default 1].")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Force the tensor-parallel size (then checked).")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="Force the pipeline-parallel size (then checked).")
@click.option("--dp", type=click.IntRange(min=1), default=None,
              help="Force the data-parallel size of a group (MoE models: DP ranks x TP GPUs, experts over all of them); 1: no DP.")
@click.option("--expert-parallel/--no-expert-parallel", "expert_parallel", default=None,
              help="Whole experts per GPU (vLLM enable_expert_parallel) [default: on for DP layouts of MoE models].")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None, help="Longest sequence (prompt + output) [default: the model's].")
@click.option("--gpu-memory-utilization", type=FiniteFloat(min=0, max=1, min_open=True), default=None, help="vLLM's memory fraction [default: the vLLM version's: 0.92 from 0.21, 0.90 before].")
@click.option("--kv-cache-gib", type=FiniteFloat(min=0, min_open=True), default=None, help="Fix the KV cache per GPU (vLLM kv_cache_memory_bytes) instead of estimating it.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp8", "int8", "int4"]), default=None, help="Weight dtype [default: the checkpoint's].")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True,
              help="vLLM kv_cache_dtype: auto keeps the model's dtype, fp8 halves the KV bytes per token.")  # fmt: skip
@click.option("--nvlink/--no-nvlink", default=None, help="Whether GPUs in a node share NVLink [default: the GPU type's usual board].")
@engine_flags
@feature_flags
@click.option("--target-rps", type=FiniteFloat(min=0, min_open=True), default=None,
              help="With --cluster: the request rate to serve [default: the manifest's slo.target_rps]; sized with the goodput recorded on the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (exit 2 when nothing fits, after printing it).")
@click.pass_context
def plan(ctx, model, cluster, gpu_type, gpu_memory_gib, gpus_per_node, nodes, tp, pp, dp, expert_parallel, max_model_len, gpu_memory_utilization, kv_cache_gib, dtype,
         kv_cache_dtype, nvlink, vllm_version, max_num_seqs, max_num_batched_tokens, enforce_eager, block_size, sampler, target_rps, as_json) -> None:  # fmt: skip
    """Size MODEL on a cluster: weights, KV cache, B_max, and the TP/PP choice with its reasons.

    \b
    Examples:
      orch plan --model llama3-70b --gpu-type H100-80GB --gpus-per-node 8
      orch plan --model llama3-405b --nodes 2 --json
      orch plan --model deepseek-v3 --gpu-type H200-141GB --nodes 2 --dp 8
      orch plan --model ./my-model --cluster cluster.yaml --max-model-len 8192
    """
    if gpu_type is not None and gpu_type.lower() == CPU and (tp or 1) * (pp or 1) > 1:
        raise UsageError("--tp/--pp do not apply to --gpu-type cpu (one replica per node)")
    if target_rps is not None and cluster is None:
        raise UsageError("--target-rps needs --cluster: the replicas are sized with the goodput recorded on that cluster")
    ref = resolve_ref(model)
    state_dir = ctx.obj.get("state_dir") if isinstance(ctx.obj, dict) else None
    manifest = load_manifest_file(cluster) if cluster is not None else None
    base = None
    if manifest is not None:  # when this manifest is up, the GPUs `orch up` probed; else what it declares
        base = planning_shape(manifest, StateStore(state_dir)) if state_dir is not None else shape_from_manifest(manifest)
    shape = shape_from_flags(base, gpu_type, gpu_memory_gib, gpus_per_node, nodes, nvlink)
    version, version_source = vllm_version_for(vllm_version, manifest, state_dir)
    flashinfer, sampler_source = sampler_for(sampler, version, manifest, state_dir)
    lora, speculative = feature_options(ctx)
    options = PlanOptions(
        tp=tp,
        pp=pp,
        dp=dp,
        expert_parallel=expert_parallel,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_gib=kv_cache_gib,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        vllm_version=version,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enforce_eager=enforce_eager,
        block_size=int(block_size) if block_size else None,
        flashinfer_sampler=flashinfer,
        lora=lora,
        speculative=speculative,
    )
    sampler_note = f"sampler: {'FlashInfer' if flashinfer else 'PyTorch/Triton'} ({sampler_source}); the rollout sets VLLM_USE_FLASHINFER_SAMPLER={int(flashinfer)}"
    shape = replace(shape, notes=(*shape.notes, f"vLLM {version}: {version_source}", *([] if shape.is_cpu else [sampler_note])))
    # the pipeline `orch rollout` uses too: the model_store's copy when readable here, the calibration record
    state = StateStore(state_dir) if manifest is not None and state_dir is not None else None
    sized = size_model(stored_copy(manifest, ref), shape, options, manifest, state)
    spec, result = sized.spec, sized.plan
    seed = seed_tables(spec, result, shape.gpu_memory_bytes)
    target = _target(manifest, state_dir, spec, shape, result, target_rps) if manifest is not None and result.fits else None
    requests = serve_in_flight(ServingPlan.from_parallel_plan(result), serve_defaults(manifest, None))
    held = capacity(manifest, state) if manifest is not None and state is not None else None
    if as_json:
        print_json({**result.to_json(), "shape": shape.describe(), "seed": seed, "in_flight": requests.to_json(),
                    **({"target": target} if target else {}), **({"capacity": held} if held else {})})
    else:
        _render(spec, shape, result, seed, requests)
        if target:
            console().print(f"[bold]Target[/bold]: {target['summary']}")
        if held:
            console().print(f"[bold]Capacity[/bold] (the models {manifest.name} serves): {describe_capacity(held)}")
    if not result.fits:
        # The plan (or its JSON, with "fits": false) is printed first; then exit 2, like any plan
        # vLLM would refuse, so a script cannot mistake "nothing fits" for a plan to deploy.
        raise PlanError(f"{spec.name} does not fit {shape.describe()}", hint="; ".join(result.suggestions) or None)
    if target and target.get("fits") is False:
        raise PlanError(f"the target needs {target['replicas']} replica(s) and the cluster holds {target['max_replicas']}",
                        hint="add GPUs (nodes), lower the target rate, or raise the per-replica goodput (a smaller TP, another engine setting)")  # fmt: skip


def _target(manifest, state_dir, spec: ModelSpec, shape: ClusterShape, result: ParallelPlan, target_rps: float | None) -> dict | None:
    """Replicas a target rate needs at the goodput recorded on the cluster, against its GPUs."""
    from orchestrator.serve.scaling import size_for_target
    from orchestrator.workflows.plan import recorded_goodput

    target = target_rps if target_rps is not None else (manifest.slo.target_rps if manifest.slo is not None else None)
    if target is None:
        return None
    if state_dir is None:
        return {"target_rps": target, "summary": "no state: the goodput a load run recorded is unknown"}
    capacity, note = recorded_goodput(manifest, StateStore(state_dir), spec, result.tp, result.pp)
    if capacity is None:
        return {"target_rps": target, "summary": f"{target:g} req/s: cannot size ({note})", "goodput_note": note}
    sizing = size_for_target(target, capacity, result.tp * result.pp, shape)
    return {"target_rps": target, "goodput": capacity.to_dict(), "goodput_note": note, **sizing.to_dict(), "summary": sizing.describe() + f" ({note})"}


def _render(spec: ModelSpec, shape: ClusterShape, p: ParallelPlan, seed: dict, requests: InFlight) -> None:
    from rich.table import Table

    out = console()
    kind = []
    if spec.is_moe:
        kind.append(f"MoE {spec.num_experts} experts, {spec.experts_per_token} active")
    if spec.is_mla:
        kind.append(f"MLA latent {spec.kv_lora_rank}+{spec.qk_rope_head_dim}")
    out.print(
        f"[bold]{spec.name}[/bold]: {p.params / 1e9:.2f}B parameters, {spec.layers} layers, {spec.heads} heads / {spec.kv_heads} KV heads "
        f"x {spec.head_dim}, vocab {spec.vocab:,}{', ' + '; '.join(kind) if kind else ''}. Checkpoint dtype {spec.dtype}."
    )
    if spec.quantization is not None:
        out.print(f"Quantization: {spec.quantization.describe()}", markup=False)
    out.print(f"Cluster: {shape.describe()}")

    weights = Table(title="Weights  M_w = Psi * s", title_justify="left")
    weights.add_column("dtype")
    weights.add_column("bytes/param", justify="right")
    weights.add_column("whole model", justify="right")
    split = f"TP={p.tp} PP={p.pp}" if p.dp == 1 else f"DP={p.dp} x TP={p.tp} (if every weight were split)"
    weights.add_column(f"per GPU at {split}", justify="right")
    for d, total in seed["weights_gib"].items():
        weights.add_row(d, f"{DTYPE_BYTES[d]:g}", f"{total:.1f} GiB", f"{total / p.gpus_per_replica:.1f} GiB")
    out.print(weights)

    out.print(f"KV cache: {seed['kv_bytes_per_token'] / KIB:,.1f} KiB per token = {seed['kv_formula']}", markup=False)
    if p.layer_types:
        out.print(f"Layer types: {p.layer_types} ({'; '.join(p.layer_sources)})", markup=False)
    kv = Table(title="KV cache  M_KV = per token * L * B", title_justify="left")
    for col in ("L", "B", "whole model", f"per GPU at TP={p.tp} PP={p.pp}"):
        kv.add_column(col, justify="right")
    for row in seed["kv_cache_gib"]:
        kv.add_row(f"{row['seq_len']:,}", str(row["batch"]), f"{row['gib']:.1f} GiB", f"{row['gib_per_gpu']:.1f} GiB")
    out.print(kv)
    if "b_max" in seed:
        rows = seed["b_max"]
        text = ", ".join(f"{r['b_max_one_gpu']} at L={r['seq_len']:,}" for r in rows)
        out.print(f"B_max = floor((M_GPU - M_w) / M_KV(L, 1)), one {shape.gpu_type}: {text}")
        if rows[0]["gpus"] > 1:
            text = ", ".join(f"{r['b_max_replica']} at L={r['seq_len']:,}" for r in rows)
            out.print(f"B_max on the replica's {rows[0]['gpus']} GPUs: {text}")
        out.print("  (upper bounds: no activations, no vLLM reserve, whole memory; the plan below is what vLLM would allocate)")

    table = Table(title="Plan (as vLLM would size it)", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("fits", "[green]yes[/green]" if p.fits else "[red]no[/red]"),
        ("tensor parallel", str(p.tp) + ("  (per DP rank)" if p.dp > 1 else "")),
        ("pipeline parallel", f"{p.pp}  (layers {list(p.stage_layers)})" if p.pp > 1 else "1"),
        *([("data parallel", f"{p.dp} ranks per replica, each its own engine and KV cache")] if p.dp > 1 else []),
        *([("expert parallel", f"EP={p.tp * p.dp}: whole experts on each GPU")] if p.expert_parallel else []),
        ("replicas", str(p.replicas) + ("  (DP groups)" if p.dp > 1 else "")),
        ("weights per GPU", f"{p.weights_gib_per_gpu:.2f} GiB" + (" (with the rows below)" if p.features else "")),
        *_feature_rows(p),
        ("reserve per GPU", f"{p.reserve_gib_per_gpu:.2f} GiB (activations, sampler, CUDA graphs, non-torch)"),
        ("KV cache per GPU", f"{p.kv_cache_gib_per_gpu:.2f} GiB{' (fixed)' if p.kv_cache_gib_fixed else ''}, {p.kv_bytes_per_token_per_gpu / KIB:,.1f} KiB per token"),
        ("KV cache size", f"{p.kv_cache_tokens:,} tokens per replica"
                          + (f" ({p.kv_cache_tokens_per_rank:,} per DP rank x {p.dp})" if p.dp > 1 else "")),
        ("max concurrency", f"{p.max_concurrency:.2f}x at max_model_len {p.max_model_len:,}"),
        ("gpu_memory_utilization", f"{p.gpu_memory_utilization:g}"),
        ("vLLM", f"{p.vllm_version} ({(p.engine_terms or {}).get('engine', '?')}); max_num_seqs {p.max_num_seqs}, max_num_batched_tokens {p.max_num_batched_tokens}"
                 + (", enforce_eager" if p.enforce_eager else "")),
        ("max_ongoing_requests", f"{requests.describe()}; Serve queues the rest"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    if p.fits and p.vllm_lines:
        lines, device = p.vllm_lines, "CPU" if p.gpu_type == "cpu" else "GPU"
        out.print(f"vLLM will print (one engine): {device} KV cache size: {lines['kv_cache_size_tokens']:,} tokens; "
                  f"Maximum concurrency for {lines['max_model_len']:,} tokens per request: {lines['max_concurrency']:.2f}x", markup=False)
    if p.layouts and len(p.layouts) > 1:
        _render_layouts(out, p)
    out.print("[bold]Why[/bold]")
    for reason in p.reasons:
        out.print(f"  - {reason}", markup=False)
    if p.suggestions:
        out.print("[bold]What would fit[/bold]")
        for s in p.suggestions:
            out.print(f"  - {s}", markup=False)


def _feature_rows(p: ParallelPlan) -> list[tuple[str, str]]:
    """The memory the LoRA slots and the speculative draft take (part of the weights vLLM loads)."""
    f = p.features or {}
    kwargs = f.get("engine_kwargs", {})
    rows = []
    if "enable_lora" in kwargs:
        rows.append(("  LoRA slots per GPU", f"{f['lora_gib_per_gpu']:.2f} GiB ({kwargs['max_loras']} x rank {kwargs['max_lora_rank']})"))
    if "speculative_config" in kwargs:
        sc = kwargs["speculative_config"]
        rows.append(("  draft per GPU", f"{f['draft_gib_per_gpu']:.2f} GiB weights + {f['draft_kv_bytes_per_token_per_gpu'] / KIB:,.1f} KiB "
                                        f"KV per token ({sc['method']}, {sc['num_speculative_tokens']} token(s))"))  # fmt: skip
    return rows


def _render_layouts(out, p: ParallelPlan) -> None:
    """TP x PP and DP x EP side by side (an MoE model), the chosen one marked."""
    from rich.table import Table

    table = Table(
        title=f"Layouts side by side (weights and KV per GPU; tokens and concurrency at {p.max_model_len:,} over the cluster)",
        title_justify="left",
    )
    for col in ("layout", "GPUs/replica", "replicas", "weights", "KV cache", "tokens/replica", "tokens", "concurrency", "chosen"):
        table.add_column(col, justify="right" if col not in ("layout", "chosen") else "left")
    for key in ("tp_pp", "dp_ep"):
        lay = p.layouts.get(key)
        if lay is None:
            continue
        name = f"DP={lay['dp']} x TP={lay['tp']}" + (f" EP={lay['ep_size']}" if lay["expert_parallel"] else "") if key == "dp_ep" else f"TP={lay['tp']} x PP={lay['pp']}"
        if not lay["fits"]:
            table.add_row(name, str(lay["gpus_per_replica"]), "-", f"{lay['weights_gib_per_gpu']:.1f} GiB", "does not fit", "-", "-", "-", "")
            continue
        table.add_row(
            name, str(lay["gpus_per_replica"]), str(lay["replicas"]), f"{lay['weights_gib_per_gpu']:.1f} GiB",
            f"{lay['kv_cache_gib_per_gpu']:.1f} GiB", f"{lay['kv_cache_tokens']:,}", f"{lay['kv_cache_tokens_cluster']:,}",
            f"{lay['max_concurrency_cluster']:.1f}", "yes" if lay["chosen"] else "",
        )  # fmt: skip
    out.print(table)
