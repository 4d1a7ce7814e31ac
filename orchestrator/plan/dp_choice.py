"""Data parallel x expert parallel layouts for MoE models, and the choice between such a layout
and the TP x PP one. Pure.

A DP layout is a group of ``dp`` vLLM engines (DP ranks), each split by ``tp`` inside one node,
whose MoE layers run together over all ``dp x tp`` GPUs (``enable_expert_parallel``: each GPU holds
whole experts, EP size = DP x TP). Attention, dense layers, shared experts and embeddings are
in every DP rank (split by its TP); each rank has its own KV cache, so the group holds
``dp`` x a rank's tokens (``vllm/config/parallel.py``: ``data_parallel_size`` "MoE layers will be
sharded according to the product of the tensor, prefill-context, and data parallel sizes"). A
group larger than a node spans whole nodes (``data_parallel_size_local`` ranks on each, as
``vllm serve`` counts them); Ray Serve LLM's ``build_dp_openai_app`` places each rank as one
replica of a gang and counts groups as replicas.

The choice (when neither ``--dp`` nor ``--tp``/``--pp`` is forced):
- dense models: TP x PP only (vLLM: data parallelism is "not supported/useful for dense models";
  they scale by replicas);
- MoE with MLA: the DP x EP layout when it fits, because MLA's latent is cached whole on every TP
  rank (TP=8 keeps 8 copies of each token), while each DP rank caches its own tokens;
- other MoE (TP splits their KV heads): a DP x EP layout of the TP x PP replica's own GPUs when it
  holds more KV tokens (typically when TP goes past the KV heads, which caches each head TP / KV
  heads times); DP x EP whenever TP x PP does not fit.
Among DP layouts the one holding the most KV tokens over the cluster wins (for MLA any group size:
experts split over more GPUs leave more memory per GPU; for the others the TP x PP replica's
size), then the one with more groups (a rank failure restarts only its group), then the smaller TP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from orchestrator.errors import PlanError
from orchestrator.plan.capacity import PlanOptions
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.layout import (
    Candidate,
    evaluate,
    expert_parallel_for,
    fp8_block_hint,
    replicas_for,
    tp_problem,
    tp_refusal,
    valid_tps,
)
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape


def dp_problem(spec: ModelSpec, shape: ClusterShape, dp: int, tp: int) -> str | None:
    """Why a DP group of ``dp`` ranks of TP ``tp`` cannot be planned on ``shape``, or None."""
    if dp < 1:
        return f"DP must be at least 1, got {dp}"
    if dp > 1 and not spec.is_moe:
        return f"{spec.name} is a dense model: data parallelism is for MoE models (a dense model scales by replicas)"
    problem = tp_problem(spec, tp)
    if problem:
        return problem
    if shape.is_cpu:
        return None if tp == 1 and dp <= shape.nodes else f"a CPU cluster runs one rank per node: DP={dp} needs {dp} nodes and TP=1"
    if tp > shape.gpus_per_node:
        return f"TP={tp} of a DP rank exceeds the {shape.gpus_per_node} GPU(s) per node (a rank's TP stays inside a node)"
    group = dp * tp
    if spec.num_experts and group > spec.num_experts:
        return f"DP x TP = {group} GPUs exceeds the {spec.num_experts} experts: some GPUs would hold no expert"
    if group > shape.total_gpus:
        return f"DP x TP = {group} GPUs, but the cluster has {shape.total_gpus}"
    if group > shape.gpus_per_node and group % shape.gpus_per_node:
        return f"a DP group larger than a node takes whole nodes: DP x TP = {group} is not a multiple of {shape.gpus_per_node}"
    return None


def dp_layouts(spec: ModelSpec, shape: ClusterShape, options: PlanOptions) -> list[tuple[int, int]]:
    """(dp, tp) pairs to try: groups that divide a node or take whole nodes, TP inside a node."""
    if shape.is_cpu:
        return [(options.dp, 1)] if options.dp else []
    gpn = shape.gpus_per_node
    sizes = [g for g in range(2, gpn + 1) if gpn % g == 0] + [gpn * k for k in range(2, shape.nodes + 1)]
    tps = [options.tp] if options.tp else valid_tps(spec, gpn)
    out = []
    for group in sizes:
        for tp in tps:
            dp = group // tp
            if group % tp or dp < 2 or (options.dp and dp != options.dp):
                continue
            if dp_problem(spec, shape, dp, tp) is None and tp_refusal(spec, options, tp, dp) is None:
                out.append((dp, tp))
    return out


def cluster_tokens(shape: ClusterShape, cand: Candidate) -> int:
    """KV tokens over the whole cluster: every replica's."""
    return replicas_for(shape, cand.tp, cand.pp, cand.dp) * cand.kv_tokens if cand.fits else 0


