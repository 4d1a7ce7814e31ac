"""What each decoder layer caches, read from a config.json the way vLLM's model file reads it. Pure.

vLLM gives every attention or state-space module its own KV cache spec
(``vllm/v1/kv_cache_interface.py``): full attention caches every token, a sliding-window layer the
last ``window`` tokens (``SlidingWindowSpec``), a chunked-local layer one chunk
(``ChunkedLocalAttentionSpec``, Llama 4), a Mamba / linear-attention layer one fixed state per
sequence (``MambaSpec``), DeepSeek-V3.2's indexer a 132-byte key per token beside the MLA latent.
``LayerLayout`` holds, per decoder layer, the caches it has (``entries``) and, for the weights,
whether it has attention projections, a state mixer and a dense / MoE / no MLP; ``sources`` says
which config field decided it and which vLLM file reads that field. A layer type orch does not
know is a ``ModelSpecError`` naming the field, never a full-attention layer.

The family readers (vLLM 0.32.0 files, the same in 0.29.0 unless said):
- ``layer_types`` (``sliding_attention`` / ``full_attention``): Gemma 2/3/4 (gemma2.py, gemma3.py,
  gemma4.py), Mistral/Llama (llama.py), Command-A (commandr.py: window + 1); transformers fills it
  from ``sliding_window_pattern`` (Gemma 3: 6, Cohere2: 4) or every second layer (Gemma 2) when
  the file has none. gpt-oss (gpt_oss.py): even layers are sliding, whatever layer_types says.
- Mistral's ``sliding_window`` without ``layer_types``: every layer (the engine-wide window).
- Llama 4 (llama4.py): ``no_rope_layers[i] == 0`` is full attention, the others chunked by
  ``attention_chunk_size``; MoE on layers where ``(i + 1) % interleave_moe_layer_step == 0``,
  ``intermediate_size_mlp`` on the others.
- Qwen3-Next / Qwen3.5 (qwen3_next.py, qwen3_5.py): ``layer_types`` or ``full_attention_interval``;
  Gated DeltaNet state from the ``linear_*`` fields.
- Kimi-Linear (kimi_linear config, vllm/models/kimi_k3): ``linear_attn_config.kda_layers`` (1-based)
  are KDA, the others MLA.
- Nemotron-H (nemotron_h.py): ``hybrid_override_pattern`` / ``layers_block_type``: M Mamba2,
  * attention, - MLP, E MoE, one block per layer.
- Granite 4.0-H (granitemoehybrid.py): ``layer_types`` mamba / attention, ``mamba_*`` fields.
- Jamba (jamba.py): ``attn_layer_period`` / ``attn_layer_offset``, MoE every
  ``expert_layer_period`` from ``expert_layer_offset``; Mamba1 state.
- Falcon-H1 (falcon_h1.py): attention and Mamba2 side by side in every layer.
- Zamba2 (zamba2.py): ``layers_block_type`` mamba / hybrid (a shared attention block beside the Mamba2).
- Mamba2 / Falcon-Mamba (mamba2.py, mamba.py): every layer a state, no attention.
- DeepSeek-V3.2 / GLM-5 (deepseek_v2.py ``Indexer``): ``index_topk`` set: an indexer key cache of
  ``index_head_dim + index_head_dim / 128 * 4`` bytes per token per layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.errors import ModelSpecError

FULL, SLIDING, CHUNKED, STATE, INDEXER = "full", "sliding", "chunked", "state", "indexer"
UNKNOWN_HINT = "orch sizes full, sliding-window, chunked, Mamba/linear-attention and indexer caches; a new layer type needs vLLM's model file read first"


@dataclass(frozen=True)
class Cache:
    """One cache a layer keeps: ``kind`` (FULL, SLIDING, CHUNKED, STATE, INDEXER) and its window/chunk."""

    kind: str
    window: int = 0


@dataclass(frozen=True)
class StateShape:
    """A Mamba / linear-attention layer's per-sequence state as vLLM's ``MambaStateShapeCalculator``
    shapes it (``model_executor/layers/mamba/mamba_utils.py``): a conv state of ``conv_dim`` x
    ``conv_len`` and a temporal state of ``heads`` x ``a`` x ``b``, both split over TP; ``n_groups``
    grows to TP when it does not divide (``extra_groups_for_head_shards``, Mamba2 only). Mamba1's
    temporal state (``intermediate_size`` x ``state_size``) splits by channel: ``heads`` is the
    intermediate size, ``a`` 1 (``mamba1_state_shape``)."""

    kind: str  # mamba1, mamba2, gdn, kda
    conv_dim: int
    conv_len: int
    heads: int
    a: int
    b: int
    state_fp32: bool = False  # the temporal state in fp32 (KDA; Nemotron-H's default mamba_ssm_cache_dtype)
    n_groups: int = 0
    group_state: int = 0  # mamba2: conv_dim holds 2 * n_groups * state_size beside the intermediate size

    def bytes_per_gpu(self, tp: int, s: float) -> int:
        conv_dim = self.conv_dim
        if self.kind == "mamba2" and self.n_groups and self.n_groups % tp:
            conv_dim += 2 * (tp - self.n_groups) * self.group_state
        conv = conv_dim // tp * self.conv_len * s
        temporal = max(1, self.heads // tp) * self.a * self.b * (4 if self.state_fp32 else s)
        return int(conv + temporal)


@dataclass(frozen=True)
class LayerLayout:
    """Per decoder layer: its caches, and what its weights hold (see the module docstring)."""

    caches: tuple[tuple[Cache, ...], ...]
    attention: tuple[bool, ...]  # the layer has attention projections (q/k/v/o or MLA)
    mixer: tuple[bool, ...]  # the layer has a state mixer (Mamba / linear attention)
    mlp: str  # one letter per layer: d dense, m MoE, - none; "" when the MLPs are the plain transformer's
    mixer_params: int = 0  # one mixer's parameters (projections, conv, norms), unsplit
    state: StateShape | None = None
    sources: tuple[str, ...] = ()
    global_kv_heads: int = 0  # Gemma 4: the full-attention layers' KV heads and head size
    global_head_dim: int = 0
    indexer_bytes: int = 0  # DeepSeek-V3.2: indexer key bytes per token per layer
    mlp_matrices: int = 3  # SwiGLU's gate/up/down; Nemotron-H's squared-ReLU MLP has up/down only (nemotron_h.py NemotronHMLP)

    def counts(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for layer in self.caches:
            for c in layer:
                out[(c.kind, c.window)] = out.get((c.kind, c.window), 0) + 1
        return out

    def describe(self) -> str:
        """"18 sliding-window (128) + 18 full attention", "48 Gated DeltaNet + 16 full attention"."""
        names = {"mamba1": "Mamba", "mamba2": "Mamba2", "gdn": "Gated DeltaNet", "kda": "KDA"}
        parts = []
        order = {STATE: 0, SLIDING: 1, CHUNKED: 1, FULL: 2, INDEXER: 3}
        for (kind, window), n in sorted(self.counts().items(), key=lambda kv: (order[kv[0][0]], kv[0])):
            if kind == SLIDING:
                parts.append(f"{n} sliding-window ({window:,})")
            elif kind == CHUNKED:
                parts.append(f"{n} chunked-local ({window:,})")
            elif kind == STATE:
                parts.append(f"{n} {names.get(self.state.kind if self.state else '', 'state')}")
            elif kind == INDEXER:
                parts.append(f"{n} sparse-attention indexer")
            else:
                parts.append(f"{n} full attention")
        return " + ".join(parts) if parts else "no cached layers"


def _int(cfg: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None:
        raise ModelSpecError(f"{source}: config is missing '{key}', which sizes this model's layers", hint=UNKNOWN_HINT)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31:
        raise ModelSpecError(f"{source}: '{key}' must be a non-negative integer, got {str(value)[:40]!r}", hint=UNKNOWN_HINT)
    return value


def _list(cfg: Mapping[str, Any], key: str, source: str, n: int) -> list:
    value = cfg.get(key)
    if not isinstance(value, list) or len(value) < n:
        raise ModelSpecError(f"{source}: '{key}' must list the {n} layers, got {str(value)[:60]!r}", hint=UNKNOWN_HINT)
    return value[:n]


def _unknown(source: str, field: str, value: Any) -> ModelSpecError:
    return ModelSpecError(f"{source}: {field} names a layer type orch does not know: {str(value)[:40]!r}", hint=UNKNOWN_HINT)


# ---- the state mixers ----


def _mamba2(hidden_inter: int, n_groups: int, heads: int, head_dim: int, state: int, conv: int, fp32: bool) -> StateShape:
    return StateShape("mamba2", hidden_inter + 2 * n_groups * state, conv - 1, heads, head_dim, state, fp32, n_groups, state)


def _mamba2_params(hidden: int, inter: int, n_groups: int, heads: int, state: int, conv: int) -> int:
    # in_proj (z, x, B, C, dt), conv1d over x/B/C, out_proj, A/D/dt_bias, gated norm (mamba_mixer2.py)
    conv_dim = inter + 2 * n_groups * state
    return hidden * (inter + conv_dim + heads) + conv_dim * conv + inter * hidden + 3 * heads + inter


def _gdn(cfg: Mapping[str, Any], source: str) -> tuple[StateShape, int]:
    kh, vh = _int(cfg, "linear_num_key_heads", source), _int(cfg, "linear_num_value_heads", source)
    kd, vd = _int(cfg, "linear_key_head_dim", source), _int(cfg, "linear_value_head_dim", source)
    conv = _int(cfg, "linear_conv_kernel_dim", source, 4)
    conv_dim = 2 * kh * kd + vh * vd
    h = _int(cfg, "hidden_size", source)
    # in_proj_qkvz + in_proj_ba, conv1d, out_proj (qwen3_next.py Qwen3NextGatedDeltaNet)
    params = h * (conv_dim + vh * vd + 2 * vh) + conv_dim * conv + vh * vd * h + 2 * vh + vd
    return StateShape("gdn", conv_dim, conv - 1, vh, vd, kd), params


# ---- the families ----


def _pattern_types(cfg: Mapping[str, Any], n: int, pattern: int) -> list[str]:
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _attention_types(cfg: Mapping[str, Any], n: int, source: str, kind: str) -> tuple[list[str], str]:
    """layer_types as vLLM sees it (transformers fills it from the family's pattern when absent)."""
    if cfg.get("layer_types") is not None:
        return _list(cfg, "layer_types", source, n), "layer_types"
    if kind == "gemma2":
        return _pattern_types(cfg, n, 2), "every second layer sliding (transformers Gemma2Config)"
    pattern = _int(cfg, "sliding_window_pattern", source, 6 if kind.startswith("gemma") else 4)
    return _pattern_types(cfg, n, pattern or 1), f"sliding_window_pattern {pattern}"


def _sliding_family(cfg: Mapping[str, Any], n: int, source: str, kind: str, vllm_file: str) -> LayerLayout:
    window = _int(cfg, "sliding_window", source)
    if kind == "cohere2":
        window += 1  # commandr.py: the layer sees sliding_window + 1 tokens
    if kind == "gpt_oss":
        types, how = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)], "even layers (gpt_oss.py layer_idx % 2)"
    else:
        types, how = _attention_types(cfg, n, source, kind)
    caches: list[tuple[Cache, ...]] = []
    for i, t in enumerate(types):
        if t == "sliding_attention":
            caches.append((Cache(SLIDING, window),))
        elif t == "full_attention":
            caches.append((Cache(FULL),))
        else:
            raise _unknown(source, f"layer_types[{i}]", t)
    shared = _int(cfg, "num_kv_shared_layers", source, 0)
    if shared:  # Gemma 3n/4: the last layers read an earlier layer's cache and keep none
        caches[n - shared:] = [()] * shared
    global_heads = global_dim = 0
    if kind.startswith("gemma4"):
        global_dim = _int(cfg, "global_head_dim", source, 512)
        global_heads = _int(cfg, "num_global_key_value_heads", source, 0) if cfg.get("attention_k_eq_v") else 0
    note = f"{how}, sliding_window {window}" + (f", num_kv_shared_layers {shared}" if shared else "")
    return _layout(caches, n, f"{note} ({vllm_file})", global_kv_heads=global_heads, global_head_dim=global_dim)


