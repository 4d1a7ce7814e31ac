"""`orch status` tells who each node is and whether the cluster does its job (issue 46): each
node's Ray node id and start time from the dashboard's own answer (captured from Ray 2.60 in
tests/data/ray_dashboard), and a top-level ``healthy`` that is false whenever the model the
cluster should serve is not served, whatever the nodes say."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cluster.node_state import parse_nodes
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes.facts import Versions
from orchestrator.status.nodes import StatusReport, build_nodes_section
from orchestrator.status.views import ServingStatus

DATA = Path(__file__).resolve().parents[1] / "data" / "ray_dashboard"
YAML = """
name: two
nodes:
  - {name: head, host: 192.0.2.2, role: head, gpus: 8}
  - {name: w1, host: 192.0.2.2, port: 2222, gpus: 8}
"""
# the two node records of nodes_two.json, as Ray listed them
HEAD_ID = "4a51e475b74873aa368577d96ff6ca434bb306068e8ff1632b78d131"
W1_ID = "7f3c9c67a98e5bbbd21e56c2745fe85b823b740b1fe62276c7bb2bc3"


def section(capture: str):
    manifest = load_manifest(YAML, Path("/x/two.yaml"))
    states = parse_nodes(json.loads((DATA / capture).read_text()))
    reach = {n.name: Versions(ray="2.60.0") for n in manifest.nodes}
    return build_nodes_section(manifest, states, reach)


def test_each_node_row_carries_its_ray_node_id_and_start_time():
    rows = {r["name"]: r for r in section("nodes_two.json").to_dict()["nodes"]}
    assert rows["head"]["node_id"] == HEAD_ID and rows["w1"]["node_id"] == W1_ID
    assert rows["head"]["start_time_ms"] == 1795945111567 and rows["w1"]["start_time_ms"] == 1795945119308
    # `date -u -d @1795945111.567`: 2026-11-29 09:38:31.567 UTC
    assert rows["head"]["started_at"] == "2026-11-29T09:38:31.567+00:00"


def test_a_dead_node_keeps_the_identity_of_the_record_that_died():
    rows = {r["name"]: r for r in section("nodes_dead.json").to_dict()["nodes"]}
    assert rows["w1"]["ray_state"] == "DEAD" and rows["w1"]["node_id"] == W1_ID
    assert rows["w1"]["start_time_ms"] == 1795945119308


def running(healthy: bool = True) -> ServingStatus:
    return ServingStatus(app_name="orch-r1", app_status="RUNNING" if healthy else "DEPLOYING")


def test_top_level_health_is_false_when_the_expected_model_is_not_served():
    nodes = section("nodes_two.json")
    assert nodes.healthy  # both nodes ALIVE with their 8 GPUs
    gone = StatusReport("two", nodes, expected_model="tiny").to_dict()
    assert gone["healthy"] is False and gone["nodes_healthy"] is True and gone["serving_healthy"] is False
    assert StatusReport("two", nodes, expected_model="tiny").with_serving(running(False)).healthy is False
    served = StatusReport("two", nodes, expected_model="tiny").with_serving(running()).to_dict()
    assert served["healthy"] is True and served["serving_healthy"] is True and served["expected_model"] == "tiny"


def test_nothing_expected_leaves_health_to_the_nodes():
    assert StatusReport("two", section("nodes_two.json")).to_dict()["healthy"] is True
    dead = StatusReport("two", section("nodes_dead.json"), expected_model="tiny").with_serving(running())
    assert dead.to_dict()["healthy"] is False and dead.to_dict()["serving_healthy"] is True
