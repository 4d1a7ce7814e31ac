"""Build the small random-weight models that the local demo and the tests serve. Writes files.

No model can be downloaded here, so the models are made on the spot: a transformers config with
random weights and a byte-level BPE tokenizer trained on a few lines of text. ``build_tiny_model``
makes the demo's Llama; ``build_tiny_moe`` a mixture-of-experts model of the same size, shaped
like Qwen3-MoE (``qwen3_moe``) or like DeepSeek-V2-Lite with MLA attention (``deepseek_v2``). They
are real vLLM models: head_dim 64 (vLLM's CPU attention rejects 16) and, for MLA, the latent
kv_lora_rank 512 + rope 64 = 576 that vLLM 0.32's CPU MLA kernel is built for
(``vllm/v1/attention/backends/mla/cpu_mla.py``). Built in a few seconds, cached by a fingerprint
of the recipe so a second call reuses the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

# The recipe. hidden 256 / 4 heads = head_dim 64; 2 KV heads (GQA), 4 layers, ffn 512, vocab 512.
TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SERVED_NAME = "tiny"
_CORPUS = [
    "orch deploys vLLM on a cluster of GPU machines through Ray.",
    "Tensor parallelism inside a node, pipeline parallelism across nodes.",
    "The KV cache grows with the sequence length and the number of users.",
    "Time to first token and time per output token are measured at p50 and p95.",
    "Hello! How can I help you today? The quick brown fox jumps over the lazy dog.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}",
]
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# The MoE recipes: the Llama's attention and size, 8 routed experts of which 2 per token, so that
# expert parallelism over 2 ranks puts 4 on each. Field names are the transformers config's.
TINY_MOE_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "num_experts": 8,
        "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    },
    "deepseek_v2": {
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64,
        "topk_method": "greedy", "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
        "norm_topk_prob": False, "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    },
}  # fmt: skip
TINY_MOE_NAMES = {"qwen3_moe": "tiny-moe", "deepseek_v2": "tiny-mla-moe"}


def recipe_fingerprint(config: dict[str, Any] | None = None) -> str:
    blob = json.dumps({"config": config or TINY_CONFIG, "corpus": _CORPUS, "chat": _CHAT_TEMPLATE, "v": 1}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    base = os.environ.get("ORCH_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "orch")
    return Path(base)


def default_tiny_dir() -> Path:
    """Where the demo's model is built when the manifest sets no model_store."""
    return default_cache_dir() / f"tiny-llama-{recipe_fingerprint()}"


def build_tiny_model(dest: Path | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the tiny model folder and return its path.

    The folder holds config.json, model.safetensors, the tokenizer files and a chat template, so
    vLLM, transformers and orch's planner all read it like any Hugging Face model folder.
    """
    dest = Path(dest) if dest is not None else default_tiny_dir()

    def model(tmp: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        cfg = dict(TINY_CONFIG)
        cfg.pop("torch_dtype")
        config = LlamaConfig(**cfg, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)  # type: ignore[arg-type]  # transformers types .to() as a decorator

    head_dim = TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"]
    return _build(dest, recipe_fingerprint(), model, {"head_dim": head_dim})


def build_tiny_moe(dest: Path | None = None, kind: str = "qwen3_moe", seed: int = 0) -> Path:
    """Build (or reuse) a tiny random-weight mixture-of-experts model (``TINY_MOE_CONFIGS[kind]``)
    with the demo's tokenizer, and return its folder."""
    if kind not in TINY_MOE_CONFIGS:
        raise ValueError(f"unknown tiny MoE kind {kind!r}: one of {', '.join(TINY_MOE_CONFIGS)}")
    recipe = TINY_MOE_CONFIGS[kind]
    fingerprint = recipe_fingerprint({"kind": kind, **recipe})
    dest = Path(dest) if dest is not None else default_cache_dir() / f"{TINY_MOE_NAMES[kind]}-{fingerprint}"

    def model(tmp: Path) -> None:
        import torch
        import transformers

        config_cls, model_cls = {"qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
                                 "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM")}[kind]  # fmt: skip
        torch.manual_seed(seed)
        config = getattr(transformers, config_cls)(**recipe, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        getattr(transformers, model_cls)(config).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)

    return _build(dest, fingerprint, model, {})


def _build(dest: Path, fingerprint: str, write_model: Any, config_defaults: dict[str, Any]) -> Path:
    """Write the model (``write_model(folder)``) and the tokenizer into a temporary folder, then
    rename it to ``dest``; a folder already built from the same recipe is reused."""
    marker = dest / ".orch-tiny-model"
    if marker.exists() and marker.read_text().strip() == fingerprint:
        return dest

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_model(tmp)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_CONFIG["vocab_size"],
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(tmp)

    # config.json must say bfloat16 whatever transformers wrote, so vLLM and the planner agree.
    cfg_path = tmp / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = "bfloat16"
    for key, value in config_defaults.items():
        data.setdefault(key, value)
    cfg_path.write_text(json.dumps(data, indent=2))
    (tmp / ".orch-tiny-model").write_text(fingerprint)

    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    return dest
