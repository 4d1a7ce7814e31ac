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
from orchestrator.plan.kv_groups import KvSizing, size_kv
from orchestrator.plan.layer_types import layer_layout
from orchestrator.plan.model_ref import resolve_model
from orchestrator.plan.planner import plan_model
from orchestrator.plan.shape import make_shape
from tests.unit.test_layer_families import CODESTRAL_MAMBA
from tests.unit.test_layer_types import NEMOTRON_NANO_9B, SCOUT

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
    assert notes == ["attention block size 672 tokens so one page holds a mamba2 state "
                     "(vLLM pads the state page to it: platforms/interface.py _align_hybrid_block_size)"]


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
    for version, prefix in (("0.32.0", None), ("0.32.0", False), ("0.25.0", None), ("0.25.0", True), ("0.26.0", None)):
        opts = PlanOptions(max_model_len=4096, kv_cache_gib=0.25, max_num_batched_tokens=1024, vllm_version=version, enable_prefix_caching=prefix)
        (stage,) = stage_capacities(spec, CPU, opts, tp=1, pp=1)
        assert stage.kv_detail is not None and stage.kv_detail.num_blocks == 4096
        blocks[(version, prefix)] = [(b.kind, b.groups, b.blocks) for b in stage.kv_detail.buckets]
    assert blocks[("0.32.0", None)] == blocks[("0.25.0", True)] == blocks[("0.26.0", None)] == [("state", 3, 2), ("full", 1, 32)]
    assert blocks[("0.32.0", False)] == blocks[("0.25.0", None)] == [("state", 3, 1), ("full", 1, 32)]


# ---- size_kv's rules one by one, on real layouts, against vLLM 0.32.0's kv_cache_utils.py,
# kv_cache_interface.py and platforms/interface.py ----

SCOUT_LAYOUT = spec_from_config(SCOUT, "scout", name="llama-4-scout").layout
NEMOTRON_LAYOUT = _nemotron_nano_9b().layout
GPT_OSS_LAYOUT = spec_from_config(GPT_OSS_20B, "gpt-oss-20b", name="gpt-oss-20b").layout
GEMMA4_31B = json.loads((Path(__file__).resolve().parents[1] / "data" / "checkpoints" / "nvidia--Gemma-4-31B-IT-NVFP4" / "config.json").read_text())


def _size(layout, start: int, end: int, **kw):
    args = dict(attn_token_bytes=2048, global_token_bytes=2048, state_bytes=0, indexer_token_bytes=0, available=2**30, max_model_len=8192,
                max_num_batched_tokens=2048, block_size=16, block_size_set=False, version=(0, 25, 0), pp=1, mla=False, gpu=True)  # fmt: skip
    args.update(kw)
    assert layout is not None
    return size_kv(layout, start, end, **args)


def test_chunked_local_layers_hold_one_chunk_plus_the_in_flight_tokens():
    # ChunkedLocalAttentionSpec.max_admission_blocks_per_request: cdiv(min(attention_chunk_size + max_in_flight_tokens,
    # max_model_len), block_size). Llama 4 Scout's first four layers: three chunked (8,192) and one full (every fourth).
    # 0.25: in flight = max_num_batched_tokens (2,048): cdiv(10,240, 16) = 640; a 32,768-token request takes 2,048 full blocks
    s = _size(SCOUT_LAYOUT, 0, 4, max_model_len=32768)
    assert [(b.kind, b.window, b.count, b.groups, b.blocks, b.block_size) for b in s.buckets] == [
        ("chunked", 8192, 3, 3, 640, 16), ("full", 0, 1, 1, 2048, 16)]  # fmt: skip
    # groups of 1 (3 is not under 1.5 x 1): 4 groups, 3 x 640 + 2,048 = 3,968 blocks a request; 1 GiB // (1 x 32 KiB) = 32,768
    assert (s.group_size, s.num_blocks) == (1, 32768) and s.concurrency == 32768 / 3968
    # a request shorter than a chunk: min(..., max_model_len) = 8,192 tokens = 512 blocks, like the full layer
    assert [b.blocks for b in _size(SCOUT_LAYOUT, 0, 4, max_model_len=8192).buckets] == [512, 512]
    # from 0.26.0 on (included): 2 batches in flight on a GPU at PP=1, cdiv(8,192 + 4,096, 16) = 768
    assert [b.blocks for b in _size(SCOUT_LAYOUT, 0, 4, max_model_len=32768, version=(0, 26, 0)).buckets] == [768, 2048]