def best_dp(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, group: int | None = None) -> tuple[Candidate | None, list[Candidate]]:
    """The DP x EP layout (of ``group`` GPUs when given) that holds the most KV tokens over the
    cluster (None when none fits), and every layout tried."""
    tried = []
    for dp, tp in dp_layouts(spec, shape, options):
        if group is not None and dp * tp != group:
            continue
        tried.append(evaluate(spec, shape, options, tp, 1, dp, expert_parallel_for(spec, options, dp)))
    fitting = [c for c in tried if c.fits]
    if not fitting:
        return None, tried
    best = max(fitting, key=lambda c: (cluster_tokens(shape, c), replicas_for(shape, c.tp, 1, c.dp), -c.tp))
    return best, tried


def prefer_dp(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, tp_pp: Candidate) -> tuple[Candidate | None, str]:
    """The DP x EP layout to use instead of ``tp_pp`` (None: keep TP x PP), and why (one sentence)."""
    if not tp_pp.fits:
        dp_ep, _ = best_dp(spec, shape, options)
        if dp_ep is None:
            return None, "no DP x EP layout fits either"
        return dp_ep, f"TP x PP does not fit; {dp_ep.name()} does"
    if spec.is_mla:
        dp_ep, _ = best_dp(spec, shape, options)
        if dp_ep is None:
            return None, "no DP x EP layout fits, so TP x PP"
        dp_total, tp_total = cluster_tokens(shape, dp_ep), cluster_tokens(shape, tp_pp)
        return dp_ep, (
            f"MoE with MLA: the latent is cached whole on every TP rank (TP={tp_pp.tp} keeps {tp_pp.tp} copies of each "
            f"token), while each DP rank caches its own tokens: {dp_ep.name()} holds {dp_total / tp_total:.1f}x the KV "
            f"tokens of {tp_pp.name()} over the cluster ({dp_total:,} against {tp_total:,})"
        )
    # Without MLA, TP splits the KV heads: compare DP x EP on the replica's own GPUs (the unit the
    # TP x PP choice sized), where attention kept whole in every rank has to pay for itself.
    dp_ep, _ = best_dp(spec, shape, options, group=tp_pp.gpus)
    copies = f"; TP={tp_pp.tp} past the {spec.kv_heads} KV heads caches each head {tp_pp.tp // spec.kv_heads} times" if tp_pp.tp > spec.kv_heads else ""
    tp_total = cluster_tokens(shape, tp_pp)
    if dp_ep is None:
        return None, f"no DP x EP layout of the {tp_pp.gpus} GPUs of a {tp_pp.name()} replica fits, so {tp_pp.name()}{copies}"
    if cluster_tokens(shape, dp_ep) <= tp_total:
        best = f" ({dp_ep.name()}: {cluster_tokens(shape, dp_ep):,})"
        return None, (
            f"{tp_pp.name()} holds at least as many KV tokens over the cluster ({tp_total:,}) as any DP x EP layout of its "
            f"{tp_pp.gpus} GPUs{best}, without the all-to-all traffic of expert parallelism{copies}"
        )
    dp_total = cluster_tokens(shape, dp_ep)
    return dp_ep, f"{dp_ep.name()} on the same {tp_pp.gpus} GPUs holds {dp_total / tp_total:.2f}x the KV tokens of {tp_pp.name()} ({dp_total:,} against {tp_total:,}){copies}"


def forced_dp(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, reasons: list[str]) -> Candidate:
    """--dp N (N > 1): groups of N ranks, each rank of --tp GPUs or of the smallest TP that fits."""
    assert options.dp is not None
    dp = options.dp
    tps = [options.tp] if options.tp else [t for t in valid_tps(spec, shape.gpus_per_node) if dp_problem(spec, shape, dp, t) is None]
    problem = dp_problem(spec, shape, dp, tps[0] if tps else 1)
    if problem or not tps:
        raise PlanError(problem or f"no TP size makes a DP group of {dp} ranks on {shape.describe()}",
                        hint="choose --dp so that DP x TP divides a node's GPUs or takes whole nodes, or leave --dp out")  # fmt: skip
    blocked = [tp_refusal(spec, options, tp, dp) for tp in tps]
    if all(blocked):
        raise PlanError(str(blocked[0]), hint=fp8_block_hint(spec))
    tps = [tp for tp, why in zip(tps, blocked, strict=True) if why is None]
    cands = [evaluate(spec, shape, options, tp, 1, dp) for tp in tps]
    found = next((c for c in cands if c.fits), cands[-1])
    how = f"TP={found.tp} per rank" + ("" if options.tp else " (the smallest TP that fits: the most groups)")
    reasons.append(f"forced DP={dp}, {how}: {found.summary()}")
    return found


