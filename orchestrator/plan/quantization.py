"""A checkpoint's weight quantization, read from its own files, and the bytes vLLM stores. Pure.

Owns ``Quantization`` (which method, which scheme, which modules stay unquantized, from which
file) and ``Storage`` (the bytes of one quantized linear matrix: packed weights plus the scales,
zero points and indices vLLM allocates for it). ``parse_quantization`` reads the
``quantization_config`` of a config.json or ModelOpt's ``hf_quant_config.json``; an unknown
``quant_method`` is a ``ModelSpecError`` (exit 2), never a silent 16-bit plan.

What each method stores comes from vLLM's quantization layers (``create_weights`` of each linear
method; the same in 0.29.0 and 0.32.0, ``vllm/model_executor/layers/quantization/``):

- ``fp8.py`` (``quant_method: fp8``): fp8 weights; per-tensor fp32 ``weight_scale`` or, with
  ``weight_block_size`` [bo, bi], one fp32 ``weight_scale_inv`` per bo x bi block. Skips
  ``modules_to_not_convert`` / ``ignored_layers`` by exact name.
- ``fbgemm_fp8.py``: fp8 weights, one fp32 scale per output channel; ``modules_to_not_convert``
  exact names.
- ``compressed_tensors/`` (``compressed_tensors.py`` and ``schemes/``): per config group,
  ``w8a8_fp8`` / ``w8a8_int8`` (8-bit weights, fp32 scale per channel or tensor) and ``wNa16``
  (weights packed in int32, one 16-bit scale per group, an int32-packed zero point per group when
  asymmetric); ``ignore`` holds exact names or ``re:`` regexes.
- ``auto_awq.py``: int32 ``qweight`` (bits per weight), int32-packed ``qzeros`` and 16-bit
  ``scales`` per group; ``modules_to_not_convert`` matched as substrings.
- ``auto_gptq.py``: int32 ``qweight``, ``qzeros`` and 16-bit ``scales`` per group, an int32
  ``g_idx`` per input row; ``lm_head: true`` quantizes the output head too.
- ``modelopt.py``: ``FP8`` (fp8 weights, per-tensor scales) and ``NVFP4`` (two 4-bit weights per
  byte, one fp8 scale per ``group_size`` of 16, a per-tensor fp32 scale); ``exclude_modules`` are
  exact names, substrings or wildcards. ``kv_cache_quant_algo: FP8`` makes vLLM's
  ``kv_cache_dtype=auto`` fp8 (``vllm/utils/torch_utils.py resolve_kv_cache_dtype_string``).
  ``MIXED_PRECISION`` (``ModelOptMixedPrecisionConfig``, 0.32.0): a ``quantized_layers`` entry per
  module with its own algo (FP8, FP8 per channel, FP8 block, NVFP4, W4A16_NVFP4, MXFP8); a module
  with no entry stays 16-bit; ``Quantization.per_layer_entry`` resolves names as vLLM does.
- ``mxfp4.py`` (gpt-oss): only the MoE experts are quantized (4-bit weights, one uint8 scale per
  32); every linear layer stays 16-bit ("MXFP4 linear layer is not implemented").
- ``bitsandbytes``: neither vLLM 0.29.0 nor 0.32.0 has a bitsandbytes method (removed from
  ``QuantizationMethods``); such a checkpoint is refused with that reason.

Embeddings, norms and MoE routers stay at the checkpoint's 16-bit dtype (vLLM builds the routers
of DeepSeek, Mixtral, gpt-oss and Llama 4 without a quant config; Qwen3-MoE's is small).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from orchestrator.errors import ModelSpecError

try:  # Python 3.11+
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_constants as _sre_constants
    import sre_parse as _sre_parse

# The methods orch reads; anything else is refused by name (never sized as bf16).
KNOWN_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors", "awq", "gptq", "modelopt", "mxfp4", "bitsandbytes")
UNKNOWN_HINT = (
    "orch sizes fp8, fbgemm_fp8, compressed-tensors, awq, gptq, modelopt (FP8, NVFP4) and mxfp4 checkpoints; "
    "for another method pass --dtype to size every linear layer at one width, or ask for the method to be added"
)


@dataclass(frozen=True)
class Storage:
    """How vLLM stores one quantized linear matrix of ``n_in`` x ``n_out`` weights.

    ``group`` > 0: one scale (and zero point) per ``group`` inputs of each output channel;
    ``per_channel``: one scale per output channel; ``block``: one fp32 scale per (out, in) block;
    none of these: one per-tensor scale (a few bytes, not counted).
    """

    weight_bits: int
    scale_bytes: float = 4.0
    group: int = 0
    per_channel: bool = False
    block: tuple[int, int] | None = None
    zero_point_bits: int = 0  # packed zero points per group (asymmetric int schemes)
    g_idx: bool = False  # GPTQ's int32 group index per input row
    kind: str = ""  # "fp8", "int8", "int4", "nvfp4", "mxfp4"

    def matrix_bytes(self, n_in: float, n_out: float) -> float:
        total = n_in * n_out * self.weight_bits / 8
        if self.block is not None:
            total += math.ceil(n_out / self.block[0]) * math.ceil(n_in / self.block[1]) * self.scale_bytes
        elif self.group > 0:
            groups = n_out * math.ceil(n_in / self.group)
            total += groups * (self.scale_bytes + self.zero_point_bits / 8)
        elif self.per_channel:
            total += n_out * self.scale_bytes
        if self.g_idx:
            total += n_in * 4
        return total

    def bytes_per_param(self, n_in: float, n_out: float) -> float:
        return self.matrix_bytes(n_in, n_out) / (n_in * n_out)


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization as vLLM applies it, with where orch read it.

    ``rules``: (targets, storage) pairs, the first whose targets match a module wins; "Linear"
    matches every linear layer, "re:..." a regex, anything else an exact name or a name suffix.
    ``experts_only``: only MoE experts are quantized (mxfp4). ``ignore``/``match``: the modules
    that stay unquantized and how vLLM matches them ("exact", "substring", "regex", "modelopt").
    """

    method: str
    scheme: str
    source: str
    dtype: str  # the summary orch shows and the dtype suggestions compare with: fp8, int8, int4
    rules: tuple[tuple[tuple[str, ...], Storage], ...]
    ignore: tuple[str, ...] = ()
    match: str = "exact"
    lm_head: bool = False
    experts_only: bool = False
    kv_cache_dtype: str | None = None  # "fp8" when the checkpoint sets vLLM's auto KV dtype
    notes: tuple[str, ...] = field(default=())
    # ModelOpt MIXED_PRECISION: (module prefix, storage) per quantized_layers entry; a module no entry
    # resolves to stays 16-bit (``per_layer_storage`` resolves them as vLLM does)
    per_layer: tuple[tuple[str, Storage], ...] = ()

    def describe(self) -> str:
        return f"{self.method} ({self.scheme}) from {self.source}"

    @cached_property
    def _exact(self) -> frozenset[str]:
        return frozenset(self.ignore)

    def skipped(self, names: Sequence[str]) -> bool:
        """Whether a module (any of its candidate full names) stays unquantized."""
        if any(name in self._exact for name in names):
            return True
        if self.match == "exact":
            return False
        return any(_matches(name, pattern, self.match) for name in names for pattern in self.ignore)

    def storage_for(self, names: Sequence[str], *, expert: bool = False, lm_head: bool = False) -> Storage | None:
        """The storage of a linear module, or None when it stays at the 16-bit dtype."""
        if lm_head and not self.lm_head:
            return None
        if self.experts_only and not expert:
            return None
        if self.skipped(names):
            return None
        if self.per_layer:
            key = self.per_layer_entry(names, expert=expert)
            return None if key is None else self._per_layer[key]
        for targets, storage in self.rules:
            if any(_target_matches(name, target) for name in names for target in targets):
                return storage
        return None


    @cached_property
    def _per_layer(self) -> dict[str, Storage]:
        return dict(self.per_layer)

    def per_layer_entry(self, names: Sequence[str], *, expert: bool = False) -> str | None:
        """The quantized_layers key vLLM's ``ModelOptMixedPrecisionConfig._resolve_quant_algo`` takes
        for a module (0.32.0, modelopt.py), given under each of its candidate full names:

        1. the module's own name; 2. a fused module (``qkv_proj``, ``gate_up_proj``, DeepSeek's
        ``fused_qkv_a_proj``) takes the entry of any of its shards, so a shard without an entry is
        quantized like its siblings; 3. routed experts are one module (``...mlp.experts``): its own
        entry, else the first key under it (``...experts.0.up_proj``), else the first key under its
        parent (``...mlp.*``). None: no entry, the module stays unquantized."""
        table = self._per_layer
        for name in names:
            if expert:
                parent = name.split(".experts.", 1)[0]
                prefix = parent + ".experts"
                if prefix in table:
                    return prefix
                for scope in (prefix + ".", parent + "."):
                    hit = next((key for key in table if key.startswith(scope)), None)
                    if hit is not None:
                        return hit
                continue
            if name in table:
                return name
            base, _, leaf = name.rpartition(".")
            for group in FUSED_SHARDS:
                if leaf in group:
                    hit = next((f"{base}.{shard}" for shard in group if f"{base}.{shard}" in table), None)
                    if hit is not None:
                        return hit
        return None


