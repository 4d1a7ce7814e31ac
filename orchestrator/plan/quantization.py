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
        for targets, storage in self.rules:
            if any(_target_matches(name, target) for name in names for target in targets):
                return storage
        return None


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


def _modelopt(quant: Mapping[str, Any], source: str, *, legacy: bool) -> Quantization:
    algo = str(quant.get("quant_algo") or "").upper()
    if algo not in _MODELOPT:
        raise ModelSpecError(
            f"{source}: ModelOpt quant_algo {algo or 'missing'!r}; orch sizes FP8 and NVFP4 ModelOpt checkpoints",
            hint=UNKNOWN_HINT,
        )
    ignore = _names(quant.get("exclude_modules") if legacy else quant.get("ignore", quant.get("exclude_modules")), "exclude_modules", source)
    kv = quant.get("kv_cache_quant_algo") or quant.get("kv_cache_scheme")
    kv_fp8 = (isinstance(kv, str) and kv.upper() == "FP8") or (isinstance(kv, Mapping) and kv.get("num_bits") == 8 and kv.get("type") == "float")
    if _MODELOPT[algo] == "fp8":
        storage, dtype, scheme = Storage(8, kind="fp8"), "fp8", "FP8 weights, per-tensor scales"
    else:
        group = _int_field(quant.get("group_size", 16), "group_size", source)
        storage, dtype, scheme = Storage(4, scale_bytes=1, group=group, kind="nvfp4"), "int4", f"NVFP4 weights, fp8 scale per {group}"
    return Quantization("modelopt", scheme, source, dtype, ((("Linear",), storage),), ignore, match="modelopt",
                        kv_cache_dtype="fp8" if kv_fp8 else None)  # fmt: skip
