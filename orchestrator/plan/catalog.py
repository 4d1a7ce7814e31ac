"""Model architectures orch can size: the built-in catalog and Hugging Face ``config.json``.

Owns ``ModelSpec`` (the numbers the planner needs, nothing else), the catalog of short names
(``llama3-8b`` ... ``deepseek-v3``, ``qwen3-235b-a22b``, ``mixtral-8x22b``, ``kimi-k2``, ``tiny``) and the parsing of a ``config.json`` dict into a spec.
Pure: ``spec_from_config(dict, source)`` does no I/O; ``spec_from_files`` reads a checkpoint's
config.json (what ``--model`` names is decided in ``orchestrator.plan.model_ref``).

Catalog entries copy the ``config.json`` of the published checkpoints (Llama 3.1, Qwen2.5,
Mixtral-8x7B-v0.1 and 8x22B-v0.1, DeepSeek-V3, Qwen3-235B-A22B, Kimi-K2); ``tiny`` is
``orchestrator.plan.tinymodel.TINY_CONFIG``.
"""

from __future__ import annotations

import difflib
import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ModelSpecError
from orchestrator.plan.config_fields import (
    EXPERTS_PER_TOKEN_KEYS,
    HINT,
    MAX_LEN_KEYS,
    expert_count,
    first_dense_layers,
    first_int,
    max_position,
    per_layer_widths,
    read_int,
    shared_experts,
)
from orchestrator.plan.layer_types import LayerLayout, layer_layout
from orchestrator.plan.quantization import Quantization, parse_quantization
from orchestrator.plan.tinymodel import TINY_CONFIG
from orchestrator.plan.towers import towers_from_config

# bytes per stored number; "auto" is resolved by the caller from the model's dtype.
DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
_TORCH_DTYPES = {
    "float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8", "int4": "int4",
}  # fmt: skip

