"""The layer-type KV cache (orchestrator.plan.kv_groups) at its edges: the attention block that grows
to hold a Mamba state, the note that says so, and the grouping and printing rules, each against a
figure vLLM printed or the line of vLLM's source that decides it.

Sources: vllm#24280 (a vLLM maintainer: "672 tokens for nvidia/NVIDIA-Nemotron-Nano-9B-v2"), the CPU
engine logs in tests/data/planner (vllm-0.32-cpu-tiny-*.log), and vLLM 0.32.0's
``vllm/v1/core/kv_cache_utils.py`` / ``vllm/platforms/interface.py``."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.plan.capacity import PlanOptions, stage_capacities
from orchestrator.plan.catalog import spec_from_config
from orchestrator.plan.kv_groups import size_kv
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from tests.unit.test_layer_types import NEMOTRON_NANO_9B

DATA = Path(__file__).resolve().parents[1] / "data" / "planner"
H100 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=1, nodes=1)
CPU = make_shape(gpu_type_name="cpu", gpus_per_node=0, nodes=1)


def _nemotron_nano_9b():
    # vLLM of September 2025 (0.10.2) kept the SSM state in the model's dtype ("auto"): bf16
    return spec_from_config({**NEMOTRON_NANO_9B, "mamba_ssm_cache_dtype": "bfloat16"}, "nemotron", name="nemotron-nano-9b-v2")


def test_nemotron_nano_9b_grows_the_attention_block_to_672_tokens_as_vllm_did():
    # vllm#24280: "the KVCacheManager requires the mamba and attention page sizes to match, which might
    # cause large attention page sizes (672 tokens for nvidia/NVIDIA-Nemotron-Nano-9B-v2)". One Mamba2
    # state: conv (10240 + 2 x 8 x 128) x 3 x 2 B + 128 heads x 80 x 128 x 2 B = 2,695,168 B; one token of
    # attention 2 x 8 x 128 x 2 B = 4,096 B; the smallest multiple of 16 tokens whose page holds it: 672.
    spec = _nemotron_nano_9b()
    opts = PlanOptions(tp=1, pp=1, max_model_len=8192, vllm_version="0.10.2", dtype="bf16")
    (stage,) = stage_capacities(spec, H100, opts, tp=1, pp=1)
    assert stage.kv_detail is not None and stage.kv_detail.block_size == 672
    plan = plan_model(spec, H100, opts)
    notes = [r for r in plan.reasons if "attention block size" in r]
    assert len(notes) == 1 and notes[0].startswith("attention block size 672 tokens so one page holds a mamba2 state")


def test_no_block_note_when_the_attention_page_already_holds_the_state():
    # vllm-0.32-cpu-tiny-gdn.log: the CPU block of 128 tokens already holds a Gated DeltaNet state; vLLM
    # only pads the state page ("Padding mamba page size by 82.86%") and prints no new block size
    log = (DATA / "vllm-0.32-cpu-tiny-gdn.log").read_text()
    assert "Padding mamba page size by 82.86%" in log and "Setting attention block size" not in log
    spec = resolve_model(str(DATA / "configs" / "tiny-gdn" / "config.json"))
    opts = PlanOptions(max_model_len=4096, kv_cache_gib=0.25, max_num_batched_tokens=1024, vllm_version="0.32.0")
    (stage,) = stage_capacities(spec, CPU, opts, tp=1, pp=1)
    assert stage.kv_detail is not None and stage.kv_detail.block_size == 128
    # 82.86% padding: the attention page (128 x 2 x 2 x 64 x 2 B = 65,536 B) over the state (35,840 B)
    assert round((65536 / 35840 - 1) * 100, 2) == 82.86
    assert stage.kv_detail.buckets and {b.page_bytes for b in stage.kv_detail.buckets} == {65536}
    plan = plan_model(spec, CPU, opts)
    assert not [r for r in plan.reasons if "attention block size" in r]


GPT_OSS_20B = json.loads((DATA / "configs" / "gpt-oss-20b" / "config.json").read_text())
BIG_H100 = make_shape(gpu_type_name="H100-80GB", gpus_per_node=4, nodes=1, gpu_memory_gib=1024)


def _gpt_oss_opts(pp: int) -> PlanOptions:
    return PlanOptions(tp=1, pp=pp, max_model_len=131072, max_num_batched_tokens=8192, kv_cache_gib=10, vllm_version="0.29.0", dtype="bf16")


def test_the_plans_json_shows_each_kv_group_as_vllm_sizes_it():
    # gpt-oss-20b at 0.29 (the sums of test_layer_types' sliding-window test): 10 GiB // (12 pages of 32,768 B)
    # = 27,306 blocks; a request takes 8,192 full-attention blocks + cdiv(127 + 2 x 8,192, 16) + 1 = 1,033
    spec = spec_from_config(GPT_OSS_20B, "gpt-oss-20b", name="gpt-oss-20b")
    (stage,) = stage_capacities(spec, BIG_H100, _gpt_oss_opts(1), tp=1, pp=1)
    assert stage.to_json()["kv_groups"] == {
        "num_blocks": 27306, "concurrency": round(27306 / 9225, 3), "logged_tokens": int(27306 / 9225 * 131072), "block_size": 16,
        "group_size": 12, "groups": [
            {"kind": "sliding", "window": 128, "layers": 12, "groups": 1, "blocks_per_request": 1033, "page_bytes": 32768},
            {"kind": "full", "window": 0, "layers": 12, "groups": 1, "blocks_per_request": 8192, "page_bytes": 32768},
        ],
    }  # fmt: skip


def test_a_pipeline_keeps_as_many_batches_in_flight_as_it_has_stages():
    # vllm/config/vllm.py max_concurrent_batches: "PP requires PP-size concurrent batches to fill the
    # pipeline" (the V1 runner: async scheduling's 2 only at PP=1); max_in_flight_tokens = that x 8,192.
    # PP=4, 6 layers a stage: the window takes cdiv(127 + 4 x 8,192, 16) + 1 = 2,057 blocks
    spec = spec_from_config(GPT_OSS_20B, "gpt-oss-20b", name="gpt-oss-20b")
    for stage in stage_capacities(spec, BIG_H100, _gpt_oss_opts(4), tp=1, pp=4):
        assert stage.kv_detail is not None
        assert [(b.kind, b.count, b.blocks) for b in stage.kv_detail.buckets] == [("sliding", 3, 2057), ("full", 3, 8192)]


def test_layer_buckets_group_by_the_smaller_unless_the_larger_is_under_one_and_a_half_times_it():
    # _get_kv_cache_groups_uniform_page_size: group size = the smallest bucket, the largest when
    # "max_num_layers < min_num_layers * 1.5"; each bucket makes cdiv(layers, group size) groups.
    # Gemma 3 27B: 52 sliding and 10 full layers -> groups of 10: 6 sliding groups and 1 full
    gemma3 = json.loads((Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "multimodal" / "gemma3" / "config.json").read_text())
    spec = spec_from_config({**gemma3["text_config"], "vocab_size": 262208}, "gemma3", name="gemma-3-27b")
    (stage,) = stage_capacities(spec, BIG_H100, PlanOptions(tp=1, pp=1, max_model_len=8192, kv_cache_gib=10, dtype="bf16"), tp=1, pp=1)
    assert stage.kv_detail is not None and stage.kv_detail.group_size == 10
    assert [(b.kind, b.count, b.groups) for b in stage.kv_detail.buckets] == [("sliding", 52, 6), ("full", 10, 1)]
    # gpt-oss-20b's first five layers (sliding, full, sliding, full, sliding): 3 is not under 1.5 x 2, so groups of 2
    layout = spec_from_config(GPT_OSS_20B, "g", name="g").layout
    assert layout is not None
    sizing = size_kv(layout, 0, 5, attn_token_bytes=2048, global_token_bytes=2048, state_bytes=0, indexer_token_bytes=0, available=2**30,
                     max_model_len=4096, max_num_batched_tokens=2048, block_size=16, block_size_set=False, version=(0, 32, 0), pp=1,
                     mla=False, gpu=True)  # fmt: skip
    assert sizing.group_size == 2 and [(b.count, b.groups) for b in sizing.buckets] == [(3, 2), (2, 1)]
    # and 3 against 3 (layers 0..5): one group of 3 each
    even = size_kv(layout, 0, 6, attn_token_bytes=2048, global_token_bytes=2048, state_bytes=0, indexer_token_bytes=0, available=2**30,
                   max_model_len=4096, max_num_batched_tokens=2048, block_size=16, block_size_set=False, version=(0, 32, 0), pp=1,
                   mla=False, gpu=True)  # fmt: skip
    assert even.group_size == 3 and [(b.count, b.groups) for b in even.buckets] == [(3, 1), (3, 1)]


def test_a_state_takes_two_pages_with_prefix_caching_and_one_without():
    # kv_cache_interface.py MambaSpec.max_memory_usage_bytes: 2 pages in mamba_cache_mode "align" (prefix
    # caching on: the default for hybrids from 0.26), else 1. The tiny Qwen3-Next of the CPU log: 3 state
    # groups + 1 attention group of 32 blocks (cdiv(4096, 128)) over 4,096 blocks
    spec = resolve_model(str(DATA / "configs" / "tiny-gdn" / "config.json"))
    blocks = {}
    for version, prefix in (("0.32.0", None), ("0.32.0", False), ("0.25.0", None), ("0.25.0", True)):
        opts = PlanOptions(max_model_len=4096, kv_cache_gib=0.25, max_num_batched_tokens=1024, vllm_version=version, enable_prefix_caching=prefix)
        (stage,) = stage_capacities(spec, CPU, opts, tp=1, pp=1)
        assert stage.kv_detail is not None and stage.kv_detail.num_blocks == 4096
        blocks[(version, prefix)] = [(b.kind, b.groups, b.blocks) for b in stage.kv_detail.buckets]
    assert blocks[("0.32.0", None)] == blocks[("0.25.0", True)] == [("state", 3, 2), ("full", 1, 32)]
    assert blocks[("0.32.0", False)] == blocks[("0.25.0", None)] == [("state", 3, 1), ("full", 1, 32)]
