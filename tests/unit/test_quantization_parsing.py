"""quantization_config parsing at its edges (orchestrator.plan.quantization): every regex construct
Python's ``re`` can nest a repetition in, the defaults each method's vLLM loader takes, and the
matching rules of each method.

Expected values: Python's own ``re`` parser and matcher (vLLM matches compressed-tensors' ``re:`` names
with ``re.match``, compressed_tensors/utils.py) and vLLM 0.32.0's quantization loaders
(vllm/model_executor/layers/quantization/), read for each default below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import ModelSpecError
from orchestrator.plan.quantization import parse_quantization


def _ct(ignore: list[str]) -> dict:
    weights = {"num_bits": 8, "type": "float", "strategy": "channel"}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}, "ignore": ignore}


# Each holds a repetition inside a repetition, reached through a different node of re's parse tree;
# Python's backtracking matcher takes exponential time on each for a non-matching name.
NESTED = {
    "lazy-inner": "(?:.*?)*X",  # MIN_REPEAT inside MAX_REPEAT
    "possessive-inner": "(?:a*+)*X",  # POSSESSIVE_REPEAT (Python 3.11)
    "lookahead": "(?=(.*)*X)",  # ASSERT
    "negative-lookahead": "(?!(.*)*X)",  # ASSERT_NOT
    "atomic-group": "(?>(.*)*)X",  # ATOMIC_GROUP
    "branch": "a|(?:.*)*X",  # BRANCH
    "conditional-yes": "(a)?(?(1)(?:.*)*X|b)",  # GROUPREF_EXISTS, the yes arm
    "conditional-no": "(a)?(?(1)b|(?:.*)*X)",  # GROUPREF_EXISTS, the no arm
}


@pytest.mark.parametrize("pattern", list(NESTED.values()), ids=list(NESTED))
def test_a_repetition_nested_through_any_construct_is_refused(pattern):
    with pytest.raises(ModelSpecError, match="a repetition inside a repetition"):
        parse_quantization(_ct(["re:" + pattern]), "q")


@pytest.mark.parametrize(
    "pattern",
    [".*?" * 6, "(?=.*)" * 6 + "x", "a|" + ".*" * 6, "(?:.*)" * 6],
    ids=["lazy", "in-lookaheads", "in-a-branch", "in-groups"],
)
def test_six_unbounded_repetitions_side_by_side_are_counted_in_any_construct(pattern):
    with pytest.raises(ModelSpecError, match="6 unbounded repetitions"):
        parse_quantization(_ct(["re:" + pattern]), "q")


@pytest.mark.parametrize("pattern", [r"model\.layers\.\d{1,2}\.mlp.*", "(?:a{1,3})*", ".*" * 5])
def test_bounded_repetitions_and_five_side_by_side_are_accepted(pattern):
    # a{1,3} backtracks at most 3 ways: a bounded repetition inside an unbounded one stays linear
    assert "re:" + pattern in parse_quantization(_ct(["re:" + pattern]), "q").ignore


CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
PLANNER_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "planner" / "configs"


def _quant(path: Path) -> dict:
    cfg = json.loads(path.read_text())
    return cfg if path.name == "hf_quant_config.json" else cfg["quantization_config"]


# What each real checkpoint's own file says (tests/data/checkpoints/SOURCES.md, tests/data/planner/SOURCES.md):
# the method, the scheme's figures (block, group), the summary dtype, how its exclusions are matched,
# whether vLLM's KV cache turns fp8 (kv_cache_quant_algo) and how many modules it excludes.
REAL = [
    (CHECKPOINTS / "Qwen--Qwen3-32B-FP8" / "config.json", "fp8 (fp8 weights, fp32 scale per 128x128 block)", "fp8", "exact", None, 0),
    (CHECKPOINTS / "neuralmagic--Meta-Llama-3-8B-Instruct-FP8" / "config.json", "fp8 (fp8 weights, per-tensor scales)", "fp8", "exact", None, 0),
    (CHECKPOINTS / "meta-llama--Llama-3.1-405B-Instruct-FP8" / "config.json", "fbgemm_fp8 (fp8 weights, fp32 scale per output channel)", "fp8", "exact", None, 511),
    (CHECKPOINTS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json", "modelopt (FP8 weights, per-tensor scales)", "fp8", "modelopt", "fp8", 1),
    (CHECKPOINTS / "nvidia--Gemma-4-31B-IT-NVFP4" / "hf_quant_config.json", "modelopt (NVFP4 weights, fp8 scale per 16)", "int4", "modelopt", "fp8", 63),
    (CHECKPOINTS / "nvidia--DeepSeek-V4-Flash-NVFP4" / "hf_quant_config.json",
     "modelopt (MIXED_PRECISION per layer: 43 NVFP4 entries; the rest 16-bit)", "int4", "modelopt", None, 4),
    (CHECKPOINTS / "openai--gpt-oss-20b" / "config.json",
     "mxfp4 (MoE experts at 4 bits, uint8 scale per 32; linear layers 16-bit)", "int4", "glob", None, 4),
    (PLANNER_CONFIGS / "Llama-3.3-70B-Instruct-FP8-dynamic" / "config.json",
     "compressed-tensors (W8A8: fp8 weights (channel scales))", "fp8", "regex", None, 1),
]  # fmt: skip


@pytest.mark.parametrize(("path", "described", "dtype", "match", "kv", "ignored"), REAL, ids=[p[0].parent.name for p in REAL])
def test_each_real_checkpoint_reads_as_its_file_says(path, described, dtype, match, kv, ignored):
    quant = parse_quantization(_quant(path), path.name)
    assert quant.describe() == f"{described} from {path.name}"
    assert (quant.dtype, quant.match, quant.kv_cache_dtype, len(quant.ignore)) == (dtype, match, kv, ignored)
