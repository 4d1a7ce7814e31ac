"""The registry of application shapes (orchestrator/serve/shapes.py): which shape a plan and a
deployed config have, and that a third shape is one class: rendering, reading, rollout decisions,
validation and status dispatch to it without a change anywhere else.

The two real shapes are read from the configs Serve ran on the test bed
(tests/data/serve/status-running-direct-streaming.json: build_openai_app, args.llm_configs;
status-dp-ep-two-hosts-starting.json: build_dp_openai_app, args.llm_config, DPServer:tiny) and
from the DP ranks' replica logs of that run (tests/data/logs/moe/). The toy shape is made up here,
on purpose: nothing outside this file knows it.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.errors import OrchError, ServeConfigError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.serve import decisions, shapes
from orchestrator.serve.config import AppTarget, ServeDefaults, ServingPlan, render_app, serve_in_flight
from orchestrator.serve.fingerprint import API_KEY_PLACEHOLDER
from orchestrator.serve.ray_io.client import parse_serve_status
from orchestrator.serve.shapes import (
    AppShape,
    api_key_of,
    llm_config_of,
    llm_configs,
    model_of_deployment,
    shape_of_app,
    shape_of_plan,
)
from orchestrator.status.engine_stats import parse_dp_rank
from orchestrator.status.serving import build_serving_status
from orchestrator.status.views import NodeRef

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
TP_STATUS = json.loads((DATA / "serve/status-running-direct-streaming.json").read_text())
TP_APP = TP_STATUS["applications"]["orch-r1"]["deployed_app_config"]
DP_STATUS = json.loads((DATA / "serve/status-dp-ep-two-hosts-starting.json").read_text())
DP_APP = DP_STATUS["applications"]["moe-dp"]["deployed_app_config"]
DP_LOGS = {rid: (DATA / f"logs/moe/dpserver-rank{i}-replica.err").read_text().splitlines() for i, rid in enumerate(("5jlsombh", "klw5xacc"))}
TARGET = AppTarget("orch-r1", "/", "tiny", "/models/tiny")


@pytest.fixture(scope="module")
def local():
    return load_manifest_file(REPO / "cluster-templates" / "local.yaml")


# ------------------------------------------------------------------------- the two real shapes


def test_the_registry_holds_both_shapes_and_tp_pp_is_the_default():
    assert list(shapes.SHAPES)[:2] == ["tp_pp", "dp"] and shapes.DEFAULT_SHAPE == "tp_pp"
    assert shapes.get_shape("dp") is shapes.SHAPES["dp"]
    with pytest.raises(ServeConfigError, match="unknown application shape 'pp_tp'"):
        shapes.get_shape("pp_tp")
    assert shape_of_plan(ServingPlan(tp=2, pp=2, max_model_len=1)).name == "tp_pp"
    # the boundary: one rank is no data-parallel group, two are
    assert shape_of_plan(ServingPlan(tp=1, pp=1, max_model_len=1, dp=1)).name == "tp_pp"
    assert shape_of_plan(ServingPlan(tp=1, pp=1, max_model_len=1, dp=2)).name == "dp"


def test_the_deployed_configs_read_as_their_shapes():
    tp, dp = shape_of_app(TP_APP), shape_of_app(DP_APP)
    assert (tp.name, tp.config_path, tp.engine_class) == ("tp_pp", "args.llm_configs[0]", "LLMServer")
    assert (dp.name, dp.config_path, dp.engine_class) == ("dp", "args.llm_config", "DPServer")
    # What Serve named the engine deployments in those runs
    assert set(DP_STATUS["applications"]["moe-dp"]["deployments"]) == {"DPServer:tiny", "LLMRouter"}
    assert model_of_deployment("DPServer:tiny") == model_of_deployment("LLMServer:tiny") == "tiny"
    assert model_of_deployment("LLMRouter") is None
    assert llm_config_of(TP_APP) is TP_APP["args"]["llm_configs"][0] and llm_config_of(DP_APP) is DP_APP["args"]["llm_config"]
    # orch's own builder on the nodes makes the TP x PP shape too
    assert shape_of_app({**TP_APP, "import_path": "orch_serve_hooks:build_openai_app"}).name == "tp_pp"


def test_a_config_without_import_path_is_read_by_its_args_key():
    assert shape_of_app({"args": {"llm_config": {}}}).name == "dp"
    assert shape_of_app({"args": {"llm_configs": [{}]}}).name == "tp_pp"
    with pytest.raises(ServeConfigError, match="neither an import_path nor a model config"):
        shape_of_app({"name": "x", "args": {}})


def test_an_unknown_import_path_is_an_error_that_names_it():
    app = {**TP_APP, "name": "other", "import_path": "my_pkg.apps:build_chat_app"}
    with pytest.raises(OrchError) as caught:
        shape_of_app(app)
    assert "'my_pkg.apps:build_chat_app'" in str(caught.value) and "'other'" in str(caught.value)
    assert "ray.serve.llm:build_dp_openai_app" in caught.value.hint
    # the lenient readers still read a foreign application (orch status lists what Serve runs)
    assert llm_configs(app) == TP_APP["args"]["llm_configs"] and api_key_of({"import_path": "x:y"}) is None


def test_a_shape_name_is_registered_once():
    with pytest.raises(ValueError, match="'dp' is registered twice"):

        class AnotherDp(AppShape, name="dp"):
            pass

    assert type(shapes.SHAPES["dp"]).__name__ == "DpShape"


# ------------------------------------------------------------------------- a third shape


class ToyShape(AppShape):
    """A made-up builder: groups of ``tp`` == 3 engines, config under ``args.toy_config``."""

    import_paths = ("toy_pkg:build_toy_app",)
    args_key = "toy_config"
    args_is_list = False
    engine_class = "ToyServer"
    description = "a toy application (ToyServer)"
    gang = True
    rank_log = re.compile(r"toy rank (?P<rank>\d+)/(?P<size>\d+) in (?P<gang>\w+)")
    rank_log_keyword = "toy rank"
    calls: ClassVar[list[str]] = []

    def serves(self, plan: ServingPlan) -> bool:
        return plan.tp == 3

    def engine_kwargs(self, plan: ServingPlan) -> dict[str, Any]:
        return {"toy_groups": plan.replicas}

    def placement(self, plan, accelerator, stage_nodes, node_resource, cpus_per_cpu_worker=1):
        return [{"CPU": 3.0}], "SPREAD"

    def ranks_per_serve_replica(self, plan: ServingPlan) -> int:
        return 2

    def capacity_groups(self, bundles, strategy, replicas, llm_config):
        self.calls.append("capacity_groups")
        return [list(bundles) * 3], "STRICT_SPREAD"


@pytest.fixture
def toy():
    """Register the toy shape for one test (writing the class is all it takes), then remove it."""
    type("RegisteredToy", (ToyShape,), {}, name="toy")  # class RegisteredToy(ToyShape, name="toy")
    try:
        yield shapes.SHAPES["toy"]
    finally:
        shapes.SHAPES.pop("toy", None)


def test_rendering_dispatches_to_a_new_shape(local, toy):
    plan = ServingPlan(tp=3, pp=1, max_model_len=2048, replicas=2, max_num_seqs=8)
    app = render_app(local, plan, TARGET, node_resource=node_resource, node_cores=2).app
    assert app["import_path"] == "toy_pkg:build_toy_app" and list(app["args"]) == ["toy_config"]
    llm = app["args"]["toy_config"]
    assert llm["engine_kwargs"]["toy_groups"] == 2
    assert llm["placement_group_config"] == {"strategy": "SPREAD", "bundles": [{"CPU": 3.0}]}
    # its replicas' batch: two engines of max_num_seqs 8, with the 1.25 headroom
    assert llm["deployment_config"]["max_ongoing_requests"] == math.ceil(8 * 2 * 1.25) == serve_in_flight(plan, ServeDefaults()).max_ongoing_requests
    # the readers find its config and key where it keeps them
    assert shape_of_app(app) is toy and llm_config_of(app) is llm and api_key_of(app) == API_KEY_PLACEHOLDER
    # the two real shapes are untouched by it
    assert shape_of_plan(ServingPlan(tp=2, pp=1, max_model_len=1, dp=2)).name == "dp"


def test_decisions_dispatch_to_a_new_shape(toy):
    app = {"import_path": "toy_pkg:build_toy_app", "args": {"toy_config": copy.deepcopy(TP_APP["args"]["llm_configs"][0])}}
    ToyShape.calls.clear()
    groups, strategy = decisions.copy_demand(app)
    assert ToyShape.calls == ["capacity_groups"] and strategy == "STRICT_SPREAD" and len(groups) == 1
    why = decisions.engine_change(TP_APP, app)
    assert why == ("the switch turns a tensor/pipeline-parallel application (LLMServer) into a toy application (ToyServer): "
                   "Serve replaces the engine deployment without a surge")  # fmt: skip
    assert decisions.engine_change(app, app) is None


def test_status_reads_a_new_shapes_ranks_and_groups(toy):
    data = copy.deepcopy(DP_STATUS)
    app = data["applications"]["moe-dp"]
    app["deployed_app_config"] = {**app["deployed_app_config"], "import_path": "toy_pkg:build_toy_app",
                                  "args": {"toy_config": app["deployed_app_config"]["args"]["llm_config"]}}  # fmt: skip
    dep = app["deployments"].pop("DPServer:tiny")
    dep["name"] = "ToyServer:tiny"
    dep["replicas"] = dep["replicas"][:1]  # one of the group's two ranks is gone
    app["deployments"]["ToyServer:tiny"] = dep
    # the DP ranks' real lines, said the toy's way
    logs = {rid: [re.sub(r"DPServer replica initialized: dp_rank=(\d+), dp_size=(\d+), gang_id=(\w+)", r"toy rank \1/\2 in \3", line)
                  for line in lines] for rid, lines in DP_LOGS.items()}  # fmt: skip
    assert parse_dp_rank(logs["5jlsombh"]).to_dict() == {"rank": 0, "size": 2, "group": "0c6edda3"}
    nodes = [NodeRef("node0", "cb7f71908e7edcf566e58c0930595a024b25c58786f6b2aeaf249ea4", "ALIVE")]
    s = build_serving_status(parse_serve_status(data), revision=None, engine_logs=logs, nodes=nodes)
    (group,) = [p for p in s.problems if p.subject == "ToyServer:tiny group 0c6edda3"]
    assert "0 of 2 ranks RUNNING (rank 0 STARTING on node0, 1 rank(s) not in Serve)" in group.message


def test_validation_names_a_new_shapes_engine_kwargs_rule(toy):
    """validate_app asks the shape for its engine-argument rule (the DP shape: DPServer's
    positive data_parallel_size), with the shape's config path in the message."""
    pytest.importorskip("ray.serve.llm")
    from orchestrator.serve.ray_io.validate import validate_app

    def refuse(engine_kwargs, prefix):
        raise ServeConfigError(f"{prefix}: no toys today")

    llm = copy.deepcopy(TP_APP["args"]["llm_configs"][0])
    app = {"name": "orch-r9", "import_path": "toy_pkg:build_toy_app", "args": {"toy_config": llm}}
    toy.check_engine_kwargs = refuse
    with pytest.raises(ServeConfigError, match=r"applications\[orch-r9\]\.args\.toy_config: no toys today"):
        validate_app(app, check_engine_args=False)


