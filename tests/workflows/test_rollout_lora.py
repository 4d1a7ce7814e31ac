"""`orch rollout --lora`: an adapter from the nodes' disks is checked on every node before the
apply, as the model's folder is (workflows/rollout_steps.py ``check_adapter_paths``); what the
applied application carries; a change of adapters is a new revision."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.errors import RolloutFailed
from orchestrator.remote.fake import result
from orchestrator.serve.lora import LoraAdapter, adapters_of
from tests.workflows.rollout_world import make_world

ADAPTER = "/models/adapters/sql"
CONFIG = f"{ADAPTER}/adapter_config.json"


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def _engine(body: dict) -> dict:
    (app,) = body["applications"]
    return app["args"]["llm_configs"][0]["engine_kwargs"]


def test_an_adapter_missing_on_a_node_fails_before_anything_is_applied_naming_it_and_the_node(world):
    world.rollout()
    bodies = len(world.serve.bodies)
    world.runners["w1"].on(("test", "-f", CONFIG), result(exit_code=1))
    with pytest.raises(RolloutFailed) as err:
        world.rollout(adapters=(LoraAdapter("sql", ADAPTER),))
    assert f"LoRA adapter sql: {ADAPTER} does not exist on node(s) w1 (no {CONFIG})" in err.value.message
    assert "orch model sync" in (err.value.hint or "")
    assert len(world.serve.bodies) == bodies  # nothing applied; the serving revision stays


def test_an_adapter_of_a_larger_rank_than_the_slots_is_refused_with_the_flag_that_fits(world):
    # the rank is the adapter's own (a PEFT adapter_config.json, read on a node)
    world.runners["head"].on(("cat", CONFIG), result(stdout=json.dumps({"peft_type": "LORA", "r": 32, "target_modules": ["q_proj"]})))
    with pytest.raises(RolloutFailed) as err:
        world.rollout(adapters=(LoraAdapter("sql", ADAPTER),))
    assert "LoRA adapter sql has rank 32" in err.value.message and "max_lora_rank 16" in err.value.message
    assert "--max-lora-rank 32" in (err.value.hint or "")
    assert world.serve.bodies == []


def test_adapters_on_every_node_are_applied_and_a_new_adapter_is_a_new_revision(world):
    world.runners["head"].on(("cat", CONFIG), result(stdout=json.dumps({"peft_type": "LORA", "r": 8})))
    first = world.rollout(adapters=(LoraAdapter("sql", ADAPTER), LoraAdapter("chat", "s3://bucket/adapters/chat")))
    assert first.action == "fresh"
    engine = _engine(world.serve.bodies[-1])
    assert "lora_modules" not in engine and engine["max_loras"] == 2
    assert [a.name for a in adapters_of(world.serve.bodies[-1]["applications"][0])] == ["chat", "sql"]
    checked = [c.argv for r in world.runners.values() for c in r.calls if c.argv[:2] == ("test", "-f")]
    assert checked.count(("test", "-f", CONFIG)) == 2  # both nodes; the S3 adapter is fetched by the node itself
    assert not any("s3://" in " ".join(argv) for argv in checked)
    again = world.rollout(adapters=(LoraAdapter("sql", ADAPTER), LoraAdapter("chat", "s3://bucket/adapters/chat")))
    assert again.action == "noop"
    changed = world.rollout(adapters=(LoraAdapter("sql", ADAPTER), LoraAdapter("chat", "s3://bucket/adapters/chat-v2")))
    assert changed.action != "noop" and changed.revision == first.revision + 1


def test_an_adapter_added_to_the_running_base_is_a_user_config_put_that_keeps_its_args_and_is_probed(world):
    world.runners["head"].on(("cat", CONFIG), result(stdout=json.dumps({"peft_type": "LORA", "r": 8})))
    first = world.rollout(adapters=(LoraAdapter("sql", ADAPTER),))
    (before,) = world.serve.bodies[-1]["applications"]
    chat = LoraAdapter("chat", "s3://bucket/adapters/chat")
    grown = world.rollout(adapters=(LoraAdapter("sql", ADAPTER), chat))  # no LoRA flags: the running engine's slots kept
    assert grown.action == "adapters" and grown.revision == first.revision + 1, grown.decision
    (after,) = world.serve.bodies[-1]["applications"]
    assert after["args"] == before["args"]  # the same code version: Serve reconfigures, restarts nothing
    assert [a.name for a in adapters_of(after)] == ["chat", "sql"]
    assert [m for _, m, _ in world.endpoint.probes[-3:]] == ["tiny", "chat", "sql"]  # the base, then each adapter
    assert any("each LoRA adapter answered a completion" in s for s in grown.steps)
    shrunk = world.rollout(adapters=(chat,))
    assert shrunk.action == "adapters" and "removes sql" in shrunk.decision["reason"]
    assert world.serve.bodies[-1]["applications"][0]["args"] == before["args"]


def test_an_adapter_that_does_not_answer_puts_the_previous_adapters_back(world):
    world.rollout(adapters=(LoraAdapter("sql", ADAPTER),))
    (before,) = world.serve.bodies[-1]["applications"]
    probe = world.endpoint.probe

    def refuse_chat(route, model, key):
        answer = probe(route, model, key)
        return replace(answer, ok=False, error="http: HTTP 404") if model == "chat" else answer

    world.endpoint.probe = refuse_chat
    with pytest.raises(RolloutFailed) as err:
        world.rollout(adapters=(LoraAdapter("sql", ADAPTER), LoraAdapter("chat", "s3://bucket/adapters/chat")))
    assert "LoRA adapter chat did not answer" in err.value.message and err.value.rolled_back
    assert adapters_of(world.serve.bodies[-1]["applications"][0]) == adapters_of(before)