# The shards vLLM fuses into one linear module (packed_modules_mapping of llama.py, qwen2/3.py,
# deepseek_v2.py): one module, one quantization.
FUSED_SHARDS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("q_a_proj", "kv_a_proj_with_mqa"))


def _matches(name: str, pattern: str, mode: str) -> bool:
    if mode == "substring":
        return pattern in name
    if mode == "regex":
        if pattern.startswith("re:"):
            return re.match(pattern[3:], name) is not None
        return name == pattern
    if mode == "modelopt":
        return name == pattern or pattern in name or fnmatch.fnmatchcase(name, pattern)
    if mode == "glob":
        return name == pattern or fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")
    return name == pattern


def matches_pattern(name: str, pattern: str, mode: str) -> bool:
    """Whether ``name`` matches ``pattern`` as the method matches it ("target": a config group target)."""
    return _target_matches(name, pattern) if mode == "target" else _matches(name, pattern, mode)


def _target_matches(name: str, target: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target or name.endswith("." + target)


# ---- parsing (pure) ----


def _get(cfg: Mapping[str, Any], keys: Sequence[str], source: str, method: str, default: Any = ...) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if default is ...:
        raise ModelSpecError(
            f"{source}: the {method} quantization_config has no '{keys[0]}', which vLLM needs to load it",
            hint=f"check the checkpoint's quantization config ({' or '.join(keys)})",
        )
    return default


def _int_field(value: Any, name: str, source: str, allowed: Sequence[int] | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (allowed is not None and value not in allowed):
        wanted = f"one of {', '.join(map(str, allowed))}" if allowed else "an integer"
        raise ModelSpecError(f"{source}: quantization '{name}' must be {wanted}, got {value!r}", hint="check the checkpoint's quantization config")
    return value


def _names(value: Any, field_name: str, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelSpecError(f"{source}: quantization '{field_name}' must be a list of module names", hint="check the checkpoint's quantization config")
    return tuple(value)


# vLLM matches compressed-tensors' ``re:`` names with Python's ``re.match`` against every module
# name (``compressed_tensors/utils.py``), and so does orch. Backtracking makes a pattern with a
# repetition inside a repetition (``(.*)*X``) exponential in the name's length, and many
# repetitions side by side polynomial (six ``.*`` take 0.6 s for one 55-character name). Such a
# pattern is refused before anything is matched: real ignore lists use one to three.
MAX_UNBOUNDED_REPEATS = 5


def _repeats(parsed: Any) -> tuple[int, int]:
    """(unbounded repetitions, their deepest nesting) in a pattern parsed by ``re``'s own parser."""
    count = depth = 0
    for op, av in parsed:
        name = str(op)
        children: list[Any] = []
        unbounded = 0
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            children, unbounded = [av[2]], int(av[1] == _sre_constants.MAXREPEAT)
        elif name in ("SUBPATTERN", "ASSERT", "ASSERT_NOT"):
            children = [av[-1]]
        elif name == "ATOMIC_GROUP":
            children = [av]
        elif name == "BRANCH":
            children = list(av[1])
        elif name == "GROUPREF_EXISTS":
            children = [c for c in av[1:] if c is not None]
        inner = 0
        for child in children:
            c, d = _repeats(child)
            count, inner = count + c, max(inner, d)
        count, depth = count + unbounded, max(depth, inner + unbounded)
    return count, depth


def _check_regex(pattern: str, field_name: str, source: str) -> None:
    """A ``re:`` name must compile and must not be one that takes exponential time to match."""
    hint = "fix the pattern in the checkpoint's quantization config (vLLM matches it with Python's re.match)"
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as exc:
        raise ModelSpecError(f"{source}: quantization '{field_name}' holds 're:{pattern}', which is not a valid regular expression ({exc})", hint=hint) from None
    count, depth = _repeats(parsed)
    if depth > 1 or count > MAX_UNBOUNDED_REPEATS:
        why = "a repetition inside a repetition" if depth > 1 else f"{count} unbounded repetitions (at most {MAX_UNBOUNDED_REPEATS})"
        raise ModelSpecError(f"{source}: quantization '{field_name}' holds 're:{pattern}' with {why}: matching it against module names can take minutes", hint=hint)


def _patterns(value: Any, field_name: str, source: str) -> tuple[str, ...]:
    """Module names or ``re:`` regexes (compressed-tensors' ``targets`` and ``ignore``)."""
    names = _names(value, field_name, source)
    for name in names:
        if name.startswith("re:"):
            _check_regex(name[3:], field_name, source)
    return names


def _group_size(value: int) -> int:
    return 0 if value <= 0 else value  # -1: one group over the whole input (per channel)


def parse_quantization(quant: Mapping[str, Any], source: str) -> Quantization:
    """``quantization_config`` (or hf_quant_config.json's content) -> ``Quantization``. Pure."""
    if not isinstance(quant, Mapping):
        raise ModelSpecError(f"{source}: quantization_config must be a JSON object", hint="check the checkpoint's config.json")
    if "producer" in quant and isinstance(quant.get("quantization"), Mapping):
        return _modelopt(quant["quantization"], source, legacy=True)
    method = str(quant.get("quant_method", "")).lower()
    if not method:
        raise ModelSpecError(f"{source}: quantization_config has no quant_method", hint=UNKNOWN_HINT)
    if method == "fp8":
        return _fp8(quant, source)
    if method == "fbgemm_fp8":
        ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert", source)
        storage = Storage(8, per_channel=True, kind="fp8")
        return Quantization("fbgemm_fp8", "fp8 weights, fp32 scale per output channel", source, "fp8", ((("Linear",), storage),), ignore)
    if method == "compressed-tensors":
        return _compressed_tensors(quant, source)
    if method in ("awq", "auto_awq"):
        return _awq(quant, source)
    if method in ("gptq", "auto_gptq"):
        return _gptq(quant, source)
    if method.startswith("modelopt"):
        return _modelopt(quant, source, legacy=False)
    if method == "mxfp4":
        ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert", source)
        storage = Storage(4, scale_bytes=1, group=32, kind="mxfp4")
        return Quantization("mxfp4", "MoE experts at 4 bits, uint8 scale per 32; linear layers 16-bit", source, "int4",
                            ((("Linear",), storage),), ignore, match="glob", experts_only=True)  # fmt: skip
    if method == "bitsandbytes":
        raise ModelSpecError(
            f"{source}: a bitsandbytes checkpoint; vLLM 0.29 and 0.32 cannot load it (bitsandbytes is not among "
            "their quantization methods, vllm/model_executor/layers/quantization/__init__.py)",
            hint="use an AWQ, GPTQ or compressed-tensors checkpoint of the model, or the 16-bit one with --dtype fp8",
        )
    raise ModelSpecError(f"{source}: unknown quant_method {method!r} in quantization_config", hint=UNKNOWN_HINT)


def _fp8(quant: Mapping[str, Any], source: str) -> Quantization:
    ignore = _names(quant.get("ignored_layers") or quant.get("modules_to_not_convert"), "modules_to_not_convert", source)
    block = quant.get("weight_block_size")
    if block is not None:
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ModelSpecError(f"{source}: weight_block_size must be two positive integers, got {block!r}", hint="vLLM expects e.g. [128, 128]")
        storage = Storage(8, block=(block[0], block[1]), kind="fp8")
        scheme = f"fp8 weights, fp32 scale per {block[0]}x{block[1]} block"
    else:
        storage = Storage(8, kind="fp8")
        scheme = "fp8 weights, per-tensor scales"
    return Quantization("fp8", scheme, source, "fp8", ((("Linear",), storage),), ignore)


def _ct_storage(weights: Mapping[str, Any], source: str) -> tuple[Storage, str, str]:
    bits = _int_field(weights.get("num_bits"), "num_bits", source, (4, 8))
    kind = weights.get("type", "int")
    strategy = str(weights.get("strategy", "tensor"))
    symmetric = weights.get("symmetric", True) is not False
    if kind == "float":
        if bits == 4:  # nvfp4-pack-quantized: two per byte, fp8 scale per 16
            group = _int_field(weights.get("group_size", 16), "group_size", source)
            return Storage(4, scale_bytes=1, group=group, kind="nvfp4"), "int4", f"NVFP4 weights, fp8 scale per {group}"
        return Storage(8, per_channel=strategy == "channel", kind="fp8"), "fp8", f"fp8 weights ({strategy} scales)"
    if bits == 8 and strategy != "group":
        return Storage(8, per_channel=strategy == "channel", kind="int8"), "int8", f"int8 weights ({strategy} scales)"
    group = _group_size(_int_field(weights.get("group_size", -1) if strategy == "group" else -1, "group_size", source))
    zp = 0 if symmetric else bits  # int32-packed zero points, one per group
    storage = Storage(bits, scale_bytes=2, group=group, per_channel=group == 0, zero_point_bits=zp, kind=f"int{bits}")
    detail = f"group {group}" if group else "per channel"
    return storage, f"int{bits}", f"int{bits} weights, 16-bit scale {detail}{'' if symmetric else ', zero points'}"


def _compressed_tensors(quant: Mapping[str, Any], source: str) -> Quantization:
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ModelSpecError(f"{source}: compressed-tensors quantization_config has no config_groups", hint="check the checkpoint's config.json")
    rules, dtypes, schemes = [], [], []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping):
            continue
        storage, dtype, scheme = _ct_storage(weights, f"{source} (config_groups.{name})")
        targets = _patterns(group.get("targets", ["Linear"]), f"config_groups.{name}.targets", source) or ("Linear",)
        rules.append((targets, storage))
        dtypes.append(dtype)
        activations = group.get("input_activations")
        act = f"A{activations.get('num_bits')}" if isinstance(activations, Mapping) else "A16"
        schemes.append(f"W{storage.weight_bits}{act}: {scheme}")
    if not rules:
        raise ModelSpecError(f"{source}: no compressed-tensors config group quantizes weights", hint="check the checkpoint's config.json")
    ignore = _patterns(quant.get("ignore"), "ignore", source)
    dtype = min(dtypes, key=lambda d: {"int4": 0, "fp8": 1, "int8": 1}.get(d, 2))
    return Quantization("compressed-tensors", "; ".join(schemes), source, dtype, tuple(rules), ignore, match="regex")


def _awq(quant: Mapping[str, Any], source: str) -> Quantization:
    bits = _int_field(_get(quant, ("bits", "w_bit"), source, "awq"), "bits", source, (4, 8))
    group = _group_size(_int_field(_get(quant, ("group_size", "q_group_size"), source, "awq"), "group_size", source))
    zero_point = bool(_get(quant, ("zero_point",), source, "awq", default=True))
    ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert", source)
    # qweight and qzeros are int32 holding 32/bits values; scales 16-bit. vLLM allocates qzeros either way.
    storage = Storage(bits, scale_bytes=2, group=group, per_channel=group == 0, zero_point_bits=bits, kind=f"int{bits}")
    scheme = f"int{bits} weights, group {group or 'per channel'}, fp16 scales{', zero points' if zero_point else ''}"
    return Quantization("awq", scheme, source, f"int{bits}", ((("Linear",), storage),), ignore, match="substring",
                        lm_head=bool(quant.get("lm_head", False)))  # fmt: skip


def _gptq(quant: Mapping[str, Any], source: str) -> Quantization:
    bits = _int_field(_get(quant, ("bits",), source, "gptq"), "bits", source, (2, 3, 4, 8))
    group = _group_size(_int_field(_get(quant, ("group_size",), source, "gptq"), "group_size", source))
    desc_act = bool(_get(quant, ("desc_act",), source, "gptq", default=False))
    storage = Storage(bits, scale_bytes=2, group=group, per_channel=group == 0, zero_point_bits=bits, g_idx=True, kind=f"int{bits}")
    scheme = f"int{bits} weights, group {group or 'per channel'}{', act-order' if desc_act else ''}"
    dtype = "int8" if bits == 8 else "int4"
    ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert", source)
    return Quantization("gptq", scheme, source, dtype, ((("Linear",), storage),), ignore, match="substring",
                        lm_head=bool(quant.get("lm_head", False)))  # fmt: skip


_MODELOPT = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4"}


def _modelopt_storage(algo: str, entry: Mapping[str, Any], where: str, source: str) -> Storage:
    """What one ModelOpt per-layer algo stores (vLLM 0.32.0 modelopt.py ``LINEAR_ALGOS``): FP8 with
    per-tensor scales, per-channel (``FP8_PER_CHANNEL_PER_TOKEN``) or fp32 per ``group_size``-square
    block (``FP8_PB_WO``, alias ``FP8_BLOCK_SCALES``, default 128); NVFP4 / W4A16_NVFP4 two weights
    per byte and an fp8 scale per ``group_size`` (16); MXFP8 fp8 weights and an e8m0 byte per 32."""
    if algo == "FP8":
        return Storage(8, kind="fp8")
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":
        return Storage(8, per_channel=True, kind="fp8")
    if algo in ("FP8_PB_WO", "FP8_BLOCK_SCALES"):
        block = _int_field(entry.get("group_size", 128), f"{where}.group_size", source)
        return Storage(8, block=(block, block), kind="fp8")
    if algo in ("NVFP4", "W4A16_NVFP4"):
        return Storage(4, scale_bytes=1, group=_int_field(entry.get("group_size", 16), f"{where}.group_size", source), kind="nvfp4")
    if algo == "MXFP8":
        return Storage(8, scale_bytes=1, group=32, kind="fp8")
    raise ModelSpecError(
        f"{source}: quantized_layers entry {where!r} has quant_algo {algo or 'missing'!r}, which vLLM's ModelOpt "
        "MIXED_PRECISION does not load (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO, NVFP4, W4A16_NVFP4, MXFP8)",
        hint="check the checkpoint's quantized_layers; orch does not size a layer vLLM would not load",
    )


def _mixed_precision(quant: Mapping[str, Any], source: str, ignore: tuple[str, ...], kv_fp8: bool) -> Quantization:
    layers = quant.get("quantized_layers")
    if not isinstance(layers, Mapping) or not layers:
        raise ModelSpecError(
            f"{source}: ModelOpt MIXED_PRECISION without a quantized_layers mapping; vLLM refuses it "
            "(\"MIXED_PRECISION quant_algo requires a non-empty 'quantized_layers' mapping\")",
            hint="check the checkpoint's hf_quant_config.json / quantization_config",
        )
    per_layer: list[tuple[str, Storage]] = []
    counts: dict[str, int] = {}
    for key, entry in layers.items():
        if not isinstance(entry, Mapping):
            raise ModelSpecError(f"{source}: quantized_layers entry {key!r} must be an object with a quant_algo", hint="check the checkpoint's quantized_layers")
        algo = str(entry.get("quant_algo") or "").upper()
        per_layer.append((str(key), _modelopt_storage(algo, entry, str(key), source)))
        counts[algo] = counts.get(algo, 0) + 1
    bits = min(s.weight_bits for _, s in per_layer)
    scheme = "MIXED_PRECISION per layer: " + ", ".join(f"{n} {a}" for a, n in sorted(counts.items())) + " entries; the rest 16-bit"
    return Quantization("modelopt", scheme, source, "int4" if bits == 4 else "fp8", (), ignore, match="modelopt",
                        lm_head=any(k in layers for k in ("lm_head", "language_model.lm_head", "model.language_model.lm_head")),
                        kv_cache_dtype="fp8" if kv_fp8 else None, per_layer=tuple(per_layer))  # fmt: skip


def _modelopt(quant: Mapping[str, Any], source: str, *, legacy: bool) -> Quantization:
    algo = str(quant.get("quant_algo") or "").upper()
    if algo not in _MODELOPT and algo != "MIXED_PRECISION":
        raise ModelSpecError(
            f"{source}: ModelOpt quant_algo {algo or 'missing'!r}; orch sizes FP8, NVFP4 and MIXED_PRECISION ModelOpt checkpoints",
            hint=UNKNOWN_HINT,
        )
    ignore = _names(quant.get("exclude_modules") if legacy else quant.get("ignore", quant.get("exclude_modules")), "exclude_modules", source)
    kv = quant.get("kv_cache_quant_algo") or quant.get("kv_cache_scheme")
    kv_fp8 = (isinstance(kv, str) and kv.upper() == "FP8") or (isinstance(kv, Mapping) and kv.get("num_bits") == 8 and kv.get("type") == "float")
    if algo == "MIXED_PRECISION":
        return _mixed_precision(quant, source, ignore, kv_fp8)
    if _MODELOPT[algo] == "fp8":
        storage, dtype, scheme = Storage(8, kind="fp8"), "fp8", "FP8 weights, per-tensor scales"
    else:
        group = _int_field(quant.get("group_size", 16), "group_size", source)
        storage, dtype, scheme = Storage(4, scale_bytes=1, group=group, kind="nvfp4"), "int4", f"NVFP4 weights, fp8 scale per {group}"
    return Quantization("modelopt", scheme, source, dtype, ((("Linear",), storage),), ignore, match="modelopt",
                        kv_cache_dtype="fp8" if kv_fp8 else None)  # fmt: skip