def test_two_shapes_claiming_one_plan_is_an_error(toy):
    class Greedy(AppShape, name="greedy"):
        import_paths = ("greedy:app",)
        args_key, args_is_list, engine_class, description = "g", False, "Greedy", "a greedy application"

        def serves(self, plan):
            return True

    try:
        with pytest.raises(ServeConfigError, match="toy, greedy all claim the plan"):
            shape_of_plan(ServingPlan(tp=3, pp=1, max_model_len=1))
    finally:
        shapes.SHAPES.pop("greedy")


@pytest.mark.parametrize("size", [0, -1, "2", 2.0])
def test_the_dp_shape_refuses_a_dp_size_dpserver_refuses(size):
    """DPServer.get_deployment_options (Ray 2.60, data_parallel/dp_server.py) raises
    "Invalid data_parallel_size: ..., expecting positive integer" unless it is an int > 0; the DP
    shape says so before anything is applied, naming the field in the DP application."""
    pytest.importorskip("ray.serve.llm")
    from orchestrator.serve.ray_io.validate import validate_app

    app = copy.deepcopy(DP_APP)
    app["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] = size
    with pytest.raises(ServeConfigError, match=r"applications\[moe-dp\]\.args\.llm_config\.engine_kwargs\.data_parallel_size: "):
        validate_app(app, check_engine_args=False)
    app["args"]["llm_config"]["engine_kwargs"]["data_parallel_size"] = 1  # the smallest it takes
    validate_app(app, check_engine_args=False)
