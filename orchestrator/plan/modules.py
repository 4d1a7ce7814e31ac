"""The linear modules of one decoder layer, named as checkpoints name them, and their bytes. Pure.

A quantized checkpoint says per module what is quantized (``modules_to_not_convert``,
``ignore``, ``exclude_modules`` name modules such as ``model.layers.0.mlp.down_proj``), so the
weights of a layer are summed module by module here: each linear's parameters times the bytes
per parameter its storage takes (``orchestrator.plan.quantization.Storage``), or the checkpoint's
16-bit dtype where it stays unquantized, times the share of the module one GPU holds: the same
TP/DP/expert-parallel cut unquantized models get (``orchestrator.plan.sharding.linear_share``: K/V
replicated once TP exceeds the KV heads, MLA's down-projections and the router whole on every GPU,
routed experts over DP x TP, whole experts under expert parallelism).

Names follow the Hugging Face checkpoints vLLM loads: ``model.layers.{i}.self_attn.{q,k,v,o}_proj``
(MLA: ``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``),
``model.layers.{i}.mlp.{gate,up,down}_proj``, MoE experts ``mlp.experts.{e}.*`` and shared experts
``mlp.shared_experts.*``; multimodal checkpoints prefix the text model with
``model.language_model.`` or ``language_model.model.``, so each module is matched under all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.quantization import Storage
from orchestrator.plan.sharding import Sharding, expert_split, linear_share

LAYER_PREFIXES = ("model.layers.{i}.", "model.language_model.layers.{i}.", "language_model.model.layers.{i}.")
HEAD_NAMES = ("lm_head", "language_model.lm_head", "model.language_model.lm_head")


@dataclass(frozen=True)
class Linear:
    """One linear module (``count`` copies for MoE experts) of ``n_in`` x ``n_out`` weights."""

    name: str
    n_in: int
    n_out: int
    count: int = 1
    expert: bool = False
    kv: bool = False  # a K or V projection: one whole head per rank once TP exceeds the KV heads
    router: bool = False  # a MoE router: always at the 16-bit dtype

    @property
    def params(self) -> int:
        return self.count * self.n_in * self.n_out


def _attention(spec: ModelSpec) -> list[Linear]:
    h = spec.hidden
    if spec.is_mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out = []
        if spec.q_lora_rank:
            out += [Linear("self_attn.q_a_proj", h, spec.q_lora_rank), Linear("self_attn.q_b_proj", spec.q_lora_rank, spec.heads * qk)]
        else:
            out.append(Linear("self_attn.q_proj", h, spec.heads * qk))
        return out + [
            Linear("self_attn.kv_a_proj_with_mqa", h, spec.kv_lora_rank + spec.qk_rope_head_dim),
            Linear("self_attn.kv_b_proj", spec.kv_lora_rank, spec.heads * (spec.qk_nope_head_dim + spec.v_head_dim)),
            Linear("self_attn.o_proj", spec.heads * spec.v_head_dim, h),
        ]
    hd = spec.head_dim
    return [
        Linear("self_attn.q_proj", h, spec.heads * hd),
        Linear("self_attn.k_proj", h, spec.kv_heads * hd, kv=True),
        Linear("self_attn.v_proj", h, spec.kv_heads * hd, kv=True),
        Linear("self_attn.o_proj", spec.heads * hd, h),
    ]


def _mlp(spec: ModelSpec, layer: int) -> list[Linear]:
    h = spec.hidden
    kind = spec.mlp_kind(layer)
    if kind == "-":
        return []
    if kind == "m":
        i, e = spec.moe_intermediate, spec.num_experts
        out = [
            Linear("mlp.gate", h, e, router=True),
            Linear("mlp.experts.0.gate_proj", h, i, e, expert=True),
            Linear("mlp.experts.0.up_proj", h, i, e, expert=True),
            Linear("mlp.experts.0.down_proj", i, h, e, expert=True),
        ]
        if spec.shared_experts:
            s = spec.shared_experts
            out += [Linear(f"mlp.shared_experts.{p}", a, b, s) for p, a, b in (("gate_proj", h, i), ("up_proj", h, i), ("down_proj", i, h))]
        return out
    i = spec.intermediate
    gate = [Linear("mlp.gate_proj", h, i)] if spec.mlp_matrices == 3 else []  # Nemotron-H: up/down only
    return gate + [Linear("mlp.up_proj", h, i), Linear("mlp.down_proj", i, h)]


def layer_linears(spec: ModelSpec, layer: int) -> tuple[Linear, ...]:
    """The linear modules of decoder layer ``layer``, the MoE router included; a Mamba /
    linear-attention mixer counts as one module of its parameters (``mixer.in_proj``)."""
    attention = _attention(spec) if spec.has_attention(layer) else []
    mixer = [Linear("mixer.in_proj", spec.hidden, spec.layout.mixer_params // spec.hidden)] if spec.layout and spec.has_mixer(layer) else []
    return tuple(attention + mixer + _mlp(spec, layer))


def full_names(name: str, layer: int) -> tuple[str, ...]:
    return tuple(p.format(i=layer) + name for p in LAYER_PREFIXES)


# vLLM's mxfp4 MoE kernels pad each expert: hidden to a multiple of 256 and the intermediate size
# of a TP partition to 128 (Marlin and FlashInfer TRT-LLM: vllm 0.11.0
# quantization/mxfp4.py, 0.29.0/0.32.0 fused_moe/oracle/mxfp4.py
# mxfp4_round_up_hidden_size_and_intermediate_size). Other backends pad less (Triton on Hopper:
# 64); orch takes the larger padding, so the plan never undercounts.
MXFP4_HIDDEN_ALIGN = 256
MXFP4_INTERMEDIATE_ALIGN = 128


def _round_up(value: float, align: int) -> int:
    return -(-int(value) // align) * align


@lru_cache(maxsize=4096)
def quantized_layer(spec: ModelSpec, layer: int) -> tuple[tuple[Linear, Storage | None], ...]:
    """Each linear of a layer with its storage in ``spec``'s checkpoint (None: 16-bit)."""
    quant = spec.quantization
    assert quant is not None
    return tuple(
        (lin, None if lin.router else quant.storage_for(full_names(lin.name, layer), expert=lin.expert))
        for lin in layer_linears(spec, layer)
    )


