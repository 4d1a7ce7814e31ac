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


def test_the_shared_prefix_workload_repeats_each_system_prompt_with_new_turns_shuffled(tiny_model_dir):
    from orchestrator.bench.loadgen import SESSION_HEADER, RequestSpec
    from orchestrator.bench.prompts import shared_prefix_prompts

    tok = load_tokenizer(tiny_model_dir)
    prompts = shared_prefix_prompts(12, 3, 256, 16, random.Random(5), tokenizer=tok)
    systems = {p.prefix: p.text.split("\n")[0] for p in prompts}
    assert sorted(systems) == [0, 1, 2] and len(set(systems.values())) == 3
    assert [sum(p.prefix == k for p in prompts) for k in range(3)] == [4, 4, 4]  # 12 turns over 3 prompts
    for p in prompts:
        system, turn = p.text.split("\n")
        assert system == systems[p.prefix]  # the whole system prompt, shared
        assert len(tok.encode(system, add_special_tokens=False)) == 256 and len(tok.encode(turn, add_special_tokens=False)) == 16
        assert p.tokens == len(tok.encode(p.text, add_special_tokens=False))
    assert len({p.text.split("\n")[1] for p in prompts}) == 12  # every turn differs: only the prefix can hit
    assert [p.prefix for p in prompts] != sorted(p.prefix for p in prompts)  # shuffled, not grouped
    # Each request names its system prompt in Serve's session header (what session affinity reads).
    spec = RequestSpec(base_url="http://x", model="tiny", output_tokens=4)
    assert spec.prompt_headers(prompts[0]) == {SESSION_HEADER: f"prefix-{prompts[0].prefix}"}
    assert spec.prompt_headers(exact_prompts(tok, 1, 8, random.Random(0))[0]) is None
