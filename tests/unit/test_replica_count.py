"""The replica count as an app-level override (a count-only change, Serve's lightweight update):
how it is written (``config.with_replicas``), read back (``shapes.effective_app``), counted in
the fingerprint and the capacity, and when a change is one (``decisions.replica_change``). Pure.
Deployment names as Serve LLM gives them: ``LLMServer:<model_id>`` (Ray 2.60
``ray/llm/_internal/serve/core/server/builder.py``); num_replicas is a LightWeight option
(``ray/serve/_private/config.py``)."""

from __future__ import annotations

import copy

import pytest

from orchestrator.serve import decisions
from orchestrator.serve.config import with_max_surge, with_replicas
from orchestrator.serve.fingerprint import config_fingerprint
from orchestrator.serve.shapes import effective_app, replica_override


def _app(replicas=1, model="tiny", **dep):
    llm = {"model_loading_config": {"model_id": model}, "engine_kwargs": {"max_model_len": 1024, "api_key": ["<redacted>"]},
           "placement_group_config": {"strategy": "STRICT_PACK", "bundles": [{"CPU": 1}]},
           "deployment_config": {"num_replicas": replicas, **dep}}  # fmt: skip
    return {"name": "orch", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app", "args": {"llm_configs": [llm]}}


def _dp_app(replicas=2):
    llm = {"model_loading_config": {"model_id": "moe"}, "engine_kwargs": {"data_parallel_size": 2},
           "deployment_config": {"num_replicas": replicas}}  # fmt: skip
    return {"name": "orch", "route_prefix": "/", "import_path": "ray.serve.llm:build_dp_openai_app", "args": {"llm_config": llm}}


def test_with_replicas_sets_only_the_engine_override_and_keeps_args():
    app = _app(1)
    scaled = with_replicas(app, 3)
    assert scaled["args"] == app["args"] and scaled["deployments"] == [{"name": "LLMServer:tiny", "num_replicas": 3}]
    assert "deployments" not in app  # a copy
    # the count the model config already says: no override at all
    assert "deployments" not in with_replicas(scaled, 1)
    # beside the surge override of the same deployment, and back
    surged = with_max_surge(app, 100)
    both = with_replicas(surged, 2)
    assert both["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 100, "num_replicas": 2}]
    assert with_replicas(both, 1)["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 100}]
    with pytest.raises(ValueError):
        with_replicas(app, 0)


def test_effective_app_folds_the_override_into_the_model_config():
    scaled = with_replicas(_app(1), 4)
    assert replica_override(scaled) == 4 and replica_override(_app(1)) is None
    seen = effective_app(scaled)
    assert seen["args"]["llm_configs"][0]["deployment_config"]["num_replicas"] == 4 and "deployments" not in seen
    assert effective_app(_app(2)) == _app(2)
    # another deployment's entry (the router) and the engine's other options stay
    surged = with_max_surge(scaled, 100)
    other = {**surged, "deployments": [*surged["deployments"], {"name": "LLMRouter", "max_surge_percent": 100}]}
    assert effective_app(other)["deployments"] == [{"name": "LLMServer:tiny", "max_surge_percent": 100}, {"name": "LLMRouter", "max_surge_percent": 100}]
    # an entry of another model's engine is not this application's count
    assert replica_override({**_app(1), "deployments": [{"name": "LLMServer:other", "num_replicas": 5}]}) is None


def test_a_count_given_either_way_is_the_same_config_and_capacity():
    assert config_fingerprint(with_replicas(_app(1), 3), "k") == config_fingerprint(_app(3), "k")
    assert config_fingerprint(with_replicas(_app(1), 3), "k") != config_fingerprint(_app(1), "k")
    assert len(decisions.copy_demand(with_replicas(_app(1), 3))[0]) == 3


def test_replica_change_is_a_count_only_change_of_the_serving_config():
    serving = config_fingerprint(_app(1), "k")
    assert decisions.replica_change(_app(1), _app(3), "k", serving) == (1, 3)
    assert decisions.replica_change(with_replicas(_app(1), 3), _app(1), "k", config_fingerprint(_app(3), "k")) == (3, 1)
    # the desired config as a stored override (a rollback to a scaled revision)
    assert decisions.replica_change(_app(1), with_replicas(_app(1), 2), "k", serving) == (1, 2)
    assert decisions.replica_change(_app(1), _app(1), "k", serving) is None  # no change
    changed = copy.deepcopy(_app(3))
    changed["args"]["llm_configs"][0]["engine_kwargs"]["max_model_len"] = 2048
    assert decisions.replica_change(_app(1), changed, "k", serving) is None  # more than the count
    assert decisions.replica_change(_app(1), _app(3), "rotated", serving) is None  # a new key
    assert decisions.replica_change(None, _app(3), "k", serving) is None and decisions.replica_change(_app(1), _app(3), "k", None) is None
    auto = _app(1, autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    del auto["args"]["llm_configs"][0]["deployment_config"]["num_replicas"]
    assert decisions.replica_change(_app(1), auto, "k", serving) is None  # autoscaling: Serve's to decide
    dp = config_fingerprint(_dp_app(2), "k")
    assert decisions.replica_change(_dp_app(2), _dp_app(4), "k", dp) is None  # a gang shape: full revision


def test_decide_scales_when_only_the_count_changes():
    live = decisions.Serving(revision=2, fingerprint="old", app_name="orch", app_status="RUNNING")
    up = decisions.decide("new", live, room_for_copy=True, allow_downtime=False, downtime_s=None, rescale=(1, 2), room_for_added=True)
    assert up.kind == decisions.SCALE and "(1 -> 2)" in up.reason and "adds 1" in up.reason
    full = decisions.decide("new", live, room_for_copy=True, allow_downtime=True, downtime_s=None, rescale=(1, 3), room_for_added=False)
    assert full.kind == decisions.REFUSE and "no room for 2 more replica(s)" in full.reason and "keeps serving on 1" in full.reason
    down = decisions.decide("new", live, room_for_copy=False, allow_downtime=False, downtime_s=None, rescale=(3, 1), room_for_added=False)
    assert down.kind == decisions.SCALE and "stops 2" in down.reason
    same = decisions.decide("old", live, room_for_copy=True, allow_downtime=False, downtime_s=None, rescale=(1, 2), room_for_added=True)
    assert same.kind == decisions.NOOP
    gone = decisions.Serving(revision=2, fingerprint="old", app_name="orch", app_status="DEPLOY_FAILED")
    assert decisions.decide("new", gone, True, False, None, rescale=(1, 2), room_for_added=True).kind == decisions.FRESH
