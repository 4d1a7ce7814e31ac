"""Engine workers of a replica from Ray's actor list (``status.workers``) and in the serving
section, on real dashboard JSON captured from the test bed (issue 18): Ray 2.60.0, vLLM 0.32.0
with the device-key stand-in, one TP=2 replica of the tiny model spanning two test hosts
(``/api/v0/actors?detail=true`` and ``/api/v0/nodes?detail=true`` of the head while it was
RUNNING, during tests/integration/test_gpu_path.py). In that capture the replica actor and rank
TP0 ran on host1 (10.174.228.11, node 6330ecf6e3...) and rank TP1 on host0 (10.174.228.10,
node 8c8148c339...), all in placement group 97acec837d42...; the LLMRouter replicas have none."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.cluster.node_state import DashboardFormatError, parse_nodes
from orchestrator.status.serving import build_serving_status
from orchestrator.status.views import NodeRef
from orchestrator.status.workers import engine_workers, parse_actors, rank_of

DATA = Path(__file__).resolve().parents[1] / "data" / "ray_dashboard"
REPLICA = "SERVE_REPLICA::orch-r1#LLMServer:tiny#cbdvt3b9"
HOST0 = "8c8148c339"
HOST1 = "6330ecf6e3"


def actors():
    return parse_actors(json.loads((DATA / "actors_tp2_two_hosts.json").read_text()))


def test_the_replicas_workers_are_the_worker_actors_of_its_placement_group():
    workers = engine_workers(REPLICA, actors())
    assert [(w.rank, w.node_id[:10], w.pid, w.state) for w in workers] == [("TP0", HOST1, 429, "ALIVE"), ("TP1", HOST0, 776, "ALIVE")]
    assert engine_workers("SERVE_REPLICA::orch-r1#LLMRouter#1o9ixlxq", actors()) == []  # no placement group
    assert engine_workers(None, actors()) == [] and engine_workers("SERVE_REPLICA::gone", actors()) == []


def test_rank_labels_and_bad_payloads():
    assert rank_of("vllm_Worker_1796138651806116467_TP1") == "TP1"
    assert rank_of("vllm_Worker_1796138651806116467_PP1_TP3") == "PP1_TP3"
    assert rank_of("SERVE_CONTROLLER_ACTOR") is None
    with pytest.raises(DashboardFormatError):
        parse_actors({"result": False, "msg": "boom"})
    with pytest.raises(DashboardFormatError):
        parse_actors({"result": True, "data": {"result": {}}})


def _serve(node_id: str):
    replica = SimpleNamespace(replica_id="cbdvt3b9", state="RUNNING", node_id=node_id, node_ip="10.174.228.11", pid=151,
                              worker_id=None, actor_name=REPLICA, start_time_s=None)  # fmt: skip
    dep = SimpleNamespace(name="LLMServer:tiny", status="HEALTHY", message="", target_replicas=1, replicas=[replica])
    app = SimpleNamespace(name="orch-r1", status="RUNNING", message="", route_prefix="/", deployments=[dep])
    return SimpleNamespace(applications={"orch-r1": app}, app=lambda n: app if n == "orch-r1" else None)


def test_serving_status_names_each_workers_node_and_flags_a_worker_on_a_dead_node():
    nodes = parse_nodes(json.loads((DATA / "nodes_tp2_two_hosts.json").read_text()))
    ids = {n.address: n.node_id for n in nodes}
    host0, host1 = ids["10.174.228.10"], ids["10.174.228.11"]
    workers = {"cbdvt3b9": engine_workers(REPLICA, actors())}
    alive = [NodeRef("host0", host0, "ALIVE"), NodeRef("host1", host1, "ALIVE")]
    status = build_serving_status(_serve(host1), nodes=alive, engine_workers=workers)
    (replica,) = status.deployments[0].replicas
    assert [(w.rank, w.node, w.pid) for w in replica.workers] == [("TP0", "host1", 429), ("TP1", "host0", 776)]
    assert replica.to_dict()["workers"][1]["node"] == "host0"
    assert not [p for p in status.problems if p.code == "REPLICA_UNHEALTHY"]
    # host0 (rank TP1's node) dies; the replica itself sits on host1, which lives.
    dead = [NodeRef("host0", host0, "DEAD"), NodeRef("host1", host1, "ALIVE")]
    status = build_serving_status(_serve(host1), nodes=dead, engine_workers=workers)
    lost = [p for p in status.problems if p.code == "REPLICA_UNHEALTHY"]
    assert len(lost) == 1 and "lost engine workers: TP1 on host0 (node DEAD)" in lost[0].message
