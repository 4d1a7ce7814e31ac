"""`orch status` of a data-parallel application: each DP rank (a DPServer replica), its node, its
group, its KV cache, and the group's health under Serve's RESTART_GANG.

Inputs are real captures (tests/data/serve/SOURCES-status.md, tests/data/logs/SOURCES.md "moe/"):
Serve's status of a DP=2 + EP application on two test hosts while its gang was starting, and the
DPServer lines of the two ranks' replica logs from the same run. Where a test needs a state the
capture does not have (every rank RUNNING, a rank gone), it changes only that field of the
captured replica and says so.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

from orchestrator import engine_metrics as prom
from orchestrator.cli.status_serving import render_serving
from orchestrator.serve.ray_io.client import parse_serve_status
from orchestrator.status.engine_stats import parse_dp_rank, replica_gauges, start_up_lines
from orchestrator.status.serving import REPLICA_UNHEALTHY, build_serving_status, model_of_deployment, revision_app
from orchestrator.status.views import NodeRef

DATA = Path(__file__).resolve().parent.parent / "data"
PAYLOAD = json.loads((DATA / "serve/status-dp-ep-two-hosts-starting.json").read_text())
APP = "moe-dp"
# The two ranks' replicas in the capture: 5jlsombh (pid 4260) on the first host, klw5xacc (pid
# 1744) on the second; their worker logs are the two .err captures.
RANK0, RANK1 = "5jlsombh", "klw5xacc"
NODE0_ID = "cb7f71908e7edcf566e58c0930595a024b25c58786f6b2aeaf249ea4"
NODE1_ID = "33365e992fcb221453b4ee6a98874dea8d56036e9a119df50edb763f"
LOGS = {
    RANK0: (DATA / "logs/moe/dpserver-rank0-replica.err").read_text().splitlines(),
    RANK1: (DATA / "logs/moe/dpserver-rank1-replica.err").read_text().splitlines(),
}
NODES = [NodeRef("node0", NODE0_ID, "ALIVE"), NodeRef("node1", NODE1_ID, "ALIVE")]
# The CPU engine's capacity line as vLLM 0.32 logged it for the tiny MoE (docs/moe.md, DP=1 run).
CAPACITY = "(EngineCore pid=565) INFO 12-02 10:48:38 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency for 1,024 tokens per request: 512.00x"


def revision():
    config = PAYLOAD["applications"][APP]["deployed_app_config"]
    return SimpleNamespace(number=1, model="tiny", status="ready", config_fingerprint="cd" * 32, config=config,
                           app_name=APP, created_at=1.0, finished_at=2.0)  # fmt: skip


def payload_with(states: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict:
    """The capture with some replicas' state changed (or removed): the states the capture lacks."""
    data = copy.deepcopy(PAYLOAD)
    app = data["applications"][APP]
    for dep in app["deployments"].values():
        dep["replicas"] = [r for r in dep["replicas"] if r["replica_id"] not in drop]
        for r in dep["replicas"]:
            if states and r["replica_id"] in states:
                r["state"] = states[r["replica_id"]]
    if states and all(s == "RUNNING" for s in states.values()) and not drop:
        app["status"] = "RUNNING"
        for dep in app["deployments"].values():
            dep["status"] = "HEALTHY"
            for r in dep["replicas"]:
                r["state"] = "RUNNING"
    return data


def build(data=None, logs=None, **kw):
    return build_serving_status(parse_serve_status(data or PAYLOAD), revision=revision(), engine_logs=logs if logs is not None else LOGS,
                                nodes=NODES, **kw)  # fmt: skip


def test_each_rank_is_read_from_its_replica_log():
    assert parse_dp_rank(LOGS[RANK0]).to_dict() == {"rank": 0, "size": 2, "group": "0c6edda3"}
    assert parse_dp_rank(LOGS[RANK1]).to_dict() == {"rank": 1, "size": 2, "group": "0c6edda3"}
    assert parse_dp_rank([CAPACITY]) is None
    # A restarted gang logs again: the last line wins.
    later = "DPServer replica initialized: dp_rank=1, dp_size=2, gang_id=51ed77ad"
    assert parse_dp_rank([*LOGS[RANK1], later]).group == "51ed77ad"


def test_the_starting_gang_shows_both_ranks_on_their_nodes_and_one_group_problem():
    s = build()
    assert model_of_deployment("DPServer:tiny") == "tiny" and model_of_deployment("LLMRouter") is None
    (dp,) = [d for d in s.deployments if d.name == "DPServer:tiny"]
    ranks = {r.replica_id: (r.dp.rank, r.dp.group, r.node, r.state) for r in dp.replicas}
    assert ranks == {RANK0: (0, "0c6edda3", "node0", "STARTING"), RANK1: (1, "0c6edda3", "node1", "STARTING")}
    group = [p for p in s.problems if p.subject == "DPServer:tiny group 0c6edda3"]
    assert len(group) == 1 and group[0].code == REPLICA_UNHEALTHY and group[0].severity == "warn"
    assert "0 of 2 ranks RUNNING (rank 0 STARTING on node0, rank 1 STARTING on node1)" in group[0].message
    assert "RESTART_GANG" in group[0].hint and group[0].hint.endswith("runbooks/REPLICA_UNHEALTHY.md")
    assert not s.healthy


