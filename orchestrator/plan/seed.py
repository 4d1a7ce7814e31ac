"""The memory formulas' tables for one model: weights at each dtype, KV cache at several (length, batch)
and B_max per GPU and per replica. Pure."""

from __future__ import annotations

from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.memory import GIB, b_max, count_params, kv_bytes_per_token, kv_dtype_bytes, weight_bytes
from orchestrator.plan.planner import ParallelPlan

SEED_LENGTHS = ((8192, 1), (8192, 16), (32768, 16))


def seed_tables(spec: ModelSpec, plan: ParallelPlan, gpu_bytes: float | None) -> dict:
    """The memory formulas' figures for this model: weights at each dtype, KV at several (L, B), B_max."""
    params = count_params(spec).total
    s_kv = kv_dtype_bytes(plan.dtype, plan.kv_cache_dtype)
    per_token = kv_bytes_per_token(spec, s=s_kv)
    if spec.layout is not None:
        # layers that cache a window, a chunk or one state: the bytes one token of a max_model_len
        # request takes over the model, as the plan's stages sized them (never every layer as full attention)
        per_token = sum(st.kv_bytes_per_token for st in plan.stages) * plan.tp
    lengths = list(SEED_LENGTHS) + ([(plan.max_model_len, 1)] if plan.max_model_len not in (8192, 32768) else [])
    out: dict = {
        "params": params,
        "kv_formula": kv_formula(spec, plan.max_model_len),
        "weights_gib": {d: round(weight_bytes(params, d) / GIB, 2) for d in ("bf16", "fp8", "int8", "int4")},
        "kv_bytes_per_token": per_token,
        "kv_cache_gib": [
            {"seq_len": L, "batch": B, "gib": round(per_token * L * B / GIB, 3), "gib_per_gpu": round(plan.kv_bytes_per_token_per_gpu * L * B / GIB, 3)}
            for L, B in lengths
        ],
    }
    if gpu_bytes:
        w = weight_bytes(params, plan.dtype)
        gpus = plan.gpus_per_replica  # TP x PP, or a DP group's DP x TP
        out["b_max"] = [
            {
                "seq_len": L,
                "b_max_one_gpu": b_max(gpu_bytes, w, per_token * L),
                "gpus": gpus,
                "b_max_replica": b_max(gpu_bytes * gpus, w, per_token * L),
            }
            for L in sorted({8192, plan.max_model_len})
        ]
    return out


def kv_formula(spec: ModelSpec, max_model_len: int) -> str:
    """How the KV bytes per token were counted, in the words that fit this model."""
    if spec.layout is not None:
        return (f"by layer type ({spec.layout.describe()}): the bytes one token of a {max_model_len:,}-token request "
                "takes, windows, chunks and states included (orchestrator.plan.kv_groups)")
    if spec.is_mla:
        return f"N_layer * (kv_lora_rank + qk_rope_head_dim) * s = {spec.layers} * ({spec.kv_lora_rank} + {spec.qk_rope_head_dim}) * s (MLA: one latent per layer)"
    return f"2 * N_layer * H_kv * d * s = 2 * {spec.layers} * {spec.kv_heads} * {spec.head_dim} * s"
