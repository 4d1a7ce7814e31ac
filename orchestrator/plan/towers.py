"""The vision and audio towers of multimodal checkpoints, counted from their config. Pure.

vLLM loads the whole checkpoint of a vision-language model: besides the text model, the vision
tower and the projector into the text model's width (``_mark_tower_model`` in
``vllm/model_executor/models/interfaces.py``: skipped only when ``--limit-mm-per-prompt`` sets
every modality to 0). The towers are built on every pipeline stage and their linear layers are
split over the TP ranks (vLLM's default ``mm_encoder_tp_mode="weights"``); they stay 16-bit.

Parameters per family, following the module definitions (vLLM 0.32 ``model_executor/models/`` and
the checkpoints' transformers classes, which hold the same tensors):

- Qwen2.5-VL (``qwen2_5_vl.py``): Conv3d patch embed (in x temporal x patch^2 x h), ``depth``
  blocks of RMSNorm x 2, qkv + proj with bias, gated MLP (gate, up, down) with bias; the merger
  (RMSNorm, Linear(4h, 4h), Linear(4h, out_hidden_size), with bias).
- Qwen3-VL (``qwen3_vl.py``): Conv3d patch embed with bias, learned position embeddings
  (``num_position_embeddings``), ``depth`` blocks of LayerNorm x 2, qkv + proj, plain MLP
  (fc1, fc2), all with bias; a merger (LayerNorm, Linear(4h, 4h), Linear(4h, out)) plus one per
  ``deepstack_visual_indexes`` entry (whose LayerNorm is 4h wide).
- Gemma 3 (``gemma3_mm.py`` with ``siglip.py``): SigLIP: Conv2d patch embed with bias, position
  embeddings ((image/patch)^2), layers of LayerNorm x 2, q/k/v/out and fc1/fc2 with bias, a post
  LayerNorm; the projector (RMSNorm h, and an h x text-hidden matrix).
- Llama 4 (``mllama4.py``): patch embed (patch^2 x 3 x h, no bias), class and position embeddings,
  pre/post LayerNorms, layers of LayerNorm x 2, q/k/v/o and fc1/fc2 with bias; the pixel-shuffle
  adapter (Linear(projector_input_dim / ratio^2, projector_input_dim), Linear(projector_input_dim,
  projector_output_dim), no bias) and the projector (vision_output_dim x text hidden).
- Mistral Small 3.x / Pixtral (``mistral3.py``, ``pixtral.py``): Conv2d patch embed, RMSNorm
  ln_pre, layers of RMSNorm x 2, q/k/v/o and a gated MLP, no bias; the projector (RMSNorm, the
  patch merger Linear(h x merge^2, h), Linear(h, text hidden), Linear(text hidden, text hidden)).

Audio towers (``audio_config``) are counted as a Whisper-style encoder: ``encoder_layers`` of
self-attention (q, v, out with bias, k without) and fc1/fc2 with bias, two LayerNorms each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Towers:
    """Parameters of a checkpoint's non-text parts, and which families they were counted as."""

    vision: int = 0
    audio: int = 0
    projector: int = 0
    kind: str = ""

    @property
    def total(self) -> int:
        return self.vision + self.audio + self.projector