def test_a_sliding_window_counts_window_minus_one_tokens():
    # SlidingWindowSpec: cdiv(min(sliding_window - 1 + max_in_flight_tokens, max_model_len), block) + 1. gpt-oss's window
    # 128 with 2,050 tokens in flight: 2,177 tokens = 136 blocks and 1 token, so cdiv = 137, + 1 = 138 (2,176 would give 137)
    s = _size(GPT_OSS_LAYOUT, 0, 2, max_num_batched_tokens=2050)
    assert [(b.kind, b.blocks) for b in s.buckets] == [("sliding", 138), ("full", 512)]


def test_gemma4_full_layers_take_their_own_width_and_grow_their_block_to_the_sliding_page():
    # Gemma-4-31B: sliding layers 16 KV heads x 256, full layers 4 global KV heads x 512 (attention_k_eq_v).
    # unify_kv_cache_spec_page_size: the smaller page (full: 16 x 8,192 B) grows its block by max page / its page = 2
    text = GEMMA4_31B["text_config"]
    layout = spec_from_config(GEMMA4_31B, "gemma4", name="gemma-4-31b").layout
    sliding = 2 * text["num_key_value_heads"] * text["head_dim"] * 2
    full = 2 * text["num_global_key_value_heads"] * text["global_head_dim"] * 2
    assert (sliding, full) == (16384, 8192)
    s = _size(layout, 0, 6, attn_token_bytes=sliding, global_token_bytes=full)
    # layers 0..5: 5 sliding (1,024) + 1 full. Sliding: cdiv(1,023 + 2,048, 16) + 1 = 193; full: cdiv(8,192, 32) = 256
    assert [(b.kind, b.count, b.groups, b.blocks, b.block_size, b.page_bytes) for b in s.buckets] == [
        ("sliding", 5, 5, 193, 16, 262144), ("full", 1, 1, 256, 32, 262144)]  # fmt: skip
    # 1 GiB // (group of 1 x 256 KiB) = 4,096 blocks; a request takes 5 x 193 + 256 = 1,221
    assert s.num_blocks == 4096 and s.concurrency == 4096 / 1221 and s.tokens == int(4096 / 1221 * 8192)


def test_the_hybrid_block_aligns_to_the_kernel_block_the_asked_block_and_128_with_mla():
    # _align_hybrid_block_size: alignment = max(the backend's smallest kernel block (16), cache block_size), 128 with MLA;
    # block = alignment x cdiv(mamba page, alignment x attention bytes per token), kept when the asked block is larger.
    # Nemotron-Nano-9B-v2 (state 2,695,168 B, 4,096 B a token): --block-size 64 -> 64 x cdiv(2,695,168, 262,144) = 704;
    # --block-size 8 -> the kernel's 16: 16 x 42 = 672; --block-size 1024 holds the state already and stays
    for asked, block in ((64, 704), (8, 672), (16, 672), (1024, 1024)):
        s = _size(NEMOTRON_LAYOUT, 0, 56, attn_token_bytes=4096, global_token_bytes=4096, state_bytes=2695168, block_size=asked,
                  block_size_set=True)  # fmt: skip
        assert (s.block_size, s.asked_block_size) == (block, asked)
    # Kimi-Linear (MLA + KDA): an MLA token is (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 B = 1,152 B; the KDA state
    # of 32 heads x 128 (test_layer_families): 3 x 32 x 128 x 3 x 2 + 32 x 128 x 128 x 4 = 2,170,880 B;
    # 128 x cdiv(2,170,880, 128 x 1,152) = 1,920 (16 x cdiv(2,170,880, 16 x 1,152) = 1,888 without the MLA rule)
    lin = {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}
    kimi = layer_layout({"model_type": "kimi_linear", "num_hidden_layers": 4, "hidden_size": 2304, "num_attention_heads": 32,
                         "vocab_size": 163840, "first_k_dense_replace": 1, "linear_attn_config": lin}, "kimi", 4)  # fmt: skip
    s = _size(kimi, 0, 4, attn_token_bytes=1152, global_token_bytes=1152, state_bytes=2170880, mla=True)
    assert s.block_size == 1920
    # without a state in the model the block is what was asked (the attention-only gpt-oss, state 0)
    assert _size(GPT_OSS_LAYOUT, 0, 4, block_size=32, block_size_set=True).block_size == 32


def test_a_stage_that_caches_nothing_has_vllms_one_null_block():
    # get_kv_cache_config_from_groups: no KV cache groups ("Attention free models do not have KV cache") ->
    # KVCacheConfig(num_blocks=1, ...): "BlockPool always needs a null_block". Nemotron-H's layer 1 is an MLP ('-')
    s = _size(NEMOTRON_LAYOUT, 1, 2, state_bytes=2695168)
    assert s == KvSizing(1, 0.0, 0, 0, 16, 0, (), 0.0, 16)


