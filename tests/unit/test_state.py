"""StateStore: clusters, revisions, migrations, token file. Real SQLite in a tmp dir; fake clock."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading

import pytest

from orchestrator.errors import StateError
from orchestrator.state import MIGRATIONS, REDACTED, SCHEMA_VERSION, StateStore, redact_secrets


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def store(tmp_path, clock) -> StateStore:
    return StateStore(tmp_path / "state", clock=clock)


def test_record_and_get_cluster_roundtrip(store, clock):
    assert store.get_cluster("c1") is None
    rec = store.record_cluster("c1", "fp1", "10.0.0.1", 8265, {"head": "aa", "w1": "bb"}, manifest_json='{"name": "c1"}',
                               manifest_path="/x/c1.yaml", ray_version="2.60.0")
    assert rec.created_at == rec.updated_at == 1000.0
    got = store.get_cluster("c1")
    assert got == rec
    assert got.node_ids == {"head": "aa", "w1": "bb"}
    assert got.state == "up"


def test_record_cluster_again_keeps_created_and_moves_updated(store, clock):
    store.record_cluster("c1", "fp1", "10.0.0.1", 8265)
    clock.now = 2000.0
    rec = store.record_cluster("c1", "fp2", "10.0.0.2", 9000, {"head": "cc"})
    assert (rec.created_at, rec.updated_at) == (1000.0, 2000.0)
    assert (rec.fingerprint, rec.head_address, rec.dashboard_port, rec.node_ids) == ("fp2", "10.0.0.2", 9000, {"head": "cc"})
    assert [c.name for c in store.list_clusters()] == ["c1"]


def test_set_cluster_state_and_unknown_cluster(store, clock):
    store.record_cluster("c1", "fp1", "h", 1)
    clock.now = 1500.0
    rec = store.set_cluster_state("c1", "down")
    assert rec.state == "down" and rec.updated_at == 1500.0
    with pytest.raises(StateError, match="no cluster named 'nope'"):
        store.set_cluster_state("nope", "down")
    with pytest.raises(ValueError):
        store.set_cluster_state("c1", "sideways")


def test_delete_cluster_removes_its_revisions_only(store):
    store.record_cluster("a", "f", "h", 1)
    store.record_cluster("b", "f", "h", 1)
    store.add_revision("a", "m")
    store.add_revision("b", "m")
    assert store.delete_cluster("a") is True
    assert store.delete_cluster("a") is False
    assert store.get_cluster("a") is None and store.list_revisions("a") == []
    assert len(store.list_revisions("b")) == 1


def test_revision_numbers_are_per_cluster_and_increase(store):
    r1 = store.add_revision("a", "m1", plan={"tp": 2}, config_fingerprint="cf1", config={"x": 1})
    r2 = store.add_revision("a", "m2")
    rb = store.add_revision("b", "m1")
    assert (r1.number, r2.number, rb.number) == (1, 2, 1)
    assert r1.plan == {"tp": 2} and r1.config == {"x": 1} and r1.config_fingerprint == "cf1"
    assert r1.status == "pending" and r1.finished_at is None
    assert [r.number for r in store.list_revisions("a")] == [1, 2]


def test_update_revision_stamps_finish_and_current_is_latest_ready(store, clock):
    store.add_revision("a", "m1")
    store.add_revision("a", "m2")
    store.add_revision("a", "m3")
    assert store.current_revision("a") is None
    clock.now = 1100.0
    store.update_revision("a", 1, "ready")
    clock.now = 1200.0
    r2 = store.update_revision("a", 2, "ready")
    assert r2.finished_at == 1200.0
    clock.now = 1300.0
    store.update_revision("a", 3, "failed", error="gate: no completion")
    assert store.current_revision("a").number == 2
    store.update_revision("a", 2, "rolled_back")
    cur = store.current_revision("a")
    assert cur.number == 1 and cur.model == "m1"
    r3 = store.get_revision("a", 3)
    assert (r3.status, r3.error, r3.finished_at) == ("failed", "gate: no completion", 1300.0)


def test_finished_at_is_kept_on_later_transitions_and_cleared_when_pending(store, clock):
    store.add_revision("a", "m")
    clock.now = 1100.0
    store.update_revision("a", 1, "ready")
    clock.now = 1900.0
    assert store.update_revision("a", 1, "superseded").finished_at == 1100.0
    assert store.update_revision("a", 1, "pending").finished_at is None


def test_update_unknown_revision_and_bad_status(store):
    with pytest.raises(StateError, match="no revision 7"):
        store.update_revision("a", 7, "ready")
    with pytest.raises(ValueError):
        store.add_revision("a", "m", status="done")
    store.add_revision("a", "m")
    with pytest.raises(ValueError):
        store.update_revision("a", 1, "weird")


def test_config_secrets_never_stored(store, tmp_path):
    cfg = {"engine_kwargs": {"api_key": ["sk-verysecret"], "max_tokens": 64, "max_num_batched_tokens": 512},
           "env": {"HF_TOKEN": "hf_abc", "RAY_AUTH_TOKEN_PATH": ""}, "Authorization": "Bearer zzz"}
    rev = store.add_revision("a", "m", config=cfg)
    assert rev.config["engine_kwargs"] == {"api_key": REDACTED, "max_tokens": 64, "max_num_batched_tokens": 512}
    assert rev.config["env"]["HF_TOKEN"] == REDACTED
    assert rev.config["Authorization"] == REDACTED
    raw = (tmp_path / "state" / "state.db").read_bytes()
    wal = tmp_path / "state" / "state.db-wal"
    raw += wal.read_bytes() if wal.exists() else b""
    assert b"sk-verysecret" not in raw and b"hf_abc" not in raw and b"zzz" not in raw


def test_manifest_env_values_never_stored(store, tmp_path):
    """The manifest's env (cluster-wide and per node) may hold secrets: stored redacted."""
    manifest = {"name": "a", "env": {"HF_TOKEN": "hf_cluster_secret", "NCCL_DEBUG": "WARN"},
                "nodes": [{"name": "h", "env": {"WANDB_API_KEY": "wandb_node_secret"}}, {"name": "w", "env": {}}]}  # fmt: skip
    store.record_cluster("a", "fp", "10.0.0.1", 8265, manifest_json=json.dumps(manifest))
    kept = json.loads(store.get_cluster("a").manifest_json)
    assert kept["env"] == {"HF_TOKEN": REDACTED, "NCCL_DEBUG": REDACTED}
    assert kept["nodes"] == [{"name": "h", "env": {"WANDB_API_KEY": REDACTED}}, {"name": "w", "env": {}}]
    raw = (tmp_path / "state" / "state.db").read_bytes()
    wal = tmp_path / "state" / "state.db-wal"
    raw += wal.read_bytes() if wal.exists() else b""
    assert b"hf_cluster_secret" not in raw and b"wandb_node_secret" not in raw


