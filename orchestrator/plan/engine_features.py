"""Engine features that take GPU memory: LoRA slots and speculative decoding. Pure.

Both are allocated when vLLM loads the model, before it profiles memory, so whatever they take
comes out of the KV cache (vLLM 0.32.0 sources; the same classes in 0.29.0):

**LoRA** (``enable_lora``, ``max_loras``, ``max_lora_rank``, ``max_cpu_loras``): ``LoRAModelManager``
wraps every linear module and the embedding modules of the model (``vllm/lora/model_manager.py
_create_lora_modules``, ``vllm/lora/utils.py get_supported_lora_modules``) and each wrapper's
``create_lora_weights`` allocates ``max_loras`` A and B matrices of ``max_lora_rank`` at the LoRA
dtype (the model's), whether or not an adapter is loaded:

- column-parallel (``qkv_proj``: 3 slices q/k/v, ``gate_up_proj``: 2 slices;
  ``vllm/lora/layers/column_parallel_linear.py``): per slice A = rank x hidden (whole), B = the
  slice's output on this rank x rank;
- row-parallel (``o_proj``, ``down_proj``; ``row_parallel_linear.py``): A = rank x this rank's input,
  B = hidden (whole) x rank;
- ``embed_tokens`` (``vocab_parallel_embedding.py``): A = vocab x rank, B = hidden x rank, whole on
  every rank; the output head through ``LogitsProcessorWithLoRA`` (``logits_processor.py``): A = rank
  x hidden, B = vocab x rank.

``max_cpu_loras`` adapters are cached in CPU memory, not on the GPU. The MoE experts
(``vllm/lora/layers/fused_moe.py``) and MLA's projections have their own LoRA layers, which orch does
not size: LoRA on such a model is refused rather than undercounted.

**Speculative decoding** (``speculative_config``: method, draft model, ``num_speculative_tokens``;
``vllm/config/speculative.py``, ``vllm/v1/spec_decode/``): the proposer loads its draft in the same
worker after the target (``llm_base_proposer.py load_model``), and the draft's attention layers get
KV cache pages beside the target's (one more layer per draft layer in every token's KV bytes):

- ``ngram``: no weights, no KV cache;
- ``draft_model``: a whole second model (its embeddings, layers and head), split by the target's TP;
- ``eagle`` (``models/llama_eagle.py``): the head's decoder layers plus ``fc`` (2 x hidden -> hidden,
  ``ReplicatedLinear``); embeddings and output head shared with the target (``_maybe_share_*``);
- ``eagle3`` (``models/llama_eagle3.py``): the same with layer 0's q/k/v reading 2 x hidden, ``fc``
  from 3 x the target's hidden, its own head of ``draft_vocab_size`` rows and an int64 ``d2t`` map;
- ``mtp``: the target's own MTP layers (``num_nextn_predict_layers``: 1 for DeepSeek-V3/R1, GLM-4.5,
  Qwen3-Next): one decoder layer like the target's last, ``eh_proj`` (2 x hidden -> hidden,
  ``nn.Linear``, unquantized) and two norms; embeddings and head shared (``models/deepseek_mtp.py``).

Each running sequence also holds ``num_speculative_tokens`` lookahead slots (``scheduler.py``:
``1 + num_spec_tokens + num_lookahead_tokens`` per decode step), said in the plan's reasons.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import PlanError
from orchestrator.plan.catalog import DTYPE_BYTES, ModelSpec
from orchestrator.plan.memory import GIB, kv_bytes_per_token, norm_params, stage_weight_bytes
from orchestrator.plan.modules import quantized_layer_bytes_per_gpu
from orchestrator.plan.sharding import Sharding, linear_params_per_gpu

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm/config/lora.py MaxLoRARanks
LORA_MAX_VOCAB = 258048  # LogitsProcessorWithLoRA.create_lora_weights refuses a larger vocab
SPECULATIVE_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp")
# model_type values whose checkpoints carry MTP layers vLLM loads as a draft (vllm/config/speculative.py
# hf_config_override: deepseek_mtp, glm4_moe_mtp, qwen3_next_mtp, ...)
MTP_ARCHITECTURES = ("deepseek_v3", "deepseek_v32", "glm4_moe", "qwen3_next", "mimo", "ernie4_5_moe")
MTP_LAYERS = 1


@dataclass(frozen=True)
class LoraOptions:
    """vLLM's LoRA settings (``LoRAConfig``); ``max_cpu_loras`` None: vLLM's default (= max_loras)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def engine_kwargs(self) -> dict:
        out: dict = {"enable_lora": True, "max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank}
        if self.max_cpu_loras is not None:
            out["max_cpu_loras"] = self.max_cpu_loras
        return out

    @classmethod
    def from_engine_kwargs(cls, engine: Mapping[str, Any]) -> LoraOptions | None:
        """The settings ``engine_kwargs`` (rendered or stored) start vLLM with; None: LoRA off.
        The inverse of ``engine_kwargs``, with vLLM's defaults for what it leaves out."""
        if not engine.get("enable_lora"):
            return None
        cpu = engine.get("max_cpu_loras")
        return cls(max_loras=int(engine.get("max_loras") or cls.max_loras), max_lora_rank=int(engine.get("max_lora_rank") or cls.max_lora_rank),
                   max_cpu_loras=int(cpu) if isinstance(cpu, int) else None)  # fmt: skip


@dataclass(frozen=True)
class SpeculativeOptions:
    """A speculative config: ``draft`` is the draft model's (or EAGLE head's) spec, read from
    ``model``'s config.json; ``draft_vocab``: an EAGLE-3 head's ``draft_vocab_size``."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    draft: ModelSpec | None = None
    draft_vocab: int | None = None

    def engine_kwargs(self) -> dict:
        config: dict = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            config["model"] = self.model
        return {"speculative_config": config}


def check_features(spec: ModelSpec, lora: LoraOptions | None, spec_dec: SpeculativeOptions | None) -> None:
    """Refuse what vLLM would refuse, or what orch cannot size, naming the flag (exit 2)."""
    if lora is not None:
        if lora.max_loras < 1:
            raise PlanError(f"--max-loras must be at least 1, got {lora.max_loras}")
        if lora.max_lora_rank not in LORA_RANKS:
            raise PlanError(f"--max-lora-rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's MaxLoRARanks), got {lora.max_lora_rank}")
        if lora.max_cpu_loras is not None and lora.max_cpu_loras < lora.max_loras:
            raise PlanError(f"--max-cpu-loras ({lora.max_cpu_loras}) must be at least --max-loras ({lora.max_loras}), as vLLM requires",
                            hint="raise --max-cpu-loras or leave it out (vLLM's default is max_loras)")  # fmt: skip
        if spec.vocab > LORA_MAX_VOCAB:
            raise PlanError(f"--enable-lora: {spec.name}'s vocabulary of {spec.vocab:,} exceeds the {LORA_MAX_VOCAB:,} vLLM's LoRA supports")
        if spec.is_moe or spec.is_mla:
            raise PlanError(
                f"--enable-lora: orch sizes LoRA slots for dense attention models; {spec.name} is "
                f"{'an MoE' if spec.is_moe else 'an MLA'} model, whose LoRA layers (vllm/lora/layers/fused_moe.py, MLA's projections) it does not size",
                hint="plan without --enable-lora and leave room with --gpu-memory-utilization, or serve a dense model",
            )
    if spec_dec is None:
        return
    method = spec_dec.method
    if method not in SPECULATIVE_METHODS:
        raise PlanError(f"--speculative-method {method!r}: orch sizes {', '.join(SPECULATIVE_METHODS)}")
    if spec_dec.num_speculative_tokens < 1:
        raise PlanError(f"--num-speculative-tokens must be at least 1, got {spec_dec.num_speculative_tokens}")
    needs_model = method in ("draft_model", "eagle", "eagle3")
    if needs_model and spec_dec.draft is None:
        raise PlanError(f"--speculative-method {method} needs --speculative-model (the draft's folder or config.json)")
    if not needs_model and spec_dec.model is not None:
        raise PlanError(f"--speculative-model: --speculative-method {method} takes no draft model",
                        hint="leave out --speculative-model" + (" (MTP uses the model's own MTP layers)" if method == "mtp" else ""))  # fmt: skip
    if method == "mtp" and spec.architecture not in MTP_ARCHITECTURES:
        raise PlanError(f"--speculative-method mtp: {spec.name} ({spec.architecture or 'unknown model_type'}) has no MTP layers vLLM loads",
                        hint=f"MTP drafts exist for {', '.join(MTP_ARCHITECTURES)}; use eagle3, draft_model or ngram")  # fmt: skip
    draft = spec_dec.draft
    if draft is not None and draft.vocab != spec.vocab and method == "draft_model":
        raise PlanError(f"--speculative-model: the draft's vocabulary ({draft.vocab:,}) differs from {spec.name}'s ({spec.vocab:,}); "
                        "vLLM needs the same tokenizer")  # fmt: skip


def _dense_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def lora_bytes_per_gpu(spec: ModelSpec, lora: LoraOptions, *, layers: int, tp: int, first: bool, last: bool, dtype: str) -> float:
    """Bytes of the LoRA slots on one GPU of a stage holding ``layers`` decoder layers (see the module docstring)."""
    n, r, h = lora.max_loras, lora.max_lora_rank, spec.hidden
    q_out = spec.heads * spec.head_dim
    kv_out = max(1, spec.kv_heads // tp) * spec.head_dim  # QKVParallelLinear's KV heads on this rank
    inter = spec.intermediate
    per_layer = (
        3 * r * h + r * (q_out / tp + 2 * kv_out)  # qkv_proj: 3 A slices of the whole hidden, B per slice
        + r * q_out / tp + h * r  # o_proj (row-parallel)
        + 2 * r * h + r * 2 * inter / tp  # gate_up_proj: 2 slices
        + r * inter / tp + h * r  # down_proj (row-parallel)
    )
    total = layers * per_layer
    if first:
        total += spec.vocab * r + h * r  # embed_tokens
    if last:
        total += r * h + spec.vocab * r  # the output head's LogitsProcessorWithLoRA
    return n * total * _dense_bytes(dtype)


def _draft_layers_bytes(draft: ModelSpec, sh: Sharding, dtype: str) -> float:
    return sum(linear_params_per_gpu(draft, i, sh) for i in range(draft.layers)) * _dense_bytes(dtype) + draft.layers * norm_params(draft) * _dense_bytes(dtype)


def draft_weight_bytes(spec: ModelSpec, sd: SpeculativeOptions, *, tp: int, dtype: str) -> float:
    """Bytes of the draft's weights on one GPU (the proposer's model; see the module docstring)."""
    b = _dense_bytes(dtype)
    sh = Sharding(tp=tp)
    draft = sd.draft
    if sd.method == "ngram":
        return 0.0
    if sd.method == "draft_model":
        assert draft is not None
        return stage_weight_bytes(draft, 0, draft.layers, tp=tp, first=True, last=True, dtype=draft.dtype)
    if sd.method == "mtp":
        last = spec.layers - 1
        if spec.quantization is not None and dtype == spec.dtype:
            layer = quantized_layer_bytes_per_gpu(spec, last, sh)
        else:
            layer = linear_params_per_gpu(spec, last, sh) * DTYPE_BYTES[dtype]
        return MTP_LAYERS * (layer + (norm_params(spec) + 3 * spec.hidden) * b + 2 * spec.hidden * spec.hidden * b)
    assert draft is not None
    total = _draft_layers_bytes(draft, sh, dtype)
    if sd.method == "eagle":
        return total + 2 * draft.hidden * draft.hidden * b  # fc: ReplicatedLinear(2H, H)
    # eagle3: layer 0's qkv reads 2H (one more H of inputs), fc from 3 x the target's hidden, own head
    qkv_out = draft.heads * draft.head_dim / tp + 2 * max(1, draft.kv_heads // tp) * draft.head_dim
    vocab = sd.draft_vocab or draft.vocab
    total += draft.hidden * qkv_out * b + 3 * spec.hidden * draft.hidden * b + vocab * draft.hidden / tp * b
    return total + (vocab * 8 if vocab != spec.vocab else 0)  # the int64 d2t map


def draft_kv_bytes_per_token(spec: ModelSpec, sd: SpeculativeOptions, *, tp: int, s: float) -> float:
    """KV bytes per token the draft's attention layers add on one GPU."""
    if sd.method == "ngram":
        return 0.0
    if sd.method == "mtp":
        return kv_bytes_per_token(spec, layers=MTP_LAYERS, tp=tp, s=s)
    assert sd.draft is not None
    return kv_bytes_per_token(sd.draft, tp=tp, s=s)


