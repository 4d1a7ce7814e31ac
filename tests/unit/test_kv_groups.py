"""The layer-type KV cache (orchestrator.plan.kv_groups) at its edges: the attention block that grows
to hold a Mamba state, the note that says so, and the grouping and printing rules, each against a
figure vLLM printed or the line of vLLM's source that decides it.

Sources: vllm#24280 (a vLLM maintainer: "672 tokens for nvidia/NVIDIA-Nemotron-Nano-9B-v2"), the CPU
engine logs in tests/data/planner (vllm-0.32-cpu-tiny-*.log), and vLLM 0.32.0's
``vllm/v1/core/kv_cache_utils.py`` / ``vllm/platforms/interface.py``."""

from __future__ import annotations

from pathlib import Path

from orchestrator.plan.capacity import PlanOptions, stage_capacities
from orchestrator.plan.catalog import spec_from_config
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
