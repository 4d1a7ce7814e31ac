"""Prompt lengths in tokens: exact with the model's own tokenizer, approximate from the server's
usage counts; every prompt distinct. Ray's metrics service-discovery file."""

from __future__ import annotations

import random

import pytest

from orchestrator.bench.prompts import approximate_prompts, calibrate_words_per_token, exact_prompts, load_tokenizer
from orchestrator.bench.target import parse_discovery


@pytest.mark.parametrize("tokens", [1, 17, 128, 900])
def test_exact_prompts_have_exactly_the_asked_tokens(tiny_model_dir, tokens):
    tok = load_tokenizer(tiny_model_dir)
    prompts = exact_prompts(tok, 5, tokens, random.Random(0))
    assert [p.tokens for p in prompts] == [tokens] * 5
    assert all(len(tok.encode(p.text, add_special_tokens=False)) == tokens for p in prompts)
    assert len({p.text for p in prompts}) == 5  # distinct: no prefix-cache hits between requests
    assert exact_prompts(tok, 2, tokens, random.Random(0)) == prompts[:2]  # seeded


def test_calibration_fits_the_servers_counts_and_sizes_prompts():
    # a server that counts 2 tokens per word plus 3 for the template
    def count(text: str) -> int:
        return 2 * len(text.split()) + 3

    a, b = calibrate_words_per_token(count, random.Random(0))
    assert (a, b) == pytest.approx((2.0, 3.0))
    prompts = approximate_prompts(4, 203, random.Random(1), (a, b))
    assert all(count(p.text) == 203 for p in prompts) and all(p.tokens is None for p in prompts)


def test_parse_discovery_lists_every_nodes_metrics_page():
    text = '[{"labels": {"job": "ray"}, "targets": ["10.0.0.1:44217", "10.0.0.2:40101", "10.0.0.1:44217", "127.0.0.1:None"]}]'
    assert parse_discovery(text) == ["http://10.0.0.1:44217/metrics", "http://10.0.0.2:40101/metrics"]
    assert parse_discovery("not json") == [] and parse_discovery("{}") == []