QUANT_CONFIG_FILE = "hf_quant_config.json"  # ModelOpt (<= 0.29) writes its quantization here


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers that decide memory. Dense models leave the MoE and MLA fields 0.

    ``intermediate`` is the dense MLP width (DeepSeek: of its first ``first_k_dense`` layers);
    MoE layers have ``num_experts`` routed experts of width ``moe_intermediate`` (Mixtral: the
    same as ``intermediate``), ``experts_per_token`` active, plus ``shared_experts`` always-on ones.
    MLA (``kv_lora_rank`` > 0) caches one latent of ``kv_lora_rank + qk_rope_head_dim`` numbers
    per token and layer instead of K and V per head.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool = False
    dtype: str = "bf16"
    max_position: int = 4096
    num_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    first_k_dense: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    source: str = "catalog"
    architecture: str = ""  # config.json's model_type (decides vLLM's Model Runner V2 default)
    # The checkpoint's own quantization (None: unquantized, or a catalog entry sized uniformly at dtype)
    quantization: Quantization | None = None
    # A multimodal checkpoint's vision/audio towers and projector (16-bit, on every stage, split over TP)
    tower_params: int = 0
    towers: str = ""  # which families they were counted as (orchestrator.plan.towers)
    # Layers that are not all full attention with one MLP kind (orchestrator.plan.layer_types):
    # sliding / chunked / state caches, Mamba mixers, MoE on some layers. None: a plain transformer.
    layout: LayerLayout | None = None
    # False when the config names no length key: vLLM then takes any --max-model-len it is given
    # (_get_and_verify_max_len, vllm/config/model.py) and assumes 2048 only when none is
    max_position_set: bool = True

    def has_attention(self, layer: int) -> bool:
        return self.layout is None or self.layout.attention[layer]

    def has_mixer(self, layer: int) -> bool:
        return self.layout is not None and self.layout.mixer[layer]

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP or expert: 3 (SwiGLU), 2 for a squared-ReLU MLP (Nemotron-H)."""
        return self.layout.mlp_matrices if self.layout is not None else 3

    def mlp_kind(self, layer: int) -> str:
        """d: dense MLP, m: MoE, -: none (a Nemotron-H Mamba or attention block, a pure SSM)."""
        if self.layout is not None and self.layout.mlp:
            kind = self.layout.mlp[layer]
            return "d" if kind == "m" and not self.is_moe else kind
        return "m" if self.is_moe and layer >= self.first_k_dense else "d"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def with_dtype(self, dtype: str) -> ModelSpec:
        if dtype not in DTYPE_BYTES:
            raise ModelSpecError(f"unknown dtype '{dtype}'", hint=f"use one of {', '.join(DTYPE_BYTES)}")
        return replace(self, dtype=dtype)


def _llama(name: str, layers: int, hidden: int, inter: int, heads: int) -> ModelSpec:
    # Llama 3.1 config.json: 8 KV heads, head_dim 128, vocab 128256, untied, 128K context.
    return ModelSpec(name, layers, hidden, inter, heads, 8, hidden // heads, 128256, max_position=131072, architecture="llama")


CATALOG: dict[str, ModelSpec] = {
    "llama3-8b": _llama("llama3-8b", 32, 4096, 14336, 32),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 28672, 64),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 53248, 128),
    "qwen2.5-7b": ModelSpec("qwen2.5-7b", 28, 3584, 18944, 28, 4, 128, 152064, max_position=32768, architecture="qwen2"),
    "qwen2.5-72b": ModelSpec("qwen2.5-72b", 80, 8192, 29568, 64, 8, 128, 152064, max_position=32768, architecture="qwen2"),
    "mixtral-8x7b": ModelSpec(
        "mixtral-8x7b", 32, 4096, 14336, 32, 8, 128, 32000, max_position=32768,
        num_experts=8, experts_per_token=2, moe_intermediate=14336, architecture="mixtral",
    ),
    # The published DeepSeek-V3 weights are FP8 (block-quantized); its MTP layer is not loaded
    # by vLLM unless speculative decoding asks for it, so it is not counted.
    "deepseek-v3": ModelSpec(
        "deepseek-v3", 61, 7168, 18432, 128, 128, 192, 129280, dtype="fp8", max_position=163840,
        num_experts=256, experts_per_token=8, shared_experts=1, moe_intermediate=2048, first_k_dense=3,
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        architecture="deepseek_v3",
        quantization=parse_quantization(
            {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
            "the catalog (deepseek-ai/DeepSeek-V3 config.json quantization_config)",
        ),
    ),
    # Qwen/Qwen3-235B-A22B (bf16): the numbers of its FP8 sibling's config.json (tests/unit/test_memory.py)
    "qwen3-235b-a22b": ModelSpec(
        "qwen3-235b-a22b", 94, 4096, 12288, 64, 4, 128, 151936, max_position=40960,
        num_experts=128, experts_per_token=8, moe_intermediate=1536, architecture="qwen3_moe",
    ),
    # mistral-community/Mixtral-8x22B-v0.1 config.json (tests/data/planner/configs/Mixtral-8x22B-v0.1)
    "mixtral-8x22b": ModelSpec(
        "mixtral-8x22b", 56, 6144, 16384, 48, 8, 128, 32000, max_position=65536,
        num_experts=8, experts_per_token=2, moe_intermediate=16384, architecture="mixtral",
    ),
    # moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture with 384 experts, 64 heads, one dense
    # layer (tests/data/planner/configs/Kimi-K2-Instruct); its published weights are FP8 (block-quantized)
    "kimi-k2": ModelSpec(
        "kimi-k2", 61, 7168, 18432, 64, 64, 192, 163840, dtype="fp8", max_position=131072,
        num_experts=384, experts_per_token=8, shared_experts=1, moe_intermediate=2048, first_k_dense=1,
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        architecture="kimi_k2",
    ),
}  # fmt: skip


# ---- config.json -> ModelSpec (pure) ----


# Fields a text_config may leave to its transformers class's defaults (transformers 5.19:
# configuration_gemma3.py Gemma3TextConfig: vocab_size 262208, tie_word_embeddings True,
# max_position_embeddings 131072) or that
# vLLM builds without a config field (llama4.py: one shared expert in every MoE layer).
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262_208, "tie_word_embeddings": True, "max_position_embeddings": 131_072},
    "llama4_text": {"n_shared_experts": 1},
}


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal checkpoints nest the language model's numbers under ``text_config`` (Qwen3-Omni:
    ``thinker_config.text_config``, read by vLLM's qwen3_omni_moe_thinker.py)."""
    inner = config.get("text_config")
    thinker = config.get("thinker_config")
    if not isinstance(inner, Mapping) and isinstance(thinker, Mapping):
        inner = thinker.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" in inner:
        merged = dict(config)
        merged.update(_TEXT_DEFAULTS.get(str(inner.get("model_type")), {}))
        merged.update(inner)
        return merged
    return config