def test_redact_leaves_plain_values_alone():
    assert redact_secrets({"a": [1, {"password": "p"}], "tokenizer": "t"}) == {"a": [1, {"password": REDACTED}], "tokenizer": "t"}


def test_concurrent_add_revision_never_duplicates_numbers(tmp_path, clock):
    numbers: list[int] = []
    lock = threading.Lock()

    def worker():
        s = StateStore(tmp_path / "state", clock=clock)
        for _ in range(10):
            n = s.add_revision("a", "m").number
            with lock:
                numbers.append(n)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(numbers) == list(range(1, 41))


def test_wal_mode_and_schema_version(store):
    assert store.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(store.db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_existing_database_from_older_version_is_upgraded(tmp_path, clock):
    state = tmp_path / "state"
    state.mkdir()
    conn = sqlite3.connect(state / "state.db")
    conn.execute("CREATE TABLE unrelated (x)")  # a version-0 database with something else in it
    conn.commit()
    conn.close()
    store = StateStore(state, clock=clock)
    store.record_cluster("c", "f", "h", 1)
    assert store.schema_version == SCHEMA_VERSION
    conn = sqlite3.connect(state / "state.db")
    assert conn.execute("SELECT count(*) FROM unrelated").fetchone()[0] == 0
    conn.close()


def test_newer_schema_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    conn = sqlite3.connect(state / "state.db")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.commit()
    conn.close()
    with pytest.raises(StateError, match="newer than this orch understands"):
        StateStore(state).get_cluster("x")


def test_unwritable_state_dir_is_a_state_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StateError, match="cannot open the state database"):
        StateStore(blocker / "sub").list_clusters()