def _layout(caches: list, n: int, source: str, *, attention: list[bool] | None = None, mixer: list[bool] | None = None,
            mlp: str | None = None, **kw: Any) -> LayerLayout:  # fmt: skip
    return LayerLayout(
        caches=tuple(tuple(c) for c in caches),
        attention=tuple(attention if attention is not None else [True] * n),
        mixer=tuple(mixer if mixer is not None else [False] * n),
        mlp=mlp or "",
        sources=(source,),
        **kw,
    )


def _llama4(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    # transformers' Llama4TextConfig: 8192 when the key is absent; null turns chunking off (llama4.py
    # chunks only when the value is truthy)
    chunk = 0 if "attention_chunk_size" in cfg and cfg["attention_chunk_size"] is None else _int(cfg, "attention_chunk_size", source, 8192)
    interval = _int(cfg, "no_rope_layer_interval", source, 4) or 4
    nope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(nope, list) or len(nope) < n:
        raise ModelSpecError(f"{source}: 'no_rope_layers' must list the {n} layers", hint=UNKNOWN_HINT)
    caches = [(Cache(FULL),) if nope[i] == 0 or not chunk else (Cache(CHUNKED, chunk),) for i in range(n)]
    step = _int(cfg, "interleave_moe_layer_step", source, 1)
    mlp = "".join("m" if step > 0 and (i + 1) % step == 0 else "d" for i in range(n))
    src = f"no_rope_layers (0: full attention), attention_chunk_size {chunk}, interleave_moe_layer_step {step} (llama4.py)"
    return _layout(caches, n, src, mlp=mlp)


def _qwen_linear(cfg: Mapping[str, Any], n: int, source: str, vllm_file: str, moe: bool) -> LayerLayout:
    if cfg.get("layer_types") is not None:
        types, how = _list(cfg, "layer_types", source, n), "layer_types"
    else:
        interval = _int(cfg, "full_attention_interval", source, 4) or 1
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
        how = f"full_attention_interval {interval}"
    state, params = _gdn(cfg, source)
    if str(cfg.get("mamba_ssm_dtype")) == "float32":  # Qwen3.5: config.py Qwen3_5ForConditionalGenerationConfig
        state = replace(state, state_fp32=True)
        how += ", mamba_ssm_dtype float32"
    caches, attn = [], []
    for i, t in enumerate(types):
        if t not in ("linear_attention", "full_attention"):
            raise _unknown(source, f"layer_types[{i}]", t)
        attn.append(t == "full_attention")
        caches.append((Cache(FULL),) if t == "full_attention" else (Cache(STATE),))
    return _layout(caches, n, f"{how} ({vllm_file})", attention=attn, mixer=[not a for a in attn],
                   mlp=("m" if moe else "d") * n, mixer_params=params, state=state)  # fmt: skip


def _kimi_linear(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    lin = cfg.get("linear_attn_config")
    if not isinstance(lin, Mapping) or not isinstance(lin.get("kda_layers"), list):
        raise ModelSpecError(f"{source}: linear_attn_config.kda_layers is missing", hint=UNKNOWN_HINT)
    kda = {int(x) for x in lin["kda_layers"] if isinstance(x, int)}
    heads, dim = _int(lin, "num_heads", source), _int(lin, "head_dim", source)
    conv = _int(lin, "short_conv_kernel_size", source, 4)
    state = StateShape("kda", 3 * heads * dim, conv - 1, heads, dim, dim, state_fp32=True)
    h = _int(cfg, "hidden_size", source)
    params = h * heads * dim * 4 + 3 * heads * dim * conv + heads * dim * h + 4 * h * dim  # q/k/v/g, conv, o, the f/b low-rank gates
    is_kda = [(i + 1) in kda for i in range(n)]
    caches = [(Cache(STATE),) if k else (Cache(FULL),) for k in is_kda]
    first_dense = _int(cfg, "first_k_dense_replace", source, 0)
    mlp = "".join("d" if i < first_dense else "m" for i in range(n))
    return _layout(caches, n, "linear_attn_config.kda_layers (1-based; the others MLA; vllm/models/kimi_k3)",
                   attention=[not k for k in is_kda], mixer=is_kda, mlp=mlp, mixer_params=params, state=state)  # fmt: skip


def _nemotron_h(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        letters, how = pattern, "hybrid_override_pattern"
    else:
        blocks = _list(cfg, "layers_block_type", source, n)
        names = {"mamba": "M", "attention": "*", "full_attention": "*", "mlp": "-", "moe": "E"}
        letters = ""
        for i, b in enumerate(blocks):
            if b not in names:
                raise _unknown(source, f"layers_block_type[{i}]", b)
            letters += names[b]
        how = "layers_block_type"
    if len(letters) < n:
        raise ModelSpecError(f"{source}: {how} has {len(letters)} layers, num_hidden_layers {n}", hint=UNKNOWN_HINT)
    for i, ch in enumerate(letters[:n]):
        if ch not in "M*-E":
            raise _unknown(source, f"{how}[{i}]", ch)
    letters = letters[:n]
    heads, hd = _int(cfg, "mamba_num_heads", source), _int(cfg, "mamba_head_dim", source)
    # n_groups (transformers' NemotronHConfig also takes mamba_n_groups; 8 when neither is set)
    groups = _int(cfg, "n_groups", source, cfg.get("mamba_n_groups", 8))
    st, conv = _int(cfg, "ssm_state_size", source), _int(cfg, "conv_kernel", source)
    fp32 = str(cfg.get("mamba_ssm_cache_dtype", "float32")) == "float32"
    state = _mamba2(heads * hd, groups, heads, hd, st, conv, fp32)
    h = _int(cfg, "hidden_size", source)
    return _layout(
        [(Cache(STATE),) if c == "M" else (Cache(FULL),) if c == "*" else () for c in letters], n, f"{how} (nemotron_h.py)",
        attention=[c == "*" for c in letters], mixer=[c == "M" for c in letters],
        mlp="".join({"-": "d", "E": "m"}.get(c, "-") for c in letters),
        mixer_params=_mamba2_params(h, heads * hd, groups, heads, st, conv), state=state, mlp_matrices=2,
    )  # fmt: skip


def _mamba_fields(cfg: Mapping[str, Any], source: str, prefix: str, names: tuple[str, str, str, str, str]) -> tuple[int, ...]:
    return tuple(_int(cfg, prefix + k, source) for k in names)


def _granite_h(cfg: Mapping[str, Any], n: int, source: str, moe: bool) -> LayerLayout:
    types = _list(cfg, "layer_types", source, n) if cfg.get("layer_types") is not None else _list(cfg, "layers_block_type", source, n)
    h = _int(cfg, "hidden_size", source)
    heads, hd, st, groups, conv = _mamba_fields(cfg, source, "mamba_", ("n_heads", "d_head", "d_state", "n_groups", "d_conv"))
    inter = _int(cfg, "mamba_expand", source, 2) * h
    attn = []
    for i, t in enumerate(types):
        if t not in ("mamba", "attention"):
            raise _unknown(source, f"layer_types[{i}]", t)
        attn.append(t == "attention")
    return _layout([(Cache(FULL),) if a else (Cache(STATE),) for a in attn], n, "layer_types mamba / attention (granitemoehybrid.py)",
                   attention=attn, mixer=[not a for a in attn], mlp=("m" if moe else "d") * n,
                   mixer_params=_mamba2_params(h, inter, groups, heads, st, conv), state=_mamba2(inter, groups, heads, hd, st, conv, False))  # fmt: skip


def _jamba(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    period, offset = _int(cfg, "attn_layer_period", source, 8), _int(cfg, "attn_layer_offset", source, 4)
    e_period, e_offset = _int(cfg, "expert_layer_period", source, 2), _int(cfg, "expert_layer_offset", source, 1)
    h = _int(cfg, "hidden_size", source)
    st, conv, expand = _int(cfg, "mamba_d_state", source, 16), _int(cfg, "mamba_d_conv", source, 4), _int(cfg, "mamba_expand", source, 2)
    inter = expand * h
    dt_rank = _int(cfg, "mamba_dt_rank", source, -(-h // 16)) if cfg.get("mamba_dt_rank") != "auto" else -(-h // 16)
    attn = [period > 0 and i % period == offset for i in range(n)]
    mlp = "".join("m" if e_period and i % e_period == e_offset else "d" for i in range(n))
    # mamba1: in_proj, conv1d, x_proj, dt_proj, A, D, out_proj (mamba_mixer.py)
    params = h * 2 * inter + inter * conv + inter * (dt_rank + 2 * st) + dt_rank * inter + inter * st + inter + inter * h
    return _layout([(Cache(FULL),) if a else (Cache(STATE),) for a in attn], n,
                   f"attn_layer_period {period} / attn_layer_offset {offset}, MoE every {e_period} from {e_offset} (jamba.py)",
                   attention=attn, mixer=[not a for a in attn], mlp=mlp, mixer_params=params,
                   state=StateShape("mamba1", inter, conv - 1, inter, 1, st))  # fmt: skip


def _falcon_h1(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    h = _int(cfg, "hidden_size", source)
    heads, hd, st, groups, conv = _mamba_fields(cfg, source, "mamba_", ("n_heads", "d_head", "d_state", "n_groups", "d_conv"))
    inter = cfg.get("mamba_d_ssm") or int(_int(cfg, "mamba_expand", source, 2) * h)
    inter = _int({"mamba_d_ssm": inter}, "mamba_d_ssm", source)
    return _layout([(Cache(FULL), Cache(STATE))] * n, n, "attention and Mamba2 in every layer (falcon_h1.py)", mixer=[True] * n,
                   mixer_params=_mamba2_params(h, inter, groups, heads, st, conv), state=_mamba2(inter, groups, heads, hd, st, conv, False))  # fmt: skip


def _zamba2(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    types = _list(cfg, "layers_block_type", source, n)
    h = _int(cfg, "hidden_size", source)
    heads, hd = _int(cfg, "n_mamba_heads", source), _int(cfg, "mamba_headdim", source)
    st, groups, conv = _int(cfg, "mamba_d_state", source), _int(cfg, "mamba_ngroups", source, 1), _int(cfg, "mamba_d_conv", source, 4)
    inter = _int(cfg, "mamba_expand", source, 2) * h
    caches = []
    for i, t in enumerate(types):
        if t not in ("mamba", "hybrid"):
            raise _unknown(source, f"layers_block_type[{i}]", t)
        caches.append((Cache(STATE), Cache(FULL)) if t == "hybrid" else (Cache(STATE),))
    # the hybrid layers share num_mem_blocks attention+MLP blocks: counted once each, on the first hybrid layers
    shared = _int(cfg, "num_mem_blocks", source, 1)
    hybrid = [i for i, t in enumerate(types) if t == "hybrid"][:shared]
    attn = [i in hybrid for i in range(n)]
    return _layout(caches, n, "layers_block_type mamba / hybrid (zamba2.py)", attention=attn, mixer=[True] * n,
                   mlp="".join("d" if a else "-" for a in attn),
                   mixer_params=_mamba2_params(h, inter, groups, heads, st, conv), state=_mamba2(inter, groups, heads, hd, st, conv, False))  # fmt: skip


def _pure_ssm(cfg: Mapping[str, Any], n: int, source: str, kind: str) -> LayerLayout:
    h = _int(cfg, "hidden_size", source)
    if kind == "mamba2":
        heads, hd, st = _int(cfg, "num_heads", source), _int(cfg, "head_dim", source), _int(cfg, "state_size", source)
        groups, conv = _int(cfg, "n_groups", source, 1), _int(cfg, "conv_kernel", source, 4)
        inter = _int(cfg, "expand", source, 2) * h
        return _layout([(Cache(STATE),)] * n, n, "every layer Mamba2 (mamba2.py)", attention=[False] * n, mixer=[True] * n,
                       mlp="-" * n, mixer_params=_mamba2_params(h, inter, groups, heads, st, conv),
                       state=_mamba2(inter, groups, heads, hd, st, conv, False))  # fmt: skip
    inter, st, conv = _int(cfg, "intermediate_size", source), _int(cfg, "state_size", source), _int(cfg, "conv_kernel", source, 4)
    dt_rank = _int(cfg, "time_step_rank", source, -(-h // 16))
    params = h * 2 * inter + inter * conv + inter * (dt_rank + 2 * st) + dt_rank * inter + inter * st + inter + inter * h
    return _layout([(Cache(STATE),)] * n, n, "every layer Mamba (mamba.py)", attention=[False] * n, mixer=[True] * n, mlp="-" * n,
                   mixer_params=params, state=StateShape("mamba1", inter, conv - 1, inter, 1, st))  # fmt: skip


def _sparse_mla(cfg: Mapping[str, Any], n: int, source: str) -> LayerLayout:
    dim = _int(cfg, "index_head_dim", source, 128)
    first_dense = _int(cfg, "first_k_dense_replace", source, 0)
    mlp = "".join("d" if i < first_dense else "m" for i in range(n))
    return _layout([(Cache(FULL), Cache(INDEXER))] * n, n, f"index_topk set: MLA + indexer keys of index_head_dim {dim} (deepseek_v2.py Indexer)",
                   mlp=mlp, indexer_bytes=dim + dim // 128 * 4)  # fmt: skip


# model_type -> how its layers are read
SLIDING_FILES = {"gemma2": "gemma2.py", "gemma3_text": "gemma3.py", "gemma3": "gemma3.py", "gemma4_text": "gemma4.py",
                 "gemma4": "gemma4.py", "cohere2": "commandr.py", "gpt_oss": "gpt_oss.py", "mistral": "llama.py",
                 "ministral": "llama.py", "ministral3": "llama.py", "llama": "llama.py"}  # fmt: skip
# model types vLLM has no model for in the versions orch plans for (0.29.0, 0.32.0 registry.py)
UNSUPPORTED = {"minimax_text_01": "MiniMax-Text-01 / MiniMax-M1 (lightning attention)", "minimax_m1": "MiniMax-M1 (lightning attention)"}
# fields that describe non-full-attention layers: a config with one of them and no reader is refused
HYBRID_FIELDS = ("layers_block_type", "hybrid_override_pattern", "attn_type_list", "linear_attn_config", "full_attention_interval",
                 "attention_chunk_size", "attn_layer_period")  # fmt: skip


def layer_layout(cfg: Mapping[str, Any], source: str, layers: int) -> LayerLayout | None:
    """The layers of a (text) config, or None when every layer is full attention with a dense or
    uniform MLP (the plain transformer the rest of the planner sizes)."""
    kind = str(cfg.get("model_type") or "")
    n = layers
    if kind in UNSUPPORTED:
        raise ModelSpecError(f"{source}: {UNSUPPORTED[kind]} has no model in the vLLM versions orch plans for (registry.py of 0.29.0 and 0.32.0)",
                             hint="vLLM cannot serve this model type; pick a model vLLM lists")  # fmt: skip
    if cfg.get("index_topk") is not None:
        return _sparse_mla(cfg, n, source)
    if kind in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_moe"):
        return _qwen_linear(cfg, n, source, "qwen3_next.py" if kind == "qwen3_next" else "qwen3_5.py", moe=bool(cfg.get("num_experts")))
    if kind == "kimi_linear" or cfg.get("linear_attn_config") is not None:
        return _kimi_linear(cfg, n, source)
    if kind == "nemotron_h" or cfg.get("hybrid_override_pattern") is not None:
        return _nemotron_h(cfg, n, source)
    if kind == "granitemoehybrid":
        return _granite_h(cfg, n, source, moe=bool(cfg.get("num_local_experts")))
    if kind == "jamba":
        return _jamba(cfg, n, source)
    if kind == "falcon_h1":
        return _falcon_h1(cfg, n, source)
    if kind == "zamba2":
        return _zamba2(cfg, n, source)
    if kind in ("mamba2", "mamba", "falcon_mamba"):
        return _pure_ssm(cfg, n, source, "mamba2" if kind == "mamba2" else "mamba1")
    if kind in ("llama4_text", "llama4"):
        return _llama4(cfg, n, source)
    if kind in SLIDING_FILES:
        return _plain_or_sliding(cfg, n, source, kind)
    for key in HYBRID_FIELDS:
        if cfg.get(key) is not None:
            raise ModelSpecError(f"{source}: '{key}' describes layers that are not full attention, and orch has no reader for model_type {kind!r}",
                                 hint=UNKNOWN_HINT)  # fmt: skip
    return _layer_types_only(cfg, n, source, kind)


def _plain_or_sliding(cfg: Mapping[str, Any], n: int, source: str, kind: str) -> LayerLayout | None:
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if kind in ("llama", "mistral", "ministral", "ministral3"):
        if types is not None:
            if all(t == "full_attention" for t in _list(cfg, "layer_types", source, n)):
                return None
            return _sliding_family(cfg, n, source, kind, "llama.py")
        if window is None or cfg.get("use_sliding_window") is False:
            return None
        w = _int(cfg, "sliding_window", source)
        if w == 0:  # vLLM: a 0 window means none (config/model.py)
            return None
        return _layout([(Cache(SLIDING, w),)] * n, n, f"sliding_window {w} on every layer (the engine-wide window; llama.py)")
    return _sliding_family(cfg, n, source, kind, SLIDING_FILES[kind])


def _layer_types_only(cfg: Mapping[str, Any], n: int, source: str, kind: str) -> LayerLayout | None:
    """Any other family: a layer_types list must say full attention everywhere (Qwen2/3 write it so)."""
    types = cfg.get("layer_types")
    if types is None:
        return None
    for i, t in enumerate(_list(cfg, "layer_types", source, n)):
        if t != "full_attention":
            raise _unknown(source, f"layer_types[{i}] (model_type {kind!r})", t)
    return None
