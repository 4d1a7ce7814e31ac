"""The LoRA and speculative-decoding flags of `orch plan` and `orch rollout`.

The flags are collected into the click context (``expose_value=False``), so a command takes them
with one call, ``feature_options(ctx)``, which also resolves the draft model's config (the one file
read here: the draft's config.json, as ``--model``'s is read). Bad combinations are usage errors
naming the flag (exit 2); what vLLM would refuse is the planner's ``check_features``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from orchestrator.errors import UsageError
from orchestrator.plan.engine_features import LORA_RANKS, SPECULATIVE_METHODS, LoraOptions, SpeculativeOptions
from orchestrator.plan.model_ref import resolve_model

_KEY = "orch_feature_flags"


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta.setdefault(_KEY, {})[param.name] = value
    return value


def feature_flags(command):
    """Add --enable-lora, --max-loras, --max-lora-rank, --max-cpu-loras, --speculative-method,
    --speculative-model and --num-speculative-tokens (vLLM's names) to a command."""
    options = [
        click.option("--enable-lora", is_flag=True, default=False, expose_value=False, callback=_store,
                     help="vLLM enable_lora: serve LoRA adapters; the slots (max_loras x max_lora_rank on every linear module) are sized out of the KV cache."),
        click.option("--max-loras", type=click.IntRange(min=1), default=None, expose_value=False, callback=_store,
                     help="vLLM max_loras: adapters in one batch, each with its GPU slot [default: vLLM's, 1]. Needs --enable-lora."),
        click.option("--max-lora-rank", type=click.Choice([str(r) for r in LORA_RANKS]), default=None, expose_value=False, callback=_store,
                     help="vLLM max_lora_rank: the largest adapter rank; every slot is this big [default: vLLM's, 16]. Needs --enable-lora."),
        click.option("--max-cpu-loras", type=click.IntRange(min=1), default=None, expose_value=False, callback=_store,
                     help="vLLM max_cpu_loras: adapters cached in CPU memory, at least --max-loras [default: max_loras]. Needs --enable-lora."),
        click.option("--speculative-method", type=click.Choice(list(SPECULATIVE_METHODS)), default=None, expose_value=False, callback=_store,
                     help="vLLM speculative_config.method: ngram, draft_model, eagle, eagle3 or mtp (the model's own MTP layers)."),
        click.option("--speculative-model", default=None, expose_value=False, callback=_store,
                     help="The draft model or EAGLE head (folder or config.json, the path the nodes load it from) for draft_model, eagle, eagle3."),
        click.option("--num-speculative-tokens", type=click.IntRange(min=1), default=None, expose_value=False, callback=_store,
                     help="vLLM speculative_config.num_speculative_tokens: tokens proposed per step (also the lookahead slots per sequence)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _draft_vocab(model: str) -> int | None:
    """An EAGLE-3 head's ``draft_vocab_size`` (its own head's rows), from a local config.json."""
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    try:
        value = json.loads(path.read_text()).get("draft_vocab_size") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def feature_options(ctx: click.Context, adapters: int = 0) -> tuple[LoraOptions | None, SpeculativeOptions | None]:
    """The LoRA and speculative options the flags ask for (None: not asked for). ``adapters``: how
    many `orch rollout --lora` gives; they imply --enable-lora, one slot each unless --max-loras."""
    flags = ctx.meta.get(_KEY, {})
    lora = None
    lora_values = {k: flags.get(k) for k in ("max_loras", "max_lora_rank", "max_cpu_loras")}
    if flags.get("enable_lora") or (adapters and any(v is not None for v in lora_values.values())):
        lora = LoraOptions(max_loras=lora_values["max_loras"] or max(1, adapters), max_lora_rank=int(lora_values["max_lora_rank"] or 16),
                           max_cpu_loras=lora_values["max_cpu_loras"])  # fmt: skip
    elif not adapters:
        for name, value in lora_values.items():
            if value is not None:
                raise UsageError(f"--{name.replace('_', '-')} needs --enable-lora (or --lora)", hint="add --enable-lora, or leave it out")
    method, model, tokens = flags.get("speculative_method"), flags.get("speculative_model"), flags.get("num_speculative_tokens")
    if method is None:
        for name, value in (("speculative-model", model), ("num-speculative-tokens", tokens)):
            if value is not None:
                raise UsageError(f"--{name} needs --speculative-method", hint=f"add --speculative-method ({', '.join(SPECULATIVE_METHODS)})")
        return lora, None
    if tokens is None:
        raise UsageError(f"--speculative-method {method} needs --num-speculative-tokens", hint="e.g. --num-speculative-tokens 3")
    draft = resolve_model(model) if model is not None and method != "ngram" and method != "mtp" else None
    vocab = _draft_vocab(model) if model is not None and method == "eagle3" else None
    return lora, SpeculativeOptions(method, tokens, model, draft=draft, draft_vocab=vocab)