def _expert_bytes_per_gpu(spec: ModelSpec, lin: Linear, storage: Storage, sh: Sharding) -> float:
    n_in, n_out = lin.n_in, lin.n_out
    if storage.kind == "mxfp4":
        # the padding applies to one GPU's slice of each expert (its intermediate_size_per_partition:
        # split over DP x TP without expert parallelism, the whole expert with it)
        split = expert_split(sh)
        hidden = _round_up(spec.hidden, MXFP4_HIDDEN_ALIGN)
        inter = _round_up(spec.moe_intermediate / split, MXFP4_INTERMEDIATE_ALIGN) * split
        n_in, n_out = (inter, hidden) if lin.name.endswith("down_proj") else (hidden, inter)
    return lin.count * storage.matrix_bytes(n_in, n_out) * linear_share(spec, sh, lin.name, expert=True)


@lru_cache(maxsize=4096)
def quantized_layer_bytes_per_gpu(spec: ModelSpec, layer: int, sh: Sharding) -> float:
    """Bytes of a layer's linear modules on one GPU of layout ``sh`` for ``spec``'s quantized checkpoint."""
    dense = 4.0 if spec.dtype == "fp32" else 2.0
    total = 0.0
    for lin, storage in quantized_layer(spec, layer):
        if storage is not None and lin.expert:
            total += _expert_bytes_per_gpu(spec, lin, storage, sh)
            continue
        per_param = storage.bytes_per_param(lin.n_in, lin.n_out) if storage is not None else dense
        total += lin.params * per_param * linear_share(spec, sh, lin.name, expert=lin.expert, kv=lin.kv, router=lin.router)
    return total


def head_bytes_per_param(spec: ModelSpec) -> float | None:
    """Bytes per parameter of the output head when the checkpoint quantizes it (GPTQ/AWQ ``lm_head``)."""
    quant = spec.quantization
    if quant is None or not quant.lm_head:
        return None
    storage = quant.storage_for(HEAD_NAMES, lm_head=True)
    return storage.bytes_per_param(spec.hidden, spec.vocab) if storage else None