def test_a_whole_running_group_has_no_group_problem():
    s = build(payload_with({RANK0: "RUNNING", RANK1: "RUNNING"}))
    assert s.app_status == "RUNNING"
    assert not [p for p in s.problems if "group" in p.subject]
    (model,) = s.models
    assert model.model_id == "tiny"


def test_a_failed_rank_takes_its_whole_group_down_and_says_so():
    # Serve's states of a gang member that failed: UNHEALTHY replica (the rank) beside a RUNNING one.
    s = build(payload_with({RANK0: "RUNNING", RANK1: "UNHEALTHY"}))
    (group,) = [p for p in s.problems if p.subject == "DPServer:tiny group 0c6edda3"]
    assert group.severity == "fail"
    assert "does not serve: 1 of 2 ranks RUNNING (rank 1 UNHEALTHY on node1)" in group.message


def test_a_rank_missing_from_serve_is_a_failure_of_the_group():
    s = build(payload_with({RANK0: "RUNNING"}, drop=(RANK1,)))
    (group,) = [p for p in s.problems if p.subject == "DPServer:tiny group 0c6edda3"]
    assert group.severity == "fail" and "1 of 2 ranks RUNNING (1 rank(s) not in Serve)" in group.message


def test_ranks_not_logged_yet_are_one_unknown_group():
    s = build(logs={})
    (group,) = [p for p in s.problems if p.subject.startswith("DPServer:tiny group")]
    assert group.subject == "DPServer:tiny group ?" and "ranks not logged yet" in group.message


def test_kv_usage_is_per_replica_and_only_from_series_that_name_it():
    after = prom.parse_text((DATA / "metrics/ray-serve-llm-0.32-after2.txt").read_text())
    mine = replica_gauges(after, "75z13c9r")  # the replica of that capture
    assert (mine.kv_cache_usage, mine.running, mine.waiting) == (0.0, 0.0, 0.0)
    assert replica_gauges(after, RANK0).kv_cache_usage is None
    bare = prom.parse_text((DATA / "metrics/vllm-0.32-after.txt").read_text())  # no ReplicaId labels
    assert replica_gauges(bare, "75z13c9r").kv_cache_usage is None


def test_each_engine_replica_carries_its_own_gauges_in_json():
    # The single-replica capture (status-running-direct-streaming.json) with its metrics page.
    running = json.loads((DATA / "serve/status-running-direct-streaming.json").read_text())
    after = prom.parse_text((DATA / "metrics/ray-serve-llm-0.32-after2.txt").read_text())
    s = build_serving_status(parse_serve_status(running), metrics_now=after,
                             nodes=[NodeRef("head", "fb356170c7eeea9b674844e2204ed80ed204358c9e6c6ae6afcb634d", "ALIVE")])  # fmt: skip
    d = s.to_dict()
    engine = next(r for x in d["deployments"] if x["name"] == "LLMServer:tiny" for r in x["replicas"])
    assert (engine["kv_cache_usage"], engine["running"], engine["waiting"], engine["dp"]) == (0.0, 0.0, 0.0, None)
    router = next(r for x in d["deployments"] if x["name"] == "LLMRouter" for r in x["replicas"])
    assert router["kv_cache_usage"] is None


def test_start_up_lines_keep_the_rank_with_the_capacity_for_the_watch_cache():
    assert start_up_lines(LOGS[RANK0]) is None  # still starting: nothing to cache
    known = start_up_lines([*LOGS[RANK0], CAPACITY])
    assert known == (LOGS[RANK0][0].strip(), CAPACITY)
    assert parse_dp_rank(known).rank == 0


def test_json_and_table_show_each_rank():
    s = build(payload_with({RANK0: "RUNNING", RANK1: "RUNNING"}), logs={RANK0: [*LOGS[RANK0], CAPACITY], RANK1: LOGS[RANK1]})
    d = json.loads(json.dumps(s.to_dict()))
    (dp,) = [x for x in d["deployments"] if x["name"] == "DPServer:tiny"]
    by_id = {r["replica_id"]: r for r in dp["replicas"]}
    assert by_id[RANK0]["dp"] == {"rank": 0, "size": 2, "group": "0c6edda3"} and by_id[RANK0]["kv_cache_tokens"] == 524_288
    assert by_id[RANK1]["dp"]["rank"] == 1 and by_id[RANK1]["node"] == "node1"
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(render_serving(s))
    text = console.export_text()
    assert "data-parallel ranks" in text
    row0 = next(line for line in text.splitlines() if RANK0 in line and "0/2" in line)
    assert "node0" in row0 and "524,288 tokens" in row0
    assert any(RANK1 in line and "1/2" in line and "node1" in line for line in text.splitlines())


def test_revision_app_reads_a_dp_application():
    name, models, lens = revision_app(revision())
    assert (name, models, lens) == (APP, ["tiny"], {"tiny": 1024})
