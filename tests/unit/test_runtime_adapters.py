"""LoRA adapters added to a running base (issue 45; serve/lora.py, docs/rollout.md "LoRA adapters"):
they are the engine deployment's ``user_config``, which Ray Serve applies without restarting a
replica (its own ``DeploymentVersion``), and orch's replica class loads them into its running engine
through vLLM's own ``OpenAIServingModels`` (here the real class over a recording engine client).
When a change is one (``decisions.light_change``) and when the engine must restart (``lora_restart``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.engine_features import LoraOptions
from orchestrator.serve import decisions, node_hooks
from orchestrator.serve.config import with_replicas
from orchestrator.serve.desired import RolloutRequest
from orchestrator.serve.fingerprint import config_fingerprint
from orchestrator.serve.lora import LORA_KEY, LoraAdapter, adapters_of, runtime_adapters, with_runtime_adapters
from orchestrator.workflows.desired import desired_for_model

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"


@pytest.fixture
def node_module(on_the_node_path):
    """orch's node module imported from the folder a node holds it in (tests/unit/conftest.py)."""
    return __import__(node_hooks.MODULE)


def test_serve_applies_a_user_config_change_by_reconfiguring_the_replica_not_restarting_it():
    from ray.serve._private.config import DeploymentConfig
    from ray.serve._private.version import DeploymentVersion

    old = DeploymentVersion("v1", DeploymentConfig(num_replicas=1, user_config={LORA_KEY: [{"name": "sql", "source": "/m/sql"}]}), {})
    new = DeploymentVersion.from_deployment_version(old, DeploymentConfig(num_replicas=1, user_config={LORA_KEY: [
        {"name": "sql", "source": "/m/sql"}, {"name": "chat", "source": "/m/chat"}]}))  # fmt: skip
    assert not old.requires_actor_restart(new) and old.requires_actor_reconfigure(new)


def test_the_node_module_and_orch_agree_on_the_names():
    module_text = node_hooks.source()
    for value in (node_hooks.LORA_KEY, node_hooks.ADAPTER_LOADED_LINE, node_hooks.ADAPTER_FAILED_LINE):
        assert f'"{value}"' in module_text


class _Engine:
    """An engine client as OpenAIServingModels uses it: add_lora records what reached the engine."""

    def __init__(self, refuse: str | None = None):
        self.model_config = SimpleNamespace(model="/models/tiny", max_model_len=1024)
        self.renderer = self.input_processor = None
        self.added: list[tuple[str, str]] = []
        self.refuse = refuse

    async def add_lora(self, request) -> bool:
        if request.lora_name == self.refuse:
            raise ValueError(f"LoRA rank 32 is greater than max_lora_rank 16 ({request.lora_name})")
        self.added.append((request.lora_name, request.lora_path))
        return True


def _replica(node_module, engine: _Engine):
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    models = OpenAIServingModels(engine, [BaseModelPath(name="tiny", model_path="/models/tiny")])  # type: ignore[arg-type]
    return SimpleNamespace(engine=SimpleNamespace(_oai_models=models), _llm_config=SimpleNamespace(model_id="tiny")), models


def _ids(models) -> dict[str, str | None]:
    return {card.id: card.parent for card in asyncio.run(models.show_available_models()).data}


def test_a_replica_loads_added_adapters_into_its_running_engine_and_unloads_removed_ones(node_module):
    engine = _Engine()
    replica, models = _replica(node_module, engine)
    sync = node_module.sync_adapters
    asyncio.run(sync(replica, {LORA_KEY: [{"name": "sql", "source": "/m/sql"}]}))
    assert engine.added == [("sql", "/m/sql")] and _ids(models) == {"tiny": None, "sql": "tiny"}  # listed with its base as parent
    asyncio.run(sync(replica, {LORA_KEY: [{"name": "sql", "source": "/m/sql"}, {"name": "chat", "source": "/m/chat"}]}))
    assert engine.added == [("sql", "/m/sql"), ("chat", "/m/chat")]  # sql not loaded twice
    asyncio.run(sync(replica, {LORA_KEY: [{"name": "chat", "source": "/m/chat-v2"}]}))
    assert _ids(models) == {"tiny": None, "chat": "tiny"} and engine.added[-1] == ("chat", "/m/chat-v2")  # re-sourced
    asyncio.run(sync(replica, {LORA_KEY: []}))
    assert _ids(models) == {"tiny": None}


def test_an_adapter_the_engine_refuses_is_logged_and_the_replica_keeps_serving_the_rest(node_module, caplog):
    engine = _Engine(refuse="big")
    replica, models = _replica(node_module, engine)
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        asyncio.run(node_module.sync_adapters(replica, {LORA_KEY: [{"name": "big", "source": "/m/big"}, {"name": "sql", "source": "/m/sql"}]}))
    assert _ids(models) == {"tiny": None, "sql": "tiny"}
    assert f"{node_hooks.ADAPTER_FAILED_LINE} (big from /m/big: LoRA rank 32 is greater than max_lora_rank 16" in caplog.text
    assert f"{node_hooks.ADAPTER_LOADED_LINE} (sql from /m/sql)" in caplog.text


