"""plan/capacity: vLLM's scheduler defaults per GPU and the per-stage JSON contract of `orch plan`.

vLLM 0.32 ``engine/arg_utils.py`` (``get_batch_defaults``, API server): 16,384 batched tokens and
1,024 sequences on GPUs of 160 GiB and more, 8,192 / 1,024 from 70 GiB except A100s, 2,048 / 256
otherwise. The H100's 79.18 GiB is what vLLM logged for an H100 80GB (llm-d-benchmark, see
test_planner.py); the other sizes are picked on either side of the thresholds.
"""

from __future__ import annotations

import pytest

from orchestrator.plan.capacity import StageCapacity, vllm_scheduler_defaults
from orchestrator.plan.memory import GIB
from orchestrator.plan.shape import ClusterShape


@pytest.mark.parametrize(("gpu_type", "gib", "expected"), [
    ("H100-80GB", 79.18, (8192, 1024)),
    ("A100-80GB", 79.15, (2048, 256)),
    ("B200", 179.06, (16384, 1024)),
    ("L4", 22.05, (2048, 256)),
    ("H100-80GB", 70.0, (8192, 1024)),  # the 70 GiB threshold itself
    ("B200", 160.0, (16384, 1024)),  # the 160 GiB threshold itself
    ("L40S", 69.99, (2048, 256)),
])  # fmt: skip
def test_vllm_scheduler_defaults_by_gpu(gpu_type, gib, expected):
    shape = ClusterShape(gpus_per_node=8, nodes=1, gpu_memory_bytes=int(gib * GIB), gpu_type=gpu_type)
    assert vllm_scheduler_defaults(shape) == expected


def test_a_cpu_shape_gets_the_small_defaults():
    assert vllm_scheduler_defaults(ClusterShape(gpus_per_node=1, nodes=1, gpu_memory_bytes=None, gpu_type="cpu")) == (2048, 256)


def test_stage_json_contract():
    # docs/planner.md: per stage, its layer range [first, end), GiB rounded to 3 places, bytes per
    # token and the KV tokens.
    stage = StageCapacity(index=1, first_layer=40, layers=40, weights_bytes=33.8754 * GIB, reserve_bytes=1.5 * GIB,
                          kv_bytes=-2.25 * GIB, kv_bytes_per_token=163840.0, kv_tokens=0)  # fmt: skip
    assert stage.to_json() == {
        "stage": 1, "layers": [40, 80], "weights_gib": 33.875, "reserve_gib": 1.5, "kv_cache_gib": -2.25,
        "kv_bytes_per_token": 163840.0, "kv_cache_tokens": 0,
    }  # fmt: skip
