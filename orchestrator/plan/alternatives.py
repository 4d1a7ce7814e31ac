"""The layouts a user would weigh against pipeline stages inside one node. Pure.

When the chosen layout runs pipeline stages inside one node (no NVLink between its GPUs, or a
context too long for tensor parallelism alone), two other ways to use the same GPUs are worth
seeing: more TP=1 replicas at the longest ``--max-model-len`` one GPU holds, and tensor
parallelism over the same GPUs across PCIe. Each comes with its KV tokens and concurrency, and the
plan says why it chose what it chose.

Why pipeline stages win without NVLink (vLLM's "Parallelism and Scaling" guide): tensor
parallelism all-reduces every layer's activations between all its GPUs, twice per layer, which on
PCIe costs more than it saves; pipeline parallelism sends one batch of hidden states per stage
boundary. What TP=1 replicas give up is context: each GPU must hold the whole model and its
sequence's KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.plan.capacity import VLLM_BLOCK_SIZE, PlanOptions
from orchestrator.plan.layout import Candidate, replicas_for
from orchestrator.plan.shape import ClusterShape

Evaluate = Callable[[int, int, PlanOptions], Candidate]


@dataclass(frozen=True)
class Alternative:
    """Another layout of the same GPUs: what it holds and what it costs."""

    label: str
    tp: int
    pp: int
    replicas: int
    max_model_len: int
    kv_cache_tokens: int
    max_concurrency: float
    fits: bool
    note: str

    def to_json(self) -> dict:
        return {
            "layout": self.label, "tp": self.tp, "pp": self.pp, "replicas": self.replicas,
            "max_model_len": self.max_model_len, "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 2), "fits": self.fits, "note": self.note,
        }  # fmt: skip

    def describe(self) -> str:
        if not self.fits:
            return f"alternative: {self.label}: does not fit ({self.note})"
        return (
            f"alternative: {self.label}: {self.replicas} replica(s), {self.kv_cache_tokens:,} KV tokens each, "
            f"{self.max_concurrency:.2f} x max_model_len {self.max_model_len:,} ({self.note})"
        )


def pp_inside_a_node(shape: ClusterShape, chosen: Candidate) -> bool:
    return not shape.is_cpu and chosen.pp > 1 and chosen.tp * chosen.pp <= shape.gpus_per_node


def alternatives(shape: ClusterShape, options: PlanOptions, chosen: Candidate, evaluate: Evaluate,
                 tp_valid: Callable[[int], bool]) -> tuple[Alternative, ...]:  # fmt: skip
    """TP=1 replicas at the longest context one GPU holds, and TP over PCIe on the chosen GPUs."""
    if not pp_inside_a_node(shape, chosen):
        return ()
    out: list[Alternative] = []
    block = options.block_size or VLLM_BLOCK_SIZE
    one = evaluate(1, 1, options)
    replicas_one = replicas_for(shape, 1, 1)
    if one.weights_fit and one.kv_tokens >= block:
        length = min(chosen.max_model_len, one.kv_tokens // block * block)
        shorter = evaluate(1, 1, replace(options, max_model_len=length))
        out.append(Alternative(
            f"TP=1 PP=1 at --max-model-len {length}", 1, 1, replicas_one, length, shorter.kv_tokens,
            shorter.kv_tokens / length, shorter.fits,
            f"{replicas_one} replicas instead of {replicas_for(shape, chosen.tp, chosen.pp)}, each sequence at most "
            f"{length:,} tokens instead of {chosen.max_model_len:,}",
        ))  # fmt: skip
    else:
        short = -one.tightest.kv_bytes / 2**30
        out.append(Alternative("TP=1 PP=1", 1, 1, 0, chosen.max_model_len, 0, 0.0, False,
                               f"one GPU is short by {short:.1f} GiB for the weights and reserve"))  # fmt: skip
    gpus = chosen.tp * chosen.pp
    if tp_valid(gpus):
        wide = evaluate(gpus, 1, options)
        length = chosen.max_model_len
        out.append(Alternative(
            f"TP={gpus} PP=1 over PCIe", gpus, 1, replicas_for(shape, gpus, 1) if wide.fits else 0, length, wide.kv_tokens,
            wide.kv_tokens / length, wide.fits,
            "every layer all-reduces across PCIe" + ("" if wide.fits else f": {wide.summary()}"),
        ))  # fmt: skip
    return tuple(out)


def why_chosen(shape: ClusterShape, chosen: Candidate, alts: tuple[Alternative, ...]) -> str | None:
    if not alts:
        return None
    link = "NVLink" if shape.has_nvlink else "PCIe"
    reasons = [f"chose TP={chosen.tp} PP={chosen.pp} inside one node: pipeline stages hand one batch of hidden states "
               f"to the next stage where TP all-reduces every layer over {link}"]  # fmt: skip
    for alt in alts:
        if alt.tp == 1 and alt.fits and alt.max_model_len < chosen.max_model_len:
            ratio = alt.max_model_len / chosen.max_model_len
            reasons.append(f"TP=1 replicas serve {math.floor(ratio * 100)}% of the context")
        elif alt.tp == 1 and not alt.fits:
            reasons.append("one GPU cannot hold the model")
    return "; ".join(reasons)