def features_json(spec: ModelSpec, lora: LoraOptions | None, sd: SpeculativeOptions | None, *, tp: int, pp: int, first_layers: int,
                  dtype: str, s: float) -> dict:  # fmt: skip
    """The engine arguments of the features and what they take on one GPU (the first stage's LoRA
    slots: all of them when PP=1; the draft on the last stage)."""
    lora_b = lora_bytes_per_gpu(spec, lora, layers=first_layers, tp=tp, first=True, last=pp == 1, dtype=dtype) if lora else 0.0
    draft_b = draft_weight_bytes(spec, sd, tp=tp, dtype=dtype) if sd else 0.0
    draft_kv = draft_kv_bytes_per_token(spec, sd, tp=tp, s=s) if sd else 0.0
    kwargs = {**(lora.engine_kwargs() if lora else {}), **(sd.engine_kwargs() if sd else {})}
    return {"engine_kwargs": kwargs, "lora_gib_per_gpu": round(lora_b / GIB, 4), "draft_gib_per_gpu": round(draft_b / GIB, 4),
            "draft_kv_bytes_per_token_per_gpu": draft_kv}  # fmt: skip


def describe_features(lora: LoraOptions | None, sd: SpeculativeOptions | None, figures: dict) -> list[str]:
    """The plan's reasons for the features it sized."""
    out = []
    if lora is not None:
        out.append(f"LoRA: {lora.max_loras} slot(s) of rank {lora.max_lora_rank} on every LoRA-able module (qkv, o, gate_up, down, "
                   f"embeddings, head): {figures['lora_gib_per_gpu']:.2f} GiB per GPU allocated at load, out of the KV cache; "
                   f"{lora.max_cpu_loras or lora.max_loras} adapter(s) cached in CPU memory")  # fmt: skip
    if sd is not None:
        what = {"ngram": "n-gram lookup, no draft weights", "draft_model": f"draft model {sd.model}", "eagle": f"EAGLE head {sd.model}",
                "eagle3": f"EAGLE-3 head {sd.model}", "mtp": f"{MTP_LAYERS} MTP layer(s) of the model"}[sd.method]  # fmt: skip
        out.append(f"speculative decoding ({sd.method}, {sd.num_speculative_tokens} token(s)): {what}; "
                   f"{figures['draft_gib_per_gpu']:.2f} GiB of draft weights and {figures['draft_kv_bytes_per_token_per_gpu']:,.0f} "
                   f"KV bytes per token per GPU; each running sequence also holds {sd.num_speculative_tokens} lookahead slot(s)")  # fmt: skip
    return out


def feature_bytes(spec: ModelSpec, lora: LoraOptions | None, sd: SpeculativeOptions | None, *, layers: int, tp: int, first: bool,
                  last: bool, dtype: str, s: float) -> tuple[float, float]:  # fmt: skip
    """(weight bytes, KV bytes per token) the features add on one GPU of a stage; the draft runs on the last."""
    weights = lora_bytes_per_gpu(spec, lora, layers=layers, tp=tp, first=first, last=last, dtype=dtype) if lora is not None else 0.0
    kv = 0.0
    if sd is not None and last:
        weights += draft_weight_bytes(spec, sd, tp=tp, dtype=dtype)
        kv = draft_kv_bytes_per_token(spec, sd, tp=tp, s=s)
    return weights, kv
