"""Prompts of a given length in tokens for ``orch bench``. Pure apart from loading a tokenizer.

With the model's own tokenizer (a local model folder; transformers imported lazily), each prompt
is random words cut to exactly the asked number of tokens, checked by re-encoding. Without it,
prompts are random words sized by a words-per-token ratio that ``calibrate_words_per_token``
derives from the server's own usage counts of two probe prompts; the report then shows the
server's counts. Every prompt starts differently (seeded), so vLLM's prefix cache cannot turn
the benchmark into a cache-hit test.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from orchestrator.bench.loadgen import Prompt

# Plain lowercase English words: they tokenize similarly across BPE vocabularies.
WORDS = (
    "time token cache layer model river stone light sound water paper house green table cloud "
    "night music field story bread train plant metal glass heart voice north south earth space "
    "apple chair dream smile ocean tiger piano robot pilot honey lemon mango olive pearl queen "
    "radio snow tower value winter yellow zebra amber basil cedar delta ember frost grove harbor"
).split()


def random_words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def load_tokenizer(path: Path):
    """The model's tokenizer from a local folder (raises OSError/ValueError when it has none)."""
    from transformers import AutoTokenizer  # lazy: heavy import

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def exact_prompts(tokenizer, n_prompts: int, tokens: int, rng: random.Random) -> list[Prompt]:
    """``n_prompts`` distinct prompts of exactly ``tokens`` tokens by ``tokenizer`` (special tokens
    such as BOS, which the server adds, not counted)."""
    if tokens < 1:
        raise ValueError("prompt length must be at least 1 token")
    out = []
    for _ in range(n_prompts):
        ids = tokenizer.encode(random_words(rng, 2 * tokens + 8), add_special_tokens=False)
        while len(ids) < 2 * tokens:
            ids = ids + tokenizer.encode(" " + random_words(rng, tokens + 8), add_special_tokens=False)
        # decode/encode may merge or split at the cut: move the cut until the text round-trips
        k = tokens
        text = tokenizer.decode(ids[:k])
        best = (abs(len(tokenizer.encode(text, add_special_tokens=False)) - tokens), text)
        for _attempt in range(16):
            n = len(tokenizer.encode(text, add_special_tokens=False))
            if abs(n - tokens) < best[0]:
                best = (abs(n - tokens), text)
            if n == tokens:
                break
            k = max(1, k - (n - tokens))
            text = tokenizer.decode(ids[:k])
        text = best[1]
        out.append(Prompt(text, tokens=len(tokenizer.encode(text, add_special_tokens=False))))
    return out


def calibrate_words_per_token(count_tokens: Callable[[str], int], rng: random.Random) -> tuple[float, float]:
    """Fit tokens = a * words + b from the server's usage counts of two probe prompts.
    ``count_tokens(text)`` returns the server's prompt_tokens for that text."""
    short, long = 16, 128
    t_short = count_tokens(random_words(rng, short))
    t_long = count_tokens(random_words(rng, long))
    a = max((t_long - t_short) / (long - short), 1e-3)
    b = t_short - a * short
    return a, b


def approximate_prompts(n_prompts: int, tokens: int, rng: random.Random, fit: tuple[float, float] = (1.3, 1.0)) -> list[Prompt]:
    """Prompts of about ``tokens`` tokens given a fit tokens = a*words + b (default: a rough
    English BPE ratio when even the server could not be asked)."""
    a, b = fit
    words = max(1, round((tokens - b) / a))
    return [Prompt(random_words(rng, words)) for _ in range(n_prompts)]


def shared_prefix_prompts(
    n_prompts: int,
    prefixes: int,
    prefix_tokens: int,
    turn_tokens: int,
    rng: random.Random,
    tokenizer=None,
    fit: tuple[float, float] = (1.3, 1.0),
) -> list[Prompt]:
    """The shared-prefix workload: ``prefixes`` long system prompts of ``prefix_tokens`` tokens,
    each followed by short user turns of ``turn_tokens`` tokens, ``n_prompts`` in all (the turns
    spread evenly over the prefixes), in shuffled order. Every turn is different, so only the
    system prompt can come from vLLM's prefix cache. Exact part lengths with ``tokenizer`` (the
    prompt's count is its whole text's), else sized by ``fit``."""
    if prefixes < 1 or n_prompts < 1:
        raise ValueError("the workload needs at least one prefix and one prompt")

    def text_of(tokens: int) -> str:
        if tokenizer is not None:
            return exact_prompts(tokenizer, 1, tokens, rng)[0].text
        return approximate_prompts(1, tokens, rng, fit)[0].text

    systems = [text_of(prefix_tokens) for _ in range(prefixes)]
    out = []
    for i in range(n_prompts):
        text = f"{systems[i % prefixes]}\n{text_of(turn_tokens)}"
        tokens = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else None
        out.append(Prompt(text, tokens=tokens, prefix=i % prefixes))
    rng.shuffle(out)
    return out
