"""The vLLM generations' memory-profile terms and the release that changed each
(sources: tests/data/planner/SOURCES.md and docs/planner.md)."""

from __future__ import annotations

from importlib.metadata import requires

import pytest

from orchestrator.errors import PlanError
from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM, engine_terms, parse_vllm_version, probed_vllm_version

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.10.1.1", (0, 10, 1)), ("0.6.5.dev123+gabc", (0, 6, 5)), ("0.11.0+582e4e37.nv25.11", (0, 11, 0)), ("v0.27.1", (0, 27, 1)), ("0.29", (0, 29, 0))],
)
def test_versions_as_vllm_prints_them(text, version):
    assert parse_vllm_version(text) == version


@pytest.mark.parametrize("text", ["", "latest", "0", "x.y.z", "0.1e5.0"])
def test_bad_versions_are_plan_errors(text):
    with pytest.raises(PlanError):
        parse_vllm_version(text)


@pytest.mark.parametrize(
    ("version", "arch", "moe", "flashinfer", "engine", "sampler", "graphs", "util"),
    [
        ((0, 7, 3), "llama", False, None, "V0", "sort", False, 0.90),  # V1 was opt-in before 0.8.0
        ((0, 8, 0), "llama", False, None, "V1", "sort", False, 0.90),  # _dummy_sampler_run (vllm#13594)
        ((0, 10, 1), "qwen2", False, True, "V1", "flashinfer", False, 0.90),  # "Using FlashInfer for top-p & top-k sampling"
        ((0, 17, 1), "llama", False, None, "V1", "sort", False, 0.90),
        ((0, 18, 0), "llama", False, None, "V1", "triton", False, 0.90),  # topk_topp_triton in 0.18.0
        ((0, 20, 1), "qwen3", False, None, "V1", "triton", False, 0.90),
        ((0, 21, 0), "llama", False, None, "V1", "triton", True, 0.92),  # vllm#38284
        ((0, 22, 0), "qwen3", False, None, "V1 (Model Runner V2)", "mrv2", True, 0.92),  # MRv2 for Qwen3 dense
        ((0, 22, 0), "llama", False, None, "V1", "triton", True, 0.92),
        ((0, 23, 0), "llama", False, None, "V1 (Model Runner V2)", "mrv2", True, 0.92),  # + Llama, Mistral
        ((0, 23, 0), "qwen2", False, None, "V1", "triton", True, 0.92),
        ((0, 25, 0), "qwen2", False, None, "V1 (Model Runner V2)", "mrv2", True, 0.92),  # all dense models
        ((0, 27, 1), "qwen3_moe", True, None, "V1", "triton", True, 0.92),  # MoE stays on the V1 runner
    ],
)
def test_terms_change_at_the_releases_that_changed_them(version, arch, moe, flashinfer, engine, sampler, graphs, util):
    terms = engine_terms(version, architecture=arch, is_moe=moe, flashinfer_sampler=flashinfer)
    assert (terms.engine, terms.sampler, terms.cuda_graph_subtracted, terms.gpu_memory_utilization) == (engine, sampler, graphs, util)


def test_batch_defaults_follow_get_batch_defaults():
    v1 = engine_terms((0, 29, 0))
    assert v1.batch_defaults(int(79.18 * GIB), "H100-80GB", 131072) == (8192, 1024)
    assert v1.batch_defaults(int(79.15 * GIB), "A100-80GB", 131072) == (2048, 256)  # vllm#17885: not on A100
    assert v1.batch_defaults(int(178.4 * GIB), "B200-180GB", 131072) == (16384, 1024)
    assert v1.batch_defaults(0, "cpu", 1024) == (2048, 128)
    assert engine_terms((0, 8, 5)).batch_defaults(int(79.18 * GIB), "H100-80GB", 131072) == (2048, 256)
    assert engine_terms((0, 6, 4)).batch_defaults(int(23.58 * GIB), "RTX3090-24GB", 20000) == (20000, 256)  # V0: one whole sequence


def test_the_default_version_is_what_the_gpu_extra_installs():
    # setup.cfg's gpu extra pins ray[llm]==2.60.0, which requires this vLLM
    assert f"vllm[audio]=={GPU_EXTRA_VLLM}; extra == \"llm\"" in (requires("ray") or [])


def test_the_probed_version_comes_from_the_nodes_facts():
    assert probed_vllm_version({"h": {"versions": {"vllm": "0.32.0"}}, "w": {"versions": {"vllm": "0.32.0"}}}) == "0.32.0"
    assert probed_vllm_version({"h": {"versions": {"vllm": None}}, "w": {}}) is None
