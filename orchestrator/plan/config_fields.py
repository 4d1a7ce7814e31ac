"""How orch reads the numbers of a config.json: every field range-checked, and the fields whose
names differ between model families (experts, the longest sequence) read as vLLM's model files
read them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.errors import ModelSpecError

HINT = "use a catalog name (see `orch plan --help`), a Hugging Face repo id (org/name) or a local model folder / config.json"

# Bounds on every number orch reads from a config.json: wide enough for any published model
# (Llama 3.1 405B: 126 layers, hidden 16384, vocab 128256; DeepSeek-V3: 256 experts), narrow
# enough that a hostile or corrupt config fails fast instead of hanging the planner (it loops
# over layers) or printing a plan for a model no GPU can hold.
FIELD_BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024),
    "hidden_size": (1, 131_072),
    "num_attention_heads": (1, 4096),
    "num_key_value_heads": (0, 4096),
    "head_dim": (0, 4096),
    "intermediate_size": (0, 1_048_576),
    "moe_intermediate_size": (0, 1_048_576),
    "vocab_size": (1, 4_194_304),
    "max_position_embeddings": (0, 16_777_216),
    "max_sequence_length": (0, 16_777_216),
    "num_local_experts": (0, 4096),
    "n_routed_experts": (0, 4096),
    "num_experts": (0, 4096),
    "num_experts_per_tok": (0, 4096),
    "num_experts_per_token": (0, 4096),
    "moe_k": (0, 4096),
    "moe_num_experts": (0, 4096),
    "num_shared_experts": (0, 64),
    "moe_num_shared_experts": (0, 64),
    "shared_expert_intermediate_size": (0, 1_048_576),
    "moe_layer_start_index": (0, 1024),
    "moe_layer_interval": (0, 1024),
    "n_shared_experts": (0, 64),
    "first_k_dense_replace": (0, 1024),
    "kv_lora_rank": (0, 65_536),
    "q_lora_rank": (0, 65_536),
    "qk_rope_head_dim": (0, 4096),
    "qk_nope_head_dim": (0, 4096),
    "v_head_dim": (0, 4096),
}


def read_int(cfg: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    """``cfg[key]`` as a non-negative integer within FIELD_BOUNDS; ``default`` when unset, else an error."""
    value = cfg.get(key)
    if value is None:
        if default is not None:
            return default
        raise ModelSpecError(
            f"{source}: config is missing '{key}', which orch needs to size the model",
            hint="orch reads Hugging Face decoder configs (Llama, Qwen, Mistral/Mixtral, DeepSeek); "
            f"add '{key}' to the config or use a catalog name",
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ModelSpecError(f"{source}: '{key}' must be a non-negative integer, got {shown}", hint=HINT)
    low, high = FIELD_BOUNDS.get(key, (0, 2**31))
    if not low <= value <= high:
        raise ModelSpecError(
            f"{source}: '{key}' is {value:,}, outside the range orch accepts ({low:,} to {high:,})",
            hint="check the config.json: no published model is that size",
        )
    return value


# The MoE fields of each family, as vLLM's model files read them: Mixtral/Qwen-MoE
# (num_local_experts / num_experts, num_experts_per_tok), DeepSeek (n_routed_experts,
# n_shared_experts, first_k_dense_replace), ERNIE 4.5 (ernie45_moe.py: moe_num_experts, moe_k,
# moe_num_shared_experts of moe_intermediate_size each, MoE from moe_layer_start_index on every
# moe_layer_interval-th layer up to moe_layer_end_index), Kimi-Linear (num_experts_per_token,
# num_shared_experts), Qwen2-MoE / Qwen3-Next (qwen2_moe.py, qwen3_next.py: one shared expert of
# shared_expert_intermediate_size, counted here in experts of moe_intermediate_size, rounded up).
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_k")
SHARED_EXPERT_KEYS = ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts")
# Expert counts of families orch does not read (Megatron's num_moe_experts, ...): a config with
# one of them set and none of the counts above would be sized as a dense model, far under its size.
UNREAD_EXPERT_COUNTS = ("num_moe_experts", "n_experts", "expert_num", "num_routed_experts")


# The model's longest sequence as vLLM 0.32 derives it (derive_max_model_len_and_key,
# vllm/transformers_utils/model_arch_config_convertor.py): the smallest of these keys, except that
# model_max_length wins when set (Command-R; Kimi-Linear has only that one); 2048 without any
# (_get_and_verify_max_len, vllm/config/model.py). A 0 counts as unset, and so does a sentinel past
# 2**31 (tokenizers write 1e30 there).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")  # fmt: skip
DEFAULT_MAX_LEN = 2048


def max_position(cfg: Mapping[str, Any], source: str) -> int:
    found: dict[str, int] = {}
    for key in MAX_LEN_KEYS:
        value = cfg.get(key)
        if isinstance(value, float) and value.is_integer():  # 1e30 written as a float
            value = int(value)
        if value is None or isinstance(value, float):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            read_int(cfg, key, source)  # raises the field's error
        if 0 < value <= 2**31:
            found[key] = value
    if "model_max_length" in found:
        return found["model_max_length"]
    return min(found.values(), default=DEFAULT_MAX_LEN)


def per_layer_widths(cfg: Mapping[str, Any], source: str, layers: int) -> tuple[Mapping[str, Any], str]:
    """A per-layer ``moe_intermediate_size`` list (Hunyuan: one width per layer, read by vLLM's
    Transformers backend from the list) becomes its mean, which sums the layers' expert weights
    exactly; (config, a note saying so) or (config, "")."""
    widths = cfg.get("moe_intermediate_size")
    if not isinstance(widths, list):
        return cfg, ""
    if not widths or not all(isinstance(w, int) and not isinstance(w, bool) and 0 < w <= 1_048_576 for w in widths):
        raise ModelSpecError(f"{source}: 'moe_intermediate_size' must be an integer or a list of positive integers", hint=HINT)
    mean = round(sum(widths) / len(widths))
    note = f"moe_intermediate_size per layer {min(widths)}..{max(widths)}: sized at their mean {mean}"
    return {**cfg, "moe_intermediate_size": mean}, note


def first_int(cfg: Mapping[str, Any], keys: Sequence[str], source: str, default: int = 0) -> int:
    """The first of ``keys`` the config sets (range-checked like every field), else ``default``."""
    for key in keys:
        if cfg.get(key) is not None:
            return read_int(cfg, key, source)
    return default


def shared_experts(cfg: Mapping[str, Any], source: str, moe_inter: int) -> int:
    shared = first_int(cfg, SHARED_EXPERT_KEYS, source)
    width = read_int(cfg, "shared_expert_intermediate_size", source, default=0)
    if not shared and width and moe_inter:
        return -(-width // moe_inter)
    return shared


def expert_count(cfg: Mapping[str, Any], source: str) -> int:
    """The routed experts under any name vLLM reads; an expert count of a family orch does not
    read is refused rather than sized as a dense model."""
    count = read_int(cfg, "num_local_experts", source, default=0) or read_int(cfg, "n_routed_experts", source, default=0)
    count = count or read_int(cfg, "num_experts", source, default=0) or read_int(cfg, "moe_num_experts", source, default=0)
    if not count:
        for key in UNREAD_EXPERT_COUNTS:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                raise ModelSpecError(
                    f"{source}: '{key}' describes experts, but orch finds no expert count it reads "
                    "(num_local_experts, n_routed_experts, num_experts, moe_num_experts): it would size the model as dense",
                    hint="use a config.json of a family orch reads (Mixtral, Qwen-MoE, DeepSeek, ERNIE 4.5, gpt-oss, Llama 4)",
                )
    return count


def first_dense_layers(cfg: Mapping[str, Any], source: str, layers: int) -> int:
    """The dense layers before the first MoE layer of a MoE model; an interleaving orch cannot
    count is refused."""
    if cfg.get("moe_num_experts") is None:
        return read_int(cfg, "first_k_dense_replace", source, default=0)
    start = read_int(cfg, "moe_layer_start_index", source, default=0)
    interval = read_int(cfg, "moe_layer_interval", source, default=1)
    end = cfg.get("moe_layer_end_index")
    if interval != 1 or (end is not None and end != -1 and end != layers - 1):
        raise ModelSpecError(
            f"{source}: MoE layers every {interval} layer(s) up to layer {end}: orch counts MoE layers only as "
            "one run from moe_layer_start_index to the last layer",
            hint="orch does not size this layout of MoE layers yet; vLLM's ernie45_moe.py defines which layers are MoE",
        )
    return start
