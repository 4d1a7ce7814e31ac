"""The front's rendered application (orchestrator/serve/front.py)."""

from __future__ import annotations

from orchestrator.serve import front, node_hooks
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER, mask_api_key


def test_the_front_config_carries_its_models_and_key_in_user_config_only():
    models = {"b": ("orch-m-b", "DPServer:b"), "a": ("orch", "LLMServer:a")}
    app = front.front_app("c1", models, "/", api_key="k-1", adapters={"a": ["sql", "chat"]})
    assert (app["name"], app["route_prefix"], app["import_path"]) == ("orch-front", "/", "orch_serve_hooks:build_front")
    # Serve hashes args and runtime_env into the code version: neither names a model or the key
    assert app["args"] == {"replicas": 1}
    assert app["runtime_env"] == {"env_vars": {"PYTHONPATH": node_hooks.pythonpath("c1")}}
    (dep,) = app["deployments"]
    assert dep["name"] == "OrchFront" and dep["user_config"]["models"] == [
        {"model_id": "a", "app": "orch", "deployment": "LLMServer:a", "adapters": ["chat", "sql"]},
        {"model_id": "b", "app": "orch-m-b", "deployment": "DPServer:b", "adapters": []},
    ]
    assert front.front_models(app) == models and front.front_key(app) == "k-1"
    assert front.front_adapters(app) == {"a": ("chat", "sql"), "b": ()} and front.front_adapters(None) == {}
    assert front.front_models(None) == {} and front.front_models({"deployments": [{"name": "x"}]}) == {}
    # what is stored never holds the key (the state store masks every api_key)
    assert front.front_key(mask_api_key(app)) == API_KEY_PLACEHOLDER
    assert front.front_key(front.front_app("c1", models, "/")) == API_KEY_PLACEHOLDER
    assert front.is_front(app) and not front.is_front({"name": "orch", "import_path": node_hooks.BUILDER_IMPORT_PATH})


def test_the_front_is_known_by_its_name_or_its_builder_and_other_deployments_are_not_it():
    assert front.is_front({"name": "orch-front", "import_path": "x:y"})
    assert front.is_front({"name": "renamed", "import_path": "orch_serve_hooks:build_front"})
    assert not front.is_front({"name": "orch", "import_path": "orch_serve_hooks:build_openai_app"}) and not front.is_front({})
    app = front.front_app("c1", {"a": ("orch", "LLMServer:a")}, "/v1", user_pythonpath="/opt/lib", api_key="k-2", adapters={"a": ["x"]})
    assert app["runtime_env"]["env_vars"]["PYTHONPATH"] == node_hooks.pythonpath("c1", "/opt/lib") != node_hooks.pythonpath("c1")
    # an override for another deployment of the application (Serve's app-level list) is not the front's
    other = {"name": "Other", "user_config": {"models": [{"model_id": "z", "app": "q", "deployment": "d", "adapters": ["w"]}],
                                              "api_key": ["not-it"]}}  # fmt: skip
    app["deployments"] = [other, *app["deployments"]]
    assert front.front_key(app) == "k-2" and front.front_models(app) == {"a": ("orch", "LLMServer:a")}
    assert front.front_adapters(app) == {"a": ("x",)}
    app["deployments"][1]["user_config"]["api_key"] = []
    assert front.front_key(app) is None
