"""The automatic TP x PP choice for a model on a cluster, and what would make a layout that does
not fit fit (more nodes, a smaller dtype, a shorter max_model_len, an fp8 KV cache). Pure.
``orchestrator.plan.planner`` calls them; the rules are in docs/planner.md ("The choice")."""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.plan.capacity import VLLM_BLOCK_SIZE, PlanOptions
from orchestrator.plan.catalog import DTYPE_BYTES, ModelSpec
from orchestrator.plan.layout import Candidate, evaluate, fill_nodes, idle_gpus, tp_problem, tp_refusal, valid_tps
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape


def first_fit(cands: list[Candidate]) -> Candidate | None:
    return next((c for c in cands if c.fits), None)


def choose_tp_pp(spec: ModelSpec, shape: ClusterShape, options: PlanOptions) -> tuple[Candidate, list[str]]:
    ev = lambda tp, pp: evaluate(spec, shape, options, tp, pp)  # noqa: E731
    reasons: list[str] = []
    one = ev(1, 1)
    if one.fits:
        reasons.append(f"fits one GPU, so {one.summary()}")
        return one, reasons
    reasons.append(f"one GPU is not enough at {one.summary()}")
    gpn, total = shape.gpus_per_node, shape.total_gpus

    if not shape.has_nvlink and gpn > 1:
        limit = min(total, spec.layers)
        cands = [ev(1, p) for p in range(2, limit + 1)]
        found = first_fit(cands)
        if found:
            found = fill_nodes(shape, [c for c in cands if c.fits], found, reasons)
            span = "inside one node" if found.pp <= gpn else f"across {math.ceil(found.pp / gpn)} nodes"
            reasons.append(
                f"the node has no NVLink, so pipeline parallelism {span} (layers split {list(s.layers for s in found.stages)}) "
                f"instead of tensor parallelism: {found.summary()}"
            )
            return found, reasons
        reasons.append(f"no NVLink and even PP={limit} does not fit: {cands[-1].summary() if cands else one.summary()}")

    tps = [t for t in valid_tps(spec, gpn) if t > 1]
    skipped = [t for t in range(2, gpn + 1) if t not in tps and gpn % t == 0]
    if skipped:
        reasons.append("TP sizes " + ", ".join(map(str, skipped)) + f" skipped: {tp_problem(spec, skipped[0])}")
    blocked = [t for t in tps if tp_refusal(spec, options, t)]
    if blocked:
        reasons.append("TP sizes " + ", ".join(map(str, blocked)) + f" skipped: {tp_refusal(spec, options, blocked[0])}")
        tps = [t for t in tps if t not in blocked]
    for i, t in enumerate(tps):
        cand = ev(t, 1)
        if cand.fits:
            reasons.append(f"fits one node with the smallest TP that divides the {spec.heads} attention heads, {cand.summary()}")
            if idle_gpus(shape, t, 1):
                cand = fill_nodes(shape, [c for c in (ev(u, 1) for u in tps[i + 1 :]) if c.fits], cand, reasons)
            return cand, reasons
        reasons.append(f"not enough at {cand.summary()}")

    tp = max(tps) if tps else 1
    if tp < gpn:
        reasons.append(f"TP={gpn} is not possible for this model, so TP={tp} per pipeline stage")
    cands = [ev(tp, p) for p in range(2, min(total // tp, spec.layers) + 1)]
    found = first_fit(cands)
    if found:
        nodes_used = math.ceil(found.tp * found.pp / gpn)
        reasons.append(
            f"does not fit one node: TP={tp} inside each node, PP={found.pp} across {nodes_used} node(s), "
            f"layers split {[s.layers for s in found.stages]}: {found.summary()}"
        )
        return found, reasons
    largest = cands[-1] if cands else ev(tp, 1)
    reasons.append(f"nothing fits on {shape.describe()}; the largest layout: {largest.summary()}")
    return largest, reasons


def fit_suggestions(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, best: Candidate) -> list[str]:
    """What would make it fit: more nodes, a smaller dtype, a shorter max_model_len."""
    out: list[str] = []
    length = best.max_model_len
    t = best.tightest
    if best.weights_fit:
        block = options.block_size or VLLM_BLOCK_SIZE
        need = math.ceil(options.min_concurrency * length / block) * block
        out.append(
            f"the KV cache holds {best.kv_tokens:,} tokens but one sequence of max_model_len needs {need:,}: "
            f"use --max-model-len {max(block, best.kv_tokens // block * block)} or less"
        )
    else:
        out.append(f"short by {-t.kv_bytes / GIB:.1f} GiB per GPU on the tightest stage")
    if not shape.is_cpu:
        tp = best.tp
        # From 0 more nodes: a forced layout that does not fit may fit with a larger PP on this
        # very cluster (the automatic choice has already tried every PP that fits here).
        for extra_nodes in range(65):
            bigger = replace(shape, nodes=shape.nodes + extra_nodes)
            pp_max = min(bigger.total_gpus // tp, spec.layers)
            fit = first_fit([evaluate(spec, bigger, options, tp, p) for p in range(max(2, best.pp), pp_max + 1)])
            if fit and not extra_nodes:
                out.append(f"TP={tp} PP={fit.pp} would fit it on this cluster")
                break
            if fit:
                out.append(f"{shape.nodes + extra_nodes} nodes of {shape.gpus_per_node} would fit it with TP={tp} PP={fit.pp}")
                break
        current = options.dtype or spec.dtype
        for dtype in ("fp8", "int8", "int4"):
            if DTYPE_BYTES[dtype] >= DTYPE_BYTES[current]:
                continue
            # plan_model checked every option but the dtype already, so the choice cannot refuse it
            cand, _ = choose_tp_pp(spec, shape, replace(options, dtype=dtype, tp=None, pp=None))
            if cand.fits:
                if dtype == "fp8" and spec.quantization is None:
                    out.append(f"--dtype fp8 (vLLM quantizes the linear layers on load) would fit with TP={cand.tp} PP={cand.pp}")
                else:
                    out.append(f"an {dtype} checkpoint of the model (AWQ, GPTQ, compressed-tensors) would fit with TP={cand.tp} PP={cand.pp}")
                break
        if options.kv_cache_dtype == "auto" and best.weights_fit:
            cand = evaluate(spec, shape, replace(options, kv_cache_dtype="fp8"), best.tp, best.pp)
            if cand.fits:
                out.append("--kv-cache-dtype fp8 would double the KV cache and fit")
    return out