def test_orchs_replica_class_has_the_reconfigure_serve_calls(node_module, monkeypatch):
    # Serve refuses a user_config for a class without reconfigure (replica.py call_reconfigure)
    cls = node_module.LLMServerIngress
    assert callable(getattr(cls, "reconfigure", None)) and cls.__name__ == "LLMServer"


# ---- the decision ----


def _app(tmp_path: Path, adapters, lora: LoraOptions | None = LoraOptions(2, 16), replicas: int = 1) -> dict:
    from orchestrator.plan.tinymodel import build_tiny_model

    model = tmp_path / "tiny"
    if not model.exists():
        build_tiny_model(model)
    manifest = load_manifest_file(TEMPLATES / "local.yaml")
    request = RolloutRequest(model=str(model), served_name="tiny", max_model_len=1024, replicas=replicas, adapters=tuple(adapters), lora=lora)
    return desired_for_model(manifest, request)([], 2).rendered.app


SQL, CHAT = LoraAdapter("sql", "/m/sql"), LoraAdapter("chat", "s3://b/chat")


def test_an_added_adapter_with_the_same_slots_is_a_light_change_whose_args_are_the_same(tmp_path):
    live, want = _app(tmp_path, [SQL]), _app(tmp_path, [SQL, CHAT])
    assert want["args"] == live["args"]  # the code version Serve hashes from args is the same
    assert config_fingerprint(want, "k") != config_fingerprint(live, "k")  # but a new revision
    rescale, change = decisions.light_change(live, want, "k", config_fingerprint(live, "k"))
    assert rescale is None and change == decisions.AdapterChange(added=("chat",), removed=())
    serving = decisions.Serving(revision=3, fingerprint="old", app_name="orch", app_status="RUNNING")
    decided = decisions.decide("new", serving, room_for_copy=True, allow_downtime=False, downtime_s=None, adapters=change)
    assert decided.kind == decisions.ADAPTERS and "adds chat" in decided.reason and "none restarts" in decided.reason
    # back (a rollback): the same light change the other way
    assert decisions.light_change(want, live, "k", config_fingerprint(want, "k")) == (None, decisions.AdapterChange((), ("chat",)))
    assert decisions.light_change(live, want, "rotated", config_fingerprint(live, "k")) == (None, None)  # a new key is more


def test_an_added_adapter_with_one_more_replica_is_a_scale_that_names_the_adapters(tmp_path):
    live = _app(tmp_path, [SQL])
    rescale, change = decisions.light_change(live, _app(tmp_path, [SQL, CHAT], replicas=2), "k", config_fingerprint(live, "k"))
    assert rescale == (1, 2) and change == decisions.AdapterChange(("chat",), ())
    serving = decisions.Serving(revision=3, fingerprint="old", app_name="orch", app_status="RUNNING")
    decided = decisions.decide("new", serving, True, False, None, rescale=rescale, room_for_added=True, adapters=change)
    assert decided.kind == decisions.SCALE and "adds chat" in decided.reason
    # the body the rollout puts: the live config with the count and the adapters as overrides
    body = with_runtime_adapters(with_replicas(live, 2), runtime_adapters(_app(tmp_path, [SQL, CHAT])))
    assert body["args"] == live["args"] and [a.name for a in adapters_of(body)] == ["chat", "sql"]


def test_new_slots_or_a_base_without_lora_need_a_new_engine_and_the_decision_says_so(tmp_path):
    live = _app(tmp_path, [SQL])
    bigger = _app(tmp_path, [SQL, CHAT], lora=LoraOptions(2, 32))
    assert decisions.light_change(live, bigger, "k", config_fingerprint(live, "k")) == (None, None)
    assert "max_lora_rank 16 -> 32" in (decisions.lora_restart(live, bigger) or "")
    plain = _app(tmp_path, [], lora=None)
    assert "deployments" not in plain and decisions.lora_restart(plain, _app(tmp_path, [SQL])).startswith(
        "the serving engine was started without LoRA slots (enable_lora)")  # fmt: skip
    assert decisions.lora_restart(live, _app(tmp_path, [SQL, CHAT])) is None
    serving = decisions.Serving(revision=3, fingerprint="old", app_name="orch", app_status="RUNNING")
    side = decisions.decide("new", serving, room_for_copy=True, allow_downtime=False, downtime_s=None)
    noted = decisions.beside({}, "tiny", side, "orch", "/", decisions.lora_restart(plain, live))
    assert noted.kind == decisions.SIDE_BY_SIDE and any("without LoRA slots" in n for n in noted.notes)
