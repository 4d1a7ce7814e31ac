"""A rollout with LoRA on the 3-host test bed (real sshd, Ray, Ray Serve LLM, vLLM on CPU).

The session's tiny-model application (``served_tiny``) is rolled to a revision with LoRA slots
(``--enable-lora --max-loras 2 --max-lora-rank 8``): the engine must start with them (vLLM's CPU
backend runs LoRA through ``PunicaWrapperCPU``), answer, and log the KV cache the plan rendered (on
CPU the cache is the fixed size orch gives the engine, so the engine's logged tokens equal the
plan's exactly: the LoRA slots take host memory, not the cache). It replaces the session's
application, so it is marked ``disrupts_serving`` (it runs after the tests that read the session's
app) and costs one engine start.
"""

from __future__ import annotations

import httpx
import pytest

from orchestrator.plan.engine_features import LoraOptions

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm, pytest.mark.disrupts_serving]


def test_a_rollout_with_lora_starts_and_its_kv_cache_is_the_plans(served_tiny):
    served = served_tiny
    result = served.rollout(lora=LoraOptions(max_loras=2, max_lora_rank=8))
    assert result.revision is not None and result.action != "noop", (result.action, result.decision)
    kwargs = result.config["args"]["llm_configs"][0]["engine_kwargs"]
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 2, 8)
    assert result.plan["features"]["lora_gib_per_gpu"] > 0
    # the engine's own "KV cache size: N tokens" line against the plan the rollout stored
    cal = result.calibration
    assert cal is not None, result.calibration_note
    assert cal["measured"]["kv_tokens"] == result.plan["kv_cache_tokens"] == cal["predicted"]["kv_tokens"], cal
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}
    resp = httpx.post(f"{served.endpoint}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {served.api_key}"}, timeout=60.0)  # fmt: skip
    assert resp.status_code == 200, resp.text