def _num(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return default


def _vit_layer(h: int, inner: int, *, gated: bool, bias: bool, norm_bias: bool) -> int:
    attn = 4 * h * h + (4 * h if bias else 0)
    mlp = (3 if gated else 2) * h * inner + ((2 * inner + h if gated else inner + h) if bias else 0)
    norms = 2 * (2 * h if norm_bias else h)
    return attn + mlp + norms


def _qwen25_vl(vc: Mapping[str, Any], text_hidden: int) -> tuple[int, int]:
    h, inner, depth = _num(vc, "hidden_size", "embed_dim"), _num(vc, "intermediate_size"), _num(vc, "depth")
    patch, temporal, chans = _num(vc, "patch_size", default=14), _num(vc, "temporal_patch_size", default=2), _num(vc, "in_chans", "in_channels", default=3)
    merge = _num(vc, "spatial_merge_size", default=2) ** 2
    out = _num(vc, "out_hidden_size", default=text_hidden)
    vision = chans * temporal * patch * patch * h + depth * _vit_layer(h, inner, gated=True, bias=True, norm_bias=False)
    projector = h + (merge * h) * (merge * h) + merge * h + (merge * h) * out + out
    return vision, projector


def _qwen3_vl(vc: Mapping[str, Any], text_hidden: int) -> tuple[int, int]:
    h, inner, depth = _num(vc, "hidden_size"), _num(vc, "intermediate_size"), _num(vc, "depth")
    patch, temporal, chans = _num(vc, "patch_size", default=16), _num(vc, "temporal_patch_size", default=2), _num(vc, "in_channels", "in_chans", default=3)
    merge = _num(vc, "spatial_merge_size", default=2) ** 2
    out = _num(vc, "out_hidden_size", default=text_hidden)
    vision = chans * temporal * patch * patch * h + h + _num(vc, "num_position_embeddings") * h
    vision += depth * _vit_layer(h, inner, gated=False, bias=True, norm_bias=True)
    mlp = (merge * h) * (merge * h) + merge * h + (merge * h) * out + out
    deepstack = vc.get("deepstack_visual_indexes") or []
    projector = 2 * h + mlp + len(deepstack) * (2 * merge * h + mlp)
    return vision, projector


def _siglip(vc: Mapping[str, Any]) -> int:
    h, inner, layers = _num(vc, "hidden_size"), _num(vc, "intermediate_size"), _num(vc, "num_hidden_layers")
    patch, image, chans = _num(vc, "patch_size", default=14), _num(vc, "image_size", default=224), _num(vc, "num_channels", default=3)
    positions = (image // patch) ** 2 if patch else 0
    return chans * patch * patch * h + h + positions * h + layers * _vit_layer(h, inner, gated=False, bias=True, norm_bias=True) + 2 * h


def _gemma3(vc: Mapping[str, Any], text_hidden: int) -> tuple[int, int]:
    h = _num(vc, "hidden_size")
    return _siglip(vc), h + h * text_hidden


def _llama4(vc: Mapping[str, Any], text_hidden: int) -> tuple[int, int]:
    h, inner, layers = _num(vc, "hidden_size"), _num(vc, "intermediate_size"), _num(vc, "num_hidden_layers")
    patch, image, chans = _num(vc, "patch_size", default=14), _num(vc, "image_size", default=336), _num(vc, "num_channels", default=3)
    positions = (image // patch) ** 2 + 1 if patch else 0
    vision = chans * patch * patch * h + h + positions * h + 2 * 2 * h + layers * _vit_layer(h, inner, gated=False, bias=True, norm_bias=True)
    ratio = vc.get("pixel_shuffle_ratio", 0.5)
    ratio = ratio if isinstance(ratio, (int, float)) and 0 < ratio <= 1 else 0.5
    p_in, p_out = _num(vc, "projector_input_dim", default=4096), _num(vc, "projector_output_dim", default=4096)
    adapter = int(h / (ratio * ratio)) * p_in + p_in * p_out
    return vision + adapter, _num(vc, "vision_output_dim", default=p_out) * text_hidden


def _pixtral(vc: Mapping[str, Any], text_hidden: int, spatial_merge: int) -> tuple[int, int]:
    h, inner, layers = _num(vc, "hidden_size"), _num(vc, "intermediate_size"), _num(vc, "num_hidden_layers")
    patch, chans = _num(vc, "patch_size", default=14), _num(vc, "num_channels", default=3)
    vision = chans * patch * patch * h + h + layers * _vit_layer(h, inner, gated=True, bias=False, norm_bias=False)
    merge = spatial_merge * spatial_merge
    return vision, h + (merge * h) * h + h * text_hidden + text_hidden * text_hidden


def _audio(ac: Mapping[str, Any]) -> int:
    h, inner, layers = _num(ac, "d_model", "hidden_size"), _num(ac, "encoder_ffn_dim", "intermediate_size"), _num(ac, "encoder_layers", "num_hidden_layers")
    if not (h and layers):
        return 0
    per_layer = 4 * h * h + 3 * h + 2 * h * inner + inner + h + 4 * h
    return layers * per_layer + 2 * h


def towers_from_config(config: Mapping[str, Any], text_hidden: int) -> Towers:
    """The towers of a multimodal config (top level, before ``text_config`` is merged)."""
    vc = config.get("vision_config")
    ac = config.get("audio_config")
    kind = str(config.get("model_type", ""))
    vision = projector = audio = 0
    if isinstance(vc, Mapping):
        if kind == "qwen2_5_vl" or kind == "qwen2_vl":
            vision, projector = _qwen25_vl(vc, text_hidden)
        elif kind.startswith("qwen3_vl"):
            vision, projector = _qwen3_vl(vc, text_hidden)
        elif kind == "gemma3":
            vision, projector = _gemma3(vc, text_hidden)
        elif kind == "llama4":
            vision, projector = _llama4(vc, text_hidden)
        elif kind in ("mistral3", "pixtral"):
            vision, projector = _pixtral(vc, text_hidden, _num(config, "spatial_merge_size", default=2))
        else:
            kind = f"{kind} (vision tower counted as a generic ViT)"
            vision = _siglip(vc)
    if isinstance(ac, Mapping):
        audio = _audio(ac)
    return Towers(vision=vision, audio=audio, projector=projector, kind=kind if (vision or audio) else "")