MAX_CONFIG_BYTES = 4 * 2**20  # a config.json is a few KiB; refuse anything past 4 MiB unread
MAX_PARAMS = 100 * 10**12  # 100T parameters: past any model orch could place on a GPU cluster
TOWER_HINT = "check hidden_size, intermediate_size and the depth in vision_config / audio_config"


def _torch_dtype(cfg: Mapping[str, Any], source: str) -> str:
    # A null dtype is no dtype: vLLM then reads the safetensors' own (get_torch_dtype,
    # vllm/transformers_utils/model_arch_config_convertor.py), which orch takes as 16-bit like a missing one.
    raw = next((cfg[k] for k in ("torch_dtype", "dtype") if cfg.get(k) is not None), "bfloat16")
    dtype = _TORCH_DTYPES.get(str(raw).replace("torch.", "").lower())
    if dtype is None:
        raise ModelSpecError(f"{source}: unknown torch_dtype {raw!r}", hint="expected bfloat16, float16 or float32")
    return dtype


def _quantization(cfg: Mapping[str, Any], source: str, quant_file: Mapping[str, Any] | None, quant_source: str | None) -> Quantization | None:
    """The checkpoint's quantization: config.json's quantization_config, else ModelOpt's
    hf_quant_config.json (vLLM's order, ``vllm/transformers_utils/config.py``)."""
    quant = cfg.get("quantization_config")
    if quant is not None:
        return parse_quantization(quant, f"{source} (quantization_config)")
    if quant_file is not None:
        return parse_quantization(quant_file, quant_source or "hf_quant_config.json")
    return None