def test_token_created_once_with_mode_0600(store):
    calls = []

    def gen():
        calls.append(1)
        return f"tok{len(calls)}"

    assert store.read_token("c1") is None
    assert store.ensure_token("c1", gen) == "tok1"
    assert store.ensure_token("c1", gen) == "tok1"
    assert calls == [1]
    path = store.token_path("c1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text() == "tok1\n"
    assert store.read_token("c1") == "tok1"


def test_cluster_dir_rejects_path_tricks(store):
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError):
            store.token_path(bad)


def test_the_served_application_is_kept_in_the_database(store):
    """Issue 12 item 5: the application a revision serves as is a column, named after the number
    the insert gave (not a number guessed before it), stored with the config redacted."""
    rev = store.add_revision("a", "m")
    assert rev.app_name is None
    cfg = {"name": f"orch-r{rev.number}", "runtime_env": {"env_vars": {"HF_TOKEN": "hf_secret"}}}
    out = store.set_served_as("a", rev.number, f"orch-r{rev.number}", cfg)
    assert out.app_name == "orch-r1" and store.current_revision("a") is None
    again = store.get_revision("a", 1)
    assert again.app_name == "orch-r1" and again.config["runtime_env"]["env_vars"]["HF_TOKEN"] == "<redacted>"
    with pytest.raises(StateError, match="no revision 9"):
        store.set_served_as("a", 9, "x", {})


def test_a_version_1_database_gains_the_app_name_column_and_keeps_its_rows(tmp_path, clock):
    state = tmp_path / "state"
    state.mkdir()
    conn = sqlite3.connect(state / "state.db")
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO revisions (cluster, number, model, status, created_at) VALUES ('a', 1, 'm', 'ready', 1.0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = StateStore(state, clock=clock)
    rev = store.current_revision("a")
    assert rev.number == 1 and rev.app_name is None and store.schema_version == SCHEMA_VERSION


def test_revision_meta_is_replaced_atomically_and_a_lost_file_reads_as_none(store, monkeypatch):
    assert store.revision_meta("a", 1) is None
    store.save_revision_meta("a", 1, {"app_name": "orch-r1"})
    path = store.revision_meta_path("a", 1)
    # A crash in the middle of writing the new text (here: the write raising) leaves the old file.
    real_replace = os.replace

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError, match="cannot write .*1.json"):
        store.save_revision_meta("a", 1, {"app_name": "orch-r1", "steps": ["x" * 1000]})
    monkeypatch.setattr(os, "replace", real_replace)
    assert store.revision_meta("a", 1) == {"app_name": "orch-r1"}
    assert [p.name for p in path.parent.iterdir()] == ["1.json"]  # no temp file left behind
    path.write_text("")  # an empty file (the old writer's crash) is not a record
    assert store.revision_meta("a", 1) is None
def test_state_dir_mode_is_set_only_when_orch_creates_it(tmp_path):
    """--state-dir pointing at an existing folder (say, a shared project folder) keeps its
    mode; a folder orch creates is 0700 (issue 12: orch chmod-ed any --state-dir to 0700)."""
    shared = tmp_path / "project"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    StateStore(shared).list_clusters()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    created = tmp_path / "new" / "state"
    StateStore(created).list_clusters()
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
