"""Which names of a checkpoint's quantization config match nothing orch sizes. Pure.

A quantization config names modules: exclusion lists (``ignore``, ``exclude_modules``,
``modules_to_not_convert``, ``ignored_layers``), compressed-tensors ``targets`` and ModelOpt
MIXED_PRECISION ``quantized_layers`` keys. orch sizes each linear module under the names vLLM gives
it (``orchestrator.plan.modules``) and matches them the way vLLM's method does (exact, substring,
wildcard, ``re:``; ``Quantization.skipped`` / ``storage_for``). A name that matches none of them is
a name the architecture does not have under those names: the checkpoint was made for another module
layout (DeepSeek-V4's ``layers.N.ffn.experts`` against vLLM's ``model.layers.N.mlp.experts``), and
every module it meant is then sized as if it were not named. Such names are reported, never dropped:

- a warning naming them, in the plan's reasons;
- an error (``ModelSpecError``, exit 2) where the plan would be several times wrong: more than half
  of a MIXED_PRECISION checkpoint's ``quantized_layers`` entries resolve to nothing (those layers
  would be sized at 16 bits), or an exclusion list names decoder layers and none of those names
  matches (the layers it keeps at 16 bits would be sized quantized).

Names that are known but not sized by orch's linear model are not reported: embeddings, norms, the
output head (``lm_head``, ``head``), vision/audio towers of a multimodal checkpoint, and MTP layers
(``mtp.*``, or layer indices past ``num_hidden_layers``), which vLLM loads only for speculative
decoding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import ModelSpecError
from orchestrator.plan.catalog import ModelSpec
from orchestrator.plan.modules import HEAD_NAMES, full_names, layer_linears
from orchestrator.plan.quantization import Quantization, matches_pattern

# parts of a layer that are not linear modules but that exclusion lists name (norms, the router)
# (gpt-oss names its router ``mlp.router``; orch's ``mlp.gate`` router is 16-bit either way)
_LAYER_EXTRAS = ("input_layernorm", "post_attention_layernorm", "self_attn.kv_a_layernorm", "self_attn.q_a_layernorm", "self_attn", "mlp",
                 "mlp.router")  # fmt: skip
_MODEL_EXTRAS = ("model.embed_tokens", "model.norm", "model.language_model.embed_tokens", "model.language_model.norm",
                 "language_model.model.embed_tokens", "language_model.model.norm", "embed_tokens", "norm")  # fmt: skip
_TOWER_WORDS = ("vision", "visual", "audio", "multi_modal", "mm_projector", "embed_vision", "embed_audio", "image", "vit", "sound")
_LAYER_INDEX = re.compile(r"layers\.(\d+)(?:\.|\*|$)")
WARN_LIMIT = 5


@dataclass(frozen=True)
class NameReport:
    """The names of a quantization config that match nothing orch sizes, by kind."""

    excluded: tuple[str, ...] = ()  # exclusion patterns
    targets: tuple[str, ...] = ()  # compressed-tensors targets
    entries: tuple[str, ...] = ()  # MIXED_PRECISION quantized_layers keys
    not_loaded: tuple[str, ...] = ()  # MTP layers: vLLM loads them only for speculative decoding

    def warnings(self) -> list[str]:
        out = []
        for what, names, effect in (
            ("exclusion pattern(s)", self.excluded, "the modules they meant are sized quantized"),
            ("config-group target(s)", self.targets, "that group quantizes nothing orch sizes"),
            ("quantized_layers entr(y/ies)", self.entries, "the modules they meant are sized at 16 bits"),
        ):
            if names:
                shown = ", ".join(names[:WARN_LIMIT]) + (f" and {len(names) - WARN_LIMIT} more" if len(names) > WARN_LIMIT else "")
                out.append(f"warning: {len(names)} {what} of the checkpoint match no module orch sizes for this architecture "
                           f"({shown}); {effect}")  # fmt: skip
        if self.not_loaded:
            out.append(f"{len(self.not_loaded)} name(s) of the checkpoint's quantization config are MTP layers "
                       f"({', '.join(self.not_loaded[:WARN_LIMIT])}), which vLLM loads only for speculative decoding")  # fmt: skip
        return out


def _layer_names(spec: ModelSpec, layer: int) -> list[str]:
    names = [n for lin in layer_linears(spec, layer) for n in full_names(lin.name, layer)]
    return names + [n for extra in _LAYER_EXTRAS for n in full_names(extra, layer)]


def _pattern_layer(pattern: str) -> int | None:
    m = _LAYER_INDEX.search(pattern.removeprefix("re:"))
    return int(m.group(1)) if m and not pattern.startswith("re:") else None


class _Names:
    """Every name orch sizes for ``spec``, by layer (a pattern naming layer N is matched there only)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._by_layer: dict[int, list[str]] = {}
        self.top = list(_MODEL_EXTRAS) + list(HEAD_NAMES)

    def layer(self, i: int) -> list[str]:
        if i not in self._by_layer:
            self._by_layer[i] = _layer_names(self.spec, i)
        return self._by_layer[i]

    def candidates(self, pattern: str) -> list[str]:
        index = _pattern_layer(pattern)
        if index is not None:
            return self.layer(index) if index < self.spec.layers else []
        return self.top + [n for i in range(self.spec.layers) for n in self.layer(i)]


