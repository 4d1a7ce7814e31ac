"""The surge an apply asks Serve for (serve.config.with_max_surge) and the engine deployment it
names (serve.shapes.engine_deployment_name): checked against real Serve status captures (the
deployment names Serve reported for the config it ran) and Ray 2.60's sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.serve.config import IN_PLACE_SURGE_PERCENT, max_surge_of, with_max_surge
from orchestrator.serve.fingerprint import config_fingerprint
from orchestrator.serve.shapes import engine_deployment_name

DATA = Path(__file__).resolve().parents[1] / "data" / "serve"


def _captured(name: str) -> tuple[dict, list[str]]:
    """(the deployed config, the deployment names Serve reported for it) of a status capture."""
    (app,) = json.loads((DATA / name).read_text())["applications"].values()
    return app["deployed_app_config"], list(app["deployments"])


@pytest.mark.parametrize("capture", ["status-running-direct-streaming.json", "status-dp-ep-two-hosts-starting.json"])
def test_the_engine_deployment_is_named_as_serve_named_it(capture):
    config, deployments = _captured(capture)
    name = engine_deployment_name(config)
    # Serve refuses an override of a deployment the application does not have
    # (application_state.override_deployment_info: "Deployment '...' does not exist").
    assert name in deployments and name.split(":")[0] in ("LLMServer", "DPServer")


def test_a_hub_id_is_named_as_serve_llm_names_it():
    # ray/llm/_internal/serve/core/server/builder.py, _get_deployment_name: "/" -> "--", "." -> "_".
    config, _ = _captured("status-running-direct-streaming.json")
    config["args"]["llm_configs"][0]["model_loading_config"]["model_id"] = "Qwen/Qwen2.5-0.5B-Instruct"
    assert engine_deployment_name(config) == "LLMServer:Qwen--Qwen2_5-0_5B-Instruct"


def _rendered() -> dict:
    config, _ = _captured("status-running-direct-streaming.json")
    config["args"]["llm_configs"][0].setdefault("deployment_config", {})["max_surge_percent"] = 100  # as orch renders it
    return config


def test_in_place_overrides_the_engine_surge_outside_args():
    app = _rendered()
    in_place = with_max_surge(app, IN_PLACE_SURGE_PERCENT)
    assert in_place["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 0}]
    # args untouched: Serve's code version (import path, runtime env, args) stays, so replicas
    # that run this config are not restarted by the override (deploy_utils.get_app_code_version).
    assert in_place["args"] == app["args"] and in_place["runtime_env"] == app["runtime_env"]
    assert max_surge_of(in_place) == 0 and max_surge_of(app) == 100
    assert "deployments" not in app  # a copy


def test_back_to_the_rendered_surge_drops_the_override():
    app = _rendered()
    assert with_max_surge(with_max_surge(app, 0), 100) == app
    assert with_max_surge(app, 100) == app  # nothing to override


def test_other_deployments_that_set_a_surge_get_the_same():
    app = _rendered()
    app["deployments"] = [{"name": "LLMRouter", "max_surge_percent": 100, "graceful_shutdown_wait_loop_s": 10}]
    out = with_max_surge(app, 0)
    assert out["deployments"] == [{"name": "LLMRouter", "max_surge_percent": 0, "graceful_shutdown_wait_loop_s": 10},
                                  {"name": "LLMServer:tiny", "max_surge_percent": 0}]  # fmt: skip
    assert with_max_surge(out, 100) == app


def test_the_surge_is_not_part_of_the_revision():
    app = _rendered()
    assert config_fingerprint(with_max_surge(app, 0), "k") == config_fingerprint(app, "k")
    changed = json.loads(json.dumps(app))
    changed["args"]["llm_configs"][0]["engine_kwargs"]["max_model_len"] = 2048
    assert config_fingerprint(with_max_surge(changed, 0), "k") != config_fingerprint(app, "k")