def test_no_memory_left_is_no_block_and_a_page_short_is_none_either():
    # vLLM refuses to start when the KV budget is <= 0 or under one block (check_enough_kv_cache_memory); orch reports 0
    for available in (0, -(2**30), 32768 - 1):
        s = _size(GPT_OSS_LAYOUT, 0, 2, available=available)
        assert (s.num_blocks, s.concurrency, s.tokens, s.logged_tokens) == (0, 0.0, 0, 0)
    assert _size(GPT_OSS_LAYOUT, 0, 2, available=32768).num_blocks == 1  # groups of 1 layer: one 32 KiB page


def test_four_against_three_layers_make_groups_of_four():
    # "max_num_layers < min_num_layers * 1.5": gpt-oss layers 0..6 hold 4 sliding and 3 full: 4 < 4.5, groups of 4,
    # one group each; 1 GiB // (4 x 32 KiB) = 8,192 blocks
    s = _size(GPT_OSS_LAYOUT, 0, 7)
    assert s.group_size == 4 and [(b.kind, b.count, b.groups) for b in s.buckets] == [("sliding", 4, 1), ("full", 3, 1)]
    assert s.num_blocks == 8192


def test_the_printed_size_is_blocks_per_group_up_to_0_20_and_concurrency_times_length_from_0_21():
    # gpt-oss layers 0..6 (2 groups of 4 x 32 KiB pages), 1,001 blocks. 0.20: num_blocks // groups x block = 500 x 16;
    # 0.21.0 (get_kv_cache_capacity): int(concurrency x max_model_len), a request taking 137 + 512 = 649 blocks
    available = 4 * 32768 * 1001
    old = _size(GPT_OSS_LAYOUT, 0, 7, available=available, version=(0, 20, 0))
    assert (old.num_blocks, old.logged_tokens) == (1001, 8000) and isinstance(old.logged_tokens, int)
    new = _size(GPT_OSS_LAYOUT, 0, 7, available=available, version=(0, 21, 0))
    assert [b.blocks for b in new.buckets] == [137, 512] and new.logged_tokens == int(1001 / 649 * 8192) == 12635
    # bytes a token of a full request takes: 649 blocks x 4 layers x 32 KiB / 8,192 tokens
    assert new.bytes_per_token == 649 * 4 * 32768 / 8192
    assert new.to_json()["concurrency"] == 1.542  # 1,001 / 649 = 1.54237..., three decimals


def test_an_attention_free_model_keeps_its_block_and_one_state_page():
    # vllm-0.32-cpu-tiny-mamba2.log: no "Setting attention block size" (the alignment is for attention + Mamba
    # hybrids only), and a pure Mamba2 model runs without prefix caching: one state page a request
    log = (DATA / "vllm-0.32-cpu-tiny-mamba2.log").read_text()
    assert "Setting attention block size" not in log
    spec = resolve_model(str(DATA / "configs" / "tiny-mamba2" / "config.json"))
    opts = PlanOptions(max_model_len=4096, kv_cache_gib=0.25, max_num_batched_tokens=1024, vllm_version="0.32.0")
    (stage,) = stage_capacities(spec, CPU, opts, tp=1, pp=1)
    assert stage.kv_detail is not None and stage.kv_detail.block_size == 128
    assert [(b.kind, b.blocks) for b in stage.kv_detail.buckets] == [("state", 1)]
    assert not [r for r in plan_model(spec, CPU, opts).reasons if "attention block size" in r]


def test_an_attention_free_stage_is_never_aligned_to_an_attention_block():
    # _align_hybrid_block_size runs for attention + Mamba hybrids only; a pure Mamba2 model (Mamba-Codestral-7B:
    # 64 layers, 128 heads x 64, state 128, 8 groups, expand 2 x 4,096) has no attention bytes to align to.
    # One state (mamba2_state_shape, bf16): (8,192 + 2 x 8 x 128) x 3 x 2 + 128 x 64 x 128 x 2 = 2,158,592 B
    state = (8192 + 2 * 8 * 128) * 3 * 2 + 128 * 64 * 128 * 2
    assert state == 2158592
    layout = layer_layout(CODESTRAL_MAMBA, "codestral", 64)
    s = _size(layout, 0, 64, attn_token_bytes=0, global_token_bytes=0, state_bytes=state)
    assert s.block_size == 16 and [(b.kind, b.count, b.groups, b.blocks, b.page_bytes) for b in s.buckets] == [("state", 64, 1, 1, state)]
    assert s.num_blocks == 2**30 // (64 * state) == 7