def choose_layout(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, tp_pp: Candidate, reasons: list[str]) -> Candidate:
    """The automatic choice for an MoE model: ``tp_pp`` (the TP x PP choice) or the best DP x EP layout."""
    dp_ep, why = prefer_dp(spec, shape, options, tp_pp)
    reasons.append(f"layout: {why}")
    if dp_ep is None:
        return tp_pp
    reasons.append(f"DP x EP: {dp_ep.summary()}")
    groups = replicas_for(shape, dp_ep.tp, 1, dp_ep.dp)
    if groups == 1 and shape.nodes > 1:
        per_node, _ = best_dp(spec, shape, options, group=shape.gpus_per_node)
        alternative = (
            f"--dp {per_node.dp} --tp {per_node.tp} plans one group per node ({per_node.kv_tokens:,} KV tokens each)"
            if per_node
            else f"a group of one node ({shape.gpus_per_node} GPUs) does not fit"
        )
        reasons.append(f"one DP group spans all {dp_ep.gpus} GPUs: a failed rank restarts the whole group (gang); {alternative}")
    return dp_ep


def layout_json(shape: ClusterShape, cand: Candidate, chosen: bool) -> dict:
    """One layout's figures for the side-by-side table and ``--json``."""
    replicas = replicas_for(shape, cand.tp, cand.pp, cand.dp) if cand.fits else 0
    per_node = 1 if shape.is_cpu else min(cand.dp, shape.gpus_per_node // cand.tp)
    return {
        "layout": "dp_ep" if cand.dp > 1 else "tp_pp",
        "chosen": chosen,
        "tp": cand.tp,
        "pp": cand.pp,
        "dp": cand.dp,
        "expert_parallel": cand.expert_parallel,
        "ep_size": cand.tp * cand.dp if cand.expert_parallel else 1,
        "gpus_per_replica": cand.gpus,
        "dp_ranks_per_node": per_node if cand.dp > 1 else None,
        "nodes_per_replica": max(1, -(-cand.gpus // max(1, shape.gpus_per_node))) if not shape.is_cpu else cand.dp,
        "replicas": replicas,
        "fits": cand.fits,
        "weights_gib_per_gpu": round(max(s.weights_bytes for s in cand.stages) / GIB, 3),
        "kv_cache_gib_per_gpu": round(cand.tightest.kv_bytes / GIB, 3),
        "kv_cache_tokens_per_rank": cand.rank_kv_tokens,
        "kv_cache_tokens": cand.kv_tokens,
        "kv_cache_tokens_cluster": replicas * cand.kv_tokens,
        "max_concurrency": round(cand.kv_tokens / cand.max_model_len, 2),
        "max_concurrency_cluster": round(replicas * cand.kv_tokens / cand.max_model_len, 2),
        "summary": cand.summary(),
    }


def side_by_side(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, chosen: Candidate,
                 tp_choice: Callable[[], Candidate]) -> dict[str, dict]:  # fmt: skip
    """The chosen layout and, for an MoE model on GPUs, the other kind (TP x PP against DP x EP)."""
    kind = "dp_ep" if chosen.dp > 1 else "tp_pp"
    out = {kind: layout_json(shape, chosen, True)}
    if not spec.is_moe or shape.is_cpu:
        return out
    if kind == "dp_ep":
        other = tp_choice()
    else:
        auto = replace(options, dp=None, tp=None, pp=None)
        group = None if spec.is_mla else chosen.gpus  # the DP layout the choice weighed
        best, tried = best_dp(spec, shape, auto, group=group)
        if best is None and group is not None:
            best, tried = best_dp(spec, shape, auto)
        other = best or (max(tried, key=lambda c: c.tightest.kv_bytes) if tried else None)
    if other is not None:
        out["tp_pp" if kind == "dp_ep" else "dp_ep"] = layout_json(shape, other, False)
    return out