def spec_from_config(
    config: Mapping[str, Any], source: str, name: str | None = None, *,
    quant_file: Mapping[str, Any] | None = None, quant_source: str | None = None,
) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` dict (and ModelOpt's
    ``hf_quant_config.json``, when the checkpoint has one). Pure.

    Required: num_hidden_layers, hidden_size, num_attention_heads, vocab_size, and
    intermediate_size for dense models. ``num_key_value_heads`` defaults to the attention heads
    (MHA), ``head_dim`` to hidden/heads, ``tie_word_embeddings`` to False. MoE fields follow
    Mixtral (num_local_experts, num_experts_per_tok) and DeepSeek (n_routed_experts,
    n_shared_experts, moe_intermediate_size, first_k_dense_replace); MLA fields follow DeepSeek.
    """
    if not isinstance(config, Mapping):
        raise ModelSpecError(f"{source}: config.json must hold a JSON object", hint=HINT)
    cfg = _text_config(config)
    layers = read_int(cfg, "num_hidden_layers", source)
    hidden = read_int(cfg, "hidden_size", source)
    layout = layer_layout(cfg, source, layers)
    attention_free = layout is not None and not any(layout.attention)
    # a pure SSM (Mamba2, Falcon-Mamba) has no attention heads at all
    heads = read_int(cfg, "num_attention_heads", source, default=1 if attention_free else None)
    vocab = read_int(cfg, "vocab_size", source)
    if layers == 0 or hidden == 0 or heads == 0:
        raise ModelSpecError(f"{source}: num_hidden_layers, hidden_size and num_attention_heads must be > 0", hint=HINT)
    num_experts = expert_count(cfg, source)
    cfg, moe_note = per_layer_widths(cfg, source, layers)
    moe_inter = read_int(cfg, "moe_intermediate_size", source, default=0)
    first_dense = first_dense_layers(cfg, source, layers) if num_experts else 0
    if num_experts and not moe_inter:
        moe_inter = read_int(cfg, "intermediate_size", source)
    # A MoE model with no dense layers may omit intermediate_size; dense models need it (Llama 4's
    # dense layers are intermediate_size_mlp wide, llama4.py; a model with no MLP needs none).
    no_mlp = layout is not None and bool(layout.mlp) and "d" not in layout.mlp
    intermediate = read_int(cfg, "intermediate_size", source, default=0 if num_experts or no_mlp else None)
    if cfg.get("intermediate_size_mlp") is not None and num_experts:
        intermediate = read_int(cfg, "intermediate_size_mlp", source)
    if moe_note and layout is not None:
        layout = replace(layout, sources=(*layout.sources, moe_note))
    kv_lora = read_int(cfg, "kv_lora_rank", source, default=0)
    kv_heads = read_int(cfg, "num_key_value_heads", source, default=heads) or heads
    head_dim = read_int(cfg, "head_dim", source, default=0) or hidden // heads
    if kv_lora:
        nope = read_int(cfg, "qk_nope_head_dim", source)
        rope = read_int(cfg, "qk_rope_head_dim", source)
        head_dim = nope + rope
    if head_dim == 0:
        raise ModelSpecError(
            f"{source}: hidden_size {hidden} is smaller than num_attention_heads {heads} and there is no head_dim",
            hint="a head needs at least one dimension: check hidden_size and num_attention_heads",
        )
    if kv_heads > heads or heads % kv_heads:
        raise ModelSpecError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}", hint=HINT)
    if num_experts and not 0 < first_int(cfg, EXPERTS_PER_TOKEN_KEYS, source, default=1) <= num_experts:
        raise ModelSpecError(f"{source}: num_experts_per_tok must be between 1 and the {num_experts} experts", hint=HINT)
    max_pos = max_position(cfg, source)
    quantization = _quantization(cfg, source, quant_file, quant_source)
    try:
        towers = towers_from_config(config, hidden)
    except (ArithmeticError, TypeError, ValueError) as exc:  # a ratio of 0, a float past its range, a number where a list belongs
        raise ModelSpecError(f"{source}: the vision/audio sections cannot be sized ({exc})", hint=TOWER_HINT) from None
    if towers.total > MAX_PARAMS:
        raise ModelSpecError(
            f"{source}: vision_config/audio_config describe more than the {MAX_PARAMS // 10**12}T parameters orch accepts",
            hint=TOWER_HINT,
        )
    # Each field is in range, but together they can still describe an impossible model.
    rough = layers * (4 * hidden * heads * head_dim + 3 * hidden * (intermediate + (num_experts + 1) * moe_inter)) + 2 * vocab * hidden
    if rough > MAX_PARAMS:
        raise ModelSpecError(
            f"{source}: these sizes describe about {rough / 1e12:,.0f}T parameters, past the {MAX_PARAMS // 10**12}T orch accepts",
            hint="check hidden_size, intermediate_size, the expert counts and num_hidden_layers",
        )
    return ModelSpec(
        name=name or str(config.get("_name_or_path") or source),
        layers=layers,
        hidden=hidden,
        intermediate=intermediate,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        dtype=quantization.dtype if quantization is not None else _torch_dtype(cfg, source),
        max_position=max_pos,
        num_experts=num_experts,
        experts_per_token=first_int(cfg, EXPERTS_PER_TOKEN_KEYS, source) if num_experts else 0,
        shared_experts=shared_experts(cfg, source, moe_inter) if num_experts else 0,
        moe_intermediate=moe_inter if num_experts else 0,
        first_k_dense=first_dense,
        kv_lora_rank=kv_lora,
        q_lora_rank=read_int(cfg, "q_lora_rank", source, default=0) if kv_lora else 0,
        qk_rope_head_dim=read_int(cfg, "qk_rope_head_dim", source, default=0) if kv_lora else 0,
        qk_nope_head_dim=read_int(cfg, "qk_nope_head_dim", source, default=0) if kv_lora else 0,
        v_head_dim=read_int(cfg, "v_head_dim", source, default=0) if kv_lora else 0,
        source=source,
        architecture=_architecture(cfg),
        quantization=quantization,
        tower_params=towers.total,
        towers=towers.kind,
        layout=layout,
        max_position_set=any(cfg.get(key) is not None for key in MAX_LEN_KEYS),
    )


def _architecture(cfg: Mapping[str, Any]) -> str:
    """config.json's model_type ("llama", "qwen3", ...), else its first architectures entry."""
    kind = cfg.get("model_type")
    if isinstance(kind, str) and len(kind) < 100:
        return kind
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str) and len(archs[0]) < 100:
        return archs[0]
    return ""


# tiny: the random-weight Llama the local demo serves (orchestrator.plan.tinymodel builds it).
# (model_type as transformers writes it into the folder's config.json; not part of the recipe's hash)
CATALOG["tiny"] = spec_from_config({**TINY_CONFIG, "model_type": "llama"}, "orchestrator.plan.tinymodel.TINY_CONFIG", name="tiny")


# ---- the edge: a config.json file -> ModelSpec ----


def closest_name(name: str) -> str | None:
    matches = difflib.get_close_matches(name.lower(), list(CATALOG), n=1, cutoff=0.5)
    return matches[0] if matches else None


def spec_from_files(config_path: Path, name: str) -> ModelSpec:
    """A checkpoint folder's config.json, and its hf_quant_config.json beside it when there is one."""
    config = parse_config_text(_read_config(config_path), str(config_path))
    quant_path = config_path.parent / QUANT_CONFIG_FILE
    quant = parse_config_text(_read_config(quant_path), str(quant_path)) if quant_path.is_file() else None
    return spec_from_config(config, str(config_path), name=name, quant_file=quant, quant_source=str(quant_path))


def _read_config(config_path: Path) -> bytes:
    """The bytes of a config.json: a regular file (a FIFO would block), at most MAX_CONFIG_BYTES."""
    try:
        info = config_path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ModelSpecError(f"{config_path}: not a regular file", hint=HINT)
        if info.st_size > MAX_CONFIG_BYTES:
            raise ModelSpecError(f"{config_path}: {info.st_size:,} bytes, too large for a config.json (limit {MAX_CONFIG_BYTES:,})", hint=HINT)
        with config_path.open("rb") as fh:
            return fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ModelSpecError(f"{config_path}: no such file", hint=HINT) from None
    except OSError as exc:
        raise ModelSpecError(f"{config_path}: cannot read it: {exc.strerror or exc}", hint=HINT) from exc


def parse_config_text(raw: bytes, source: str) -> Any:
    """config.json bytes -> the decoded JSON value. Pure. Binary content, deep nesting and
    integers too long to convert are ``ModelSpecError``s, never an internal error."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelSpecError(f"{source}: too large for a config.json (limit {MAX_CONFIG_BYTES:,} bytes)", hint=HINT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelSpecError(f"{source}: not UTF-8 text (byte {exc.start}); is it a binary file?", hint=HINT) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelSpecError(f"{source}: not valid JSON (line {exc.lineno}: {exc.msg})", hint=HINT) from exc
    except RecursionError:
        raise ModelSpecError(f"{source}: JSON nested too deeply to be a model config", hint=HINT) from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit conversion limit
        raise ModelSpecError(f"{source}: not a usable JSON value ({str(exc)[:80]})", hint=HINT) from None
