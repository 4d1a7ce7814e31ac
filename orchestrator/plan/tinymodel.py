"""Build the small random-weight Llama that the local demo and the tests serve. Writes files.

No model can be downloaded here, so the demo model is made on the spot: a transformers
``LlamaConfig`` with random weights and a byte-level BPE tokenizer trained on a few lines of text.
It is a real vLLM model (head_dim 64: vLLM's CPU attention rejects 16). Built in a few seconds,
cached by a fingerprint of its recipe so a second call reuses the folder.
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


def recipe_fingerprint() -> str:
    blob = json.dumps({"config": TINY_CONFIG, "corpus": _CORPUS, "chat": _CHAT_TEMPLATE, "v": 1}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    base = os.environ.get("ORCH_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "orch")
    return Path(base)


def build_tiny_model(dest: Path | None = None, seed: int = 0) -> Path:
    """Build (or reuse) the tiny model folder and return its path.

    The folder holds config.json, model.safetensors, the tokenizer files and a chat template, so
    vLLM, transformers and orch's planner all read it like any Hugging Face model folder.
    """
    dest = Path(dest) if dest is not None else default_cache_dir() / f"tiny-llama-{recipe_fingerprint()}"
    marker = dest / ".orch-tiny-model"
    if marker.exists() and marker.read_text().strip() == recipe_fingerprint():
        return dest

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    torch.manual_seed(seed)
    cfg = dict(TINY_CONFIG)
    cfg.pop("torch_dtype")
    config = LlamaConfig(**cfg, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers types .to() as a decorator
    model.save_pretrained(tmp, safe_serialization=True)

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
    data.setdefault("head_dim", TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"])
    cfg_path.write_text(json.dumps(data, indent=2))
    (tmp / ".orch-tiny-model").write_text(recipe_fingerprint())

    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    return dest