def _not_loaded(spec: ModelSpec, pattern: str) -> bool:
    bare = pattern.removeprefix("re:").lstrip("^*.")
    index = _pattern_layer(pattern)
    return bare.startswith("mtp") or (index is not None and index >= spec.layers)


def _tower(spec: ModelSpec, pattern: str) -> bool:
    return spec.tower_params > 0 and any(word in pattern.lower() for word in _TOWER_WORDS)


def _unmatched(spec: ModelSpec, names: _Names, patterns: Sequence[str], hit) -> tuple[list[str], list[str]]:
    missing, not_loaded = [], []
    for pattern in patterns:
        if _tower(spec, pattern):
            continue
        if _not_loaded(spec, pattern):
            not_loaded.append(pattern)
        elif not any(hit(name, pattern) for name in names.candidates(pattern)):
            missing.append(pattern)
    return missing, not_loaded


def _resolved_entries(quant: Quantization, spec: ModelSpec) -> set[str]:
    """The quantized_layers keys vLLM would take for some module orch sizes. Routed experts are one
    module in vLLM: every key under ``...mlp.experts.`` belongs to it (per-expert keys)."""
    keys = [key for key, _ in quant.per_layer]
    out = {key for key in keys if key in HEAD_NAMES} if quant.lm_head else set()
    for i in range(spec.layers):
        for lin in layer_linears(spec, i):
            if lin.router:
                continue
            names = full_names(lin.name, i)
            if lin.expert:
                prefixes = [n.split(".experts.", 1)[0] + ".experts" for n in names]
                under = {k for k in keys for p in prefixes if k == p or k.startswith(p + ".")}
                if under:
                    out |= under
                    continue
            key = quant.per_layer_entry(names, expert=lin.expert)
            if key is not None:
                out.add(key)
    return out


def name_report(spec: ModelSpec) -> NameReport:
    """What of ``spec``'s quantization config matches nothing orch sizes (empty for no config)."""
    quant = spec.quantization
    if quant is None:
        return NameReport()
    names = _Names(spec)
    excluded, not_loaded = _unmatched(spec, names, quant.ignore, lambda n, p: n == p or matches_pattern(n, p, quant.match))
    targets: list[str] = []
    for group_targets, _ in quant.rules:
        miss, skip = _unmatched(spec, names, [t for t in group_targets if t != "Linear"], lambda n, t: matches_pattern(n, t, "target"))
        targets += miss
        not_loaded += skip
    entries = []
    resolved = _resolved_entries(quant, spec) if quant.per_layer else set()
    for key, _ in quant.per_layer:
        if _tower(spec, key):
            continue
        if _not_loaded(spec, key):
            not_loaded.append(key)
        elif key not in resolved:
            entries.append(key)
    return NameReport(tuple(excluded), tuple(targets), tuple(entries), tuple(not_loaded))


def check_quantization_names(spec: ModelSpec) -> list[str]:
    """Raise where unmatched names would make the plan several times wrong; else the warnings."""
    report = name_report(spec)
    quant = spec.quantization
    if quant is None:
        return []
    hint = ("the checkpoint names its modules differently from vLLM's model for this architecture; orch cannot size "
            "it as vLLM would load it (check that vLLM supports the architecture, or plan a checkpoint that vLLM loads)")  # fmt: skip
    if quant.per_layer and 2 * len(report.entries) > len(quant.per_layer):
        raise ModelSpecError(
            f"{quant.source}: {len(report.entries)} of the {len(quant.per_layer)} quantized_layers entries match no module of "
            f"{spec.name} under vLLM's names (e.g. {', '.join(report.entries[:3])}); orch would size those layers at 16 bits",
            hint=hint,
        )
    layer_patterns = [p for p in quant.ignore if _pattern_layer(p) is not None and not _not_loaded(spec, p) and not _tower(spec, p)]
    if layer_patterns and all(p in report.excluded for p in layer_patterns):
        raise ModelSpecError(
            f"{quant.source}: none of the {len(layer_patterns)} excluded decoder-layer pattern(s) matches a module of {spec.name} "
            f"under vLLM's names (e.g. {', '.join(layer_patterns[:3])}); orch would size the layers it keeps at 16 bits as quantized",
            hint=hint,
        )
    return report.warnings()
