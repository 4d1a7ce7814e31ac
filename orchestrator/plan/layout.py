"""Layouts: one (TP, PP) or (DP, TP) evaluated, how many replicas a cluster holds of it, and which
GPUs it leaves idle. Pure.

A replica is one vLLM deployment unit: TP x PP GPUs, or for data parallelism one DP group of
DP x TP GPUs (DP engines that run their MoE layers together; Ray Serve LLM's
``build_dp_openai_app`` counts those groups as replicas and restarts a group as a whole)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.capacity import PlanOptions, StageCapacity, stage_capacities
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.engine_terms import Version, parse_vllm_version, version_text
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape
from orchestrator.plan.sharding import Sharding, expert_split

# vLLM 0.32.0 refines block-FP8 expert scales to a finer block when the TP shard of an expert is
# not a whole number of checkpoint blocks (fused_moe/oracle/fp8.py refine_fp8_moe_block_shape: the
# gcd of both block sides, the shard and the hidden size, if >= 32). 0.32.0 is the first version
# orch has read with it; before that quantization/utils/fp8_utils.py
# validate_fp8_block_shape_moe refuses the layout at load ("The output_size of gate's and up's
# weight = 192 is not divisible by weight quantization block_n = 128.", vllm-project/vllm#48173).
FP8_MOE_BLOCK_REFINE: Version = (0, 32, 0)


@dataclass(frozen=True)
class Candidate:
    """One layout evaluated: its stages (per GPU of one DP rank) and whether vLLM would serve with it."""

    tp: int
    pp: int
    stages: tuple[StageCapacity, ...]
    max_model_len: int
    min_concurrency: float
    dp: int = 1
    expert_parallel: bool = False

    @property
    def tightest(self) -> StageCapacity:
        return min(self.stages, key=lambda s: (s.kv_tokens, s.kv_bytes))

    @property
    def rank_kv_tokens(self) -> int:
        """KV tokens of one engine (one DP rank): what vLLM logs as its ``KV cache size``."""
        return self.tightest.kv_tokens

    @property
    def kv_tokens(self) -> int:
        """KV tokens of one replica: every DP rank is its own engine with its own KV pool."""
        return self.rank_kv_tokens * self.dp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def weights_fit(self) -> bool:
        return all(s.kv_bytes > 0 for s in self.stages)

    @property
    def fits(self) -> bool:
        # vLLM checks each engine: one DP rank must hold a max_model_len sequence on its own
        return self.weights_fit and self.rank_kv_tokens >= self.min_concurrency * self.max_model_len

    def name(self) -> str:
        if self.dp > 1 or self.expert_parallel:
            ep = f" EP={self.tp * self.dp}" if self.expert_parallel else ""
            return f"DP={self.dp} x TP={self.tp}{ep}"
        return f"TP={self.tp} PP={self.pp}"

    def summary(self) -> str:
        t = self.tightest
        where = f" on stage {t.index}" if self.pp > 1 else ""
        if not self.weights_fit:
            return (
                f"{self.name()}: {t.weights_bytes / GIB:.1f} GiB of weights + {t.reserve_bytes / GIB:.1f} GiB "
                f"reserve per GPU{where} exceed the usable memory by {-t.kv_bytes / GIB:.1f} GiB"
            )
        tokens = f"{t.kv_tokens:,} tokens"
        if self.dp > 1:
            tokens = f"{t.kv_tokens:,} tokens per rank x {self.dp} ranks = {self.kv_tokens:,} tokens"
        return (
            f"{self.name()}: {t.weights_bytes / GIB:.1f} GiB weights + {t.reserve_bytes / GIB:.1f} GiB reserve "
            f"leave {t.kv_bytes / GIB:.1f} GiB KV cache per GPU{where} = {tokens} "
            f"({self.kv_tokens / self.max_model_len:.2f} x max_model_len {self.max_model_len:,})"
        )


def expert_parallel_for(spec: ModelSpec, options: PlanOptions, dp: int) -> bool:
    """--expert-parallel/--no-expert-parallel, else on for DP layouts of MoE models (vLLM's DP+EP
    deployment) and off for TP x PP (vLLM's default). Never for a dense model."""
    if not spec.is_moe:
        return False
    return options.expert_parallel if options.expert_parallel is not None else dp > 1


def evaluate(spec: ModelSpec, shape: ClusterShape, options: PlanOptions, tp: int, pp: int, dp: int = 1,
             expert_parallel: bool | None = None) -> Candidate:  # fmt: skip
    """One layout sized as vLLM would size it (expert parallel as ``expert_parallel_for`` when None)."""
    if expert_parallel is None:
        expert_parallel = expert_parallel_for(spec, options, dp)
    length = options.max_model_len or spec.max_position
    stages = stage_capacities(spec, shape, options, tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel)
    return Candidate(tp, pp, stages, length, options.min_concurrency, dp, expert_parallel)


def tp_problem(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM would refuse this TP size for the model, or None."""
    if tp < 1:
        return f"TP must be at least 1, got {tp}"
    if spec.heads % tp:
        return f"TP={tp} does not divide the {spec.heads} attention heads"
    if not spec.is_mla and spec.kv_heads % tp and tp % spec.kv_heads:
        return f"TP={tp} neither divides nor is a multiple of the {spec.kv_heads} KV heads"
    return None


def fp8_block_problem(spec: ModelSpec, options: PlanOptions, tp: int, dp: int = 1, expert_parallel: bool = False) -> str | None:
    """Why vLLM would refuse to load a block-FP8 MoE checkpoint's experts at this layout, or None.

    Each GPU holds ``moe_intermediate / expert_split`` of every expert it has (the whole expert
    under expert parallelism); vLLM needs that shard to be a whole number of scale blocks
    (``block_n``, and ``block_k`` when it is split), unless the version refines the blocks
    (``FP8_MOE_BLOCK_REFINE``)."""
    quant = spec.quantization
    if not spec.is_moe or quant is None:
        return None
    storage = quant.storage_for(("model.layers.0.mlp.experts.0.gate_proj",), expert=True)
    if storage is None or storage.kind != "fp8" or storage.block is None:
        return None
    split = expert_split(Sharding(tp=tp, dp=dp, expert_parallel=expert_parallel))
    block_n, block_k = storage.block
    shard, rem = divmod(spec.moe_intermediate, split)
    if rem == 0 and shard % block_n == 0 and (split == 1 or shard % block_k == 0):
        return None
    if rem == 0 and parse_vllm_version(options.vllm_version) >= FP8_MOE_BLOCK_REFINE and math.gcd(block_n, block_k, shard, spec.hidden) >= 32:
        return None
    side, block = ("output_size of gate's and up's", block_n) if shard % block_n else ("input_size of down's", block_k)
    return (f"{'DP x TP' if dp > 1 else 'TP'}={split} splits each expert to {spec.moe_intermediate}/{split} = {spec.moe_intermediate / split:g}, "
            f"and vLLM {options.vllm_version} refuses block-FP8 experts whose {side} weight is not a multiple of "
            f"block {block} (fp8_utils.py validate_fp8_block_shape_moe; vLLM {version_text(FP8_MOE_BLOCK_REFINE)} "
            "refines the blocks instead)")  # fmt: skip


def tp_refusal(spec: ModelSpec, options: PlanOptions, tp: int, dp: int = 1) -> str | None:
    """``fp8_block_problem`` with expert parallelism as the plan sets it (``expert_parallel_for``)."""
    return fp8_block_problem(spec, options, tp, dp, expert_parallel_for(spec, options, dp))


def fp8_block_hint(spec: ModelSpec) -> str:
    return (f"--expert-parallel keeps each of {spec.name}'s experts whole on one GPU; or a smaller TP; "
            f"or --vllm-version {version_text(FP8_MOE_BLOCK_REFINE)} when the nodes run it")  # fmt: skip


def valid_tps(spec: ModelSpec, limit: int) -> list[int]:
    return [t for t in range(1, limit + 1) if tp_problem(spec, t) is None]


def replicas_for(shape: ClusterShape, tp: int, pp: int, dp: int = 1) -> int:
    """Replicas the cluster holds: whole groups per node when a replica fits a node, otherwise
    groups of whole nodes (TP inside a node, PP or DP ranks across nodes)."""
    group = tp * pp * dp
    if shape.is_cpu:
        return shape.nodes // dp  # one rank per CPU node
    if group <= shape.gpus_per_node:
        return shape.nodes * (shape.gpus_per_node // group)
    return shape.total_gpus // group


def idle_gpus(shape: ClusterShape, tp: int, pp: int, dp: int = 1) -> str | None:
    """Why GPUs stay unused by the replicas of a layout, or None when every GPU serves."""
    group = tp * pp * dp
    what = f"DP={dp} x TP={tp}" if dp > 1 else f"TP={tp} x PP={pp}"
    used = replicas_for(shape, tp, pp, dp) * group
    if shape.is_cpu or used >= shape.total_gpus:
        return None
    if group <= shape.gpus_per_node:
        per_node = shape.gpus_per_node - (shape.gpus_per_node // group) * group
        return (
            f"{per_node} GPU(s) per node stay idle: a replica takes {group} GPU(s) ({what}) "
            f"and {shape.gpus_per_node} is not a multiple of {group}"
        )
    return (
        f"{shape.total_gpus - used} of {shape.total_gpus} GPU(s) stay idle: a replica spans {group} GPU(s) "
        f"({what}) and the cluster holds {used // group} such replica(s)"
    )


def fill_nodes(shape: ClusterShape, fitting: list[Candidate], first: Candidate, reasons: list[str]) -> Candidate:
    """Among fitting pipeline layouts, prefer one that leaves no GPU of a node idle when it serves
    at least as many replicas as the smallest fitting one (PP=4 over PP=3 on 8 GPUs: both give 2
    replicas, and PP=4 has more KV cache per replica)."""
    if idle_gpus(shape, first.tp, first.pp) is None:
        return first
    best = replicas_for(shape, first.tp, first.pp)
    for cand in fitting:
        bigger = cand.tp * cand.pp > first.tp * first.pp
        if bigger and idle_gpus(shape, cand.tp, cand.pp) is None and replicas_for(shape, cand.tp, cand.pp) >= best:
            reasons.append(
                f"TP={first.tp} PP={first.pp} would leave GPUs idle ({idle_gpus(shape, first.tp, first.pp)}); "
                f"TP={cand.tp} PP={cand.pp} uses every GPU with as many replicas ({best})"
            )
            return cand
    reasons.append(f"no layout that uses every GPU serves as many replicas as TP={first.tp} PP={first.pp}")
    return first
