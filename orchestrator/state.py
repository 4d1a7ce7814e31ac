"""Local state of orch: clusters and revisions in SQLite, and the per-cluster Ray token file.

Does I/O: the SQLite database ``<state_dir>/state.db`` and files under
``<state_dir>/clusters/<name>/``. Time is injected (``clock``), so tests control every timestamp.

Tables
- ``clusters``: one row per cluster name: manifest fingerprint, the manifest itself (JSON, so
  ``orch status`` works without the file), head address, dashboard port, the Ray node id of each
  orch node (JSON), Ray version, state (``up``/``down``), created/updated times.
- ``revisions``: one row per rollout attempt of a cluster, numbered 1, 2, ... per cluster:
  model, plan (JSON), config fingerprint, config (JSON, secrets redacted), the Serve application
  it serves as, status (pending|ready|failed|rolled_back|superseded), error, created/finished
  times. A revision left ``pending`` by an orch that stopped (killed, Ctrl-C, lost connection)
  is what the next rollout repairs.
- Per-revision details without a column (decision, steps, cold-load time) live in
  ``clusters/<name>/revisions/<n>.json``, written atomically (temp file + rename).

The schema is versioned with ``PRAGMA user_version``; ``MIGRATIONS`` only ever grows, so an older
database is upgraded in place and a newer one is refused (StateError) instead of being damaged.
Every connection uses WAL and a busy timeout: two orch commands may run at the same time.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import StateError
from orchestrator.local_disk import disk_full, is_disk_full, make_private_dir
from orchestrator.state_files import ClusterFiles

# removed: `orch remove` stopped serving it (`orch rollback` can bring it back).
REVISION_STATUSES = ("pending", "ready", "failed", "rolled_back", "superseded", "removed")
FINISHED_STATUSES = frozenset({"ready", "failed", "rolled_back", "superseded", "removed"})
CLUSTER_STATES = ("up", "down")

# Keys whose values never reach the database: exact names, or names ending with a suffix
# (case-insensitive, "-" read as "_"). "max_tokens" is not a secret; "hf_token" is.
SECRET_KEYS = frozenset({"api_key", "apikey", "token", "password", "secret", "authorization"})
SECRET_SUFFIXES = ("_api_key", "_token", "_password", "_secret")
REDACTED = "<redacted>"

MIGRATIONS: list[list[str]] = [
    # 1: first schema
    [
        """CREATE TABLE IF NOT EXISTS clusters (
            name TEXT PRIMARY KEY,
            fingerprint TEXT NOT NULL,
            manifest_json TEXT,
            manifest_path TEXT,
            head_address TEXT NOT NULL,
            dashboard_port INTEGER NOT NULL,
            node_ids_json TEXT NOT NULL DEFAULT '{}',
            ray_version TEXT,
            state TEXT NOT NULL DEFAULT 'up',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS revisions (
            cluster TEXT NOT NULL,
            number INTEGER NOT NULL,
            model TEXT NOT NULL,
            plan_json TEXT NOT NULL DEFAULT '{}',
            config_fingerprint TEXT NOT NULL DEFAULT '',
            config_json TEXT NOT NULL DEFAULT '{}',
            status TEXT NOT NULL,
            error TEXT,
            created_at REAL NOT NULL,
            finished_at REAL,
            PRIMARY KEY (cluster, number)
        )""",
        "CREATE INDEX IF NOT EXISTS revisions_by_status ON revisions (cluster, status, number)",
    ],
    # 2: the Serve application a revision serves as (was only in the meta file, whose loss made
    # a rollout take the live application for gone)
    ["ALTER TABLE revisions ADD COLUMN app_name TEXT"],
]
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class ClusterRecord:
    """What orch recorded about a cluster after its last successful `up` (or `down`)."""

    name: str
    fingerprint: str
    head_address: str
    dashboard_port: int
    node_ids: dict[str, str] = field(default_factory=dict)  # orch node name -> Ray node id
    manifest_json: str | None = None
    manifest_path: str | None = None
    ray_version: str | None = None
    state: str = "up"
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "head_address": self.head_address,
            "dashboard_port": self.dashboard_port,
            "node_ids": dict(self.node_ids),
            "manifest_path": self.manifest_path,
            "ray_version": self.ray_version,
            "state": self.state,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True)
class Revision:
    """One rollout attempt. ``config`` never holds secrets (see ``redact_secrets``)."""

    cluster: str
    number: int
    model: str
    plan: dict[str, Any]
    config_fingerprint: str
    config: dict[str, Any]
    status: str
    error: str | None
    created_at: float
    finished_at: float | None
    app_name: str | None = None  # the Serve application it serves as (None: not recorded)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "number": self.number,
            "model": self.model,
            "app_name": self.app_name,
            "plan": self.plan,
            "config_fingerprint": self.config_fingerprint,
            "config": self.config,
            "status": self.status,
            "error": self.error,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
        }


def redact_secrets(value: Any) -> Any:
    """A copy of a JSON-like value where every key that names a secret has its value replaced."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if is_secret_key(str(key)) and item not in (None, "", [], {}):
                out[key] = REDACTED
            else:
                out[key] = redact_secrets(item)
        return out
    if isinstance(value, list):
        return [redact_secrets(item) for item in value]
    return value


def redact_manifest(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a manifest (``model_dump(mode="json")``) whose environment values (cluster
    ``env`` and every node's ``env``) are all replaced: any of them may be a secret (HF_TOKEN,
    a cloud key), and nothing read back from the state needs them (`orch up` reads the file)."""
    out = dict(data)

    def hide(env: Any) -> Any:
        return {k: REDACTED for k in env} if isinstance(env, dict) else env

    if "env" in out:
        out["env"] = hide(out["env"])
    if isinstance(out.get("nodes"), list):
        out["nodes"] = [{**n, "env": hide(n["env"])} if isinstance(n, dict) and "env" in n else n for n in out["nodes"]]
    return out


def is_secret_key(key: str) -> bool:
    norm = key.lower().replace("-", "_")
    return norm in SECRET_KEYS or norm.endswith(SECRET_SUFFIXES)


class StateStore(ClusterFiles):
    """SQLite-backed state under ``state_dir``. Safe to create many times; cheap to construct."""

    def __init__(self, state_dir: Path | str, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = Path(state_dir)
        self.db_path = self.state_dir / "state.db"
        self._clock = clock
        self._migrated = False

    # ------------------------------------------------------------------ plumbing
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            make_private_dir(self.state_dir)
            conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            if is_disk_full(exc, self.db_path):
                raise disk_full(self.db_path, exc) from exc
            raise StateError(
                f"cannot open the state database {self.db_path}: {exc}",
                hint="check that --state-dir (or ORCH_STATE_DIR) is a writable folder",
            ) from exc
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout=30000")
            if not self._migrated:
                _ensure_wal(conn)
                self._migrate(conn)
                self._migrated = True
            yield conn
        except sqlite3.Error as exc:
            if is_disk_full(exc, self.db_path):
                raise disk_full(self.db_path, exc) from exc
            raise StateError(f"state database {self.db_path}: {exc}") from exc
        finally:
            conn.close()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"the state database {self.db_path} has schema version {version}, newer than this "
                    f"orch understands ({SCHEMA_VERSION})",
                    hint="upgrade orch, or point --state-dir at another folder",
                )
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number]:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    @property
    def schema_version(self) -> int:
        with self._connect() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    # ------------------------------------------------------------------ clusters
    def record_cluster(
        self,
        name: str,
        fingerprint: str,
        head_address: str,
        dashboard_port: int,
        node_ids: dict[str, str] | None = None,
        manifest_json: str | None = None,
        manifest_path: str | None = None,
        ray_version: str | None = None,
        state: str = "up",
    ) -> ClusterRecord:
        """Insert or replace the cluster's row; ``created_at`` survives a replace. The manifest's
        environment values are stored redacted (``redact_manifest``)."""
        if state not in CLUSTER_STATES:
            raise ValueError(f"cluster state must be one of {CLUSTER_STATES}, not {state!r}")
        if manifest_json is not None:
            manifest_json = json.dumps(redact_manifest(json.loads(manifest_json)))
        now = self._clock()
        with self._connect() as conn:
            conn.execute(
                """INSERT INTO clusters (name, fingerprint, manifest_json, manifest_path, head_address,
                       dashboard_port, node_ids_json, ray_version, state, created_at, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(name) DO UPDATE SET fingerprint=excluded.fingerprint,
                       manifest_json=excluded.manifest_json, manifest_path=excluded.manifest_path,
                       head_address=excluded.head_address, dashboard_port=excluded.dashboard_port,
                       node_ids_json=excluded.node_ids_json, ray_version=excluded.ray_version,
                       state=excluded.state, updated_at=excluded.updated_at""",
                (
                    name,
                    fingerprint,
                    manifest_json,
                    manifest_path,
                    head_address,
                    int(dashboard_port),
                    json.dumps(dict(node_ids or {}), sort_keys=True),
                    ray_version,
                    state,
                    now,
                    now,
                ),
            )
            row = conn.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return _cluster_from_row(row)

    def set_cluster_state(self, name: str, state: str) -> ClusterRecord:
        """Mark a recorded cluster up or down (``orch down`` keeps the row for history)."""
        if state not in CLUSTER_STATES:
            raise ValueError(f"cluster state must be one of {CLUSTER_STATES}, not {state!r}")
        with self._connect() as conn:
            cur = conn.execute(
                "UPDATE clusters SET state = ?, updated_at = ? WHERE name = ?", (state, self._clock(), name)
            )
            if cur.rowcount == 0:
                raise StateError(f"no cluster named {name!r} is recorded", hint="run `orch up CLUSTER_YAML` first")
            row = conn.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return _cluster_from_row(row)

    def get_cluster(self, name: str) -> ClusterRecord | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM clusters WHERE name = ?", (name,)).fetchone()
        return _cluster_from_row(row) if row else None

    def list_clusters(self) -> list[ClusterRecord]:
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM clusters ORDER BY name").fetchall()
        return [_cluster_from_row(r) for r in rows]

    def delete_cluster(self, name: str) -> bool:
        """Forget a cluster and its revisions; returns whether it was recorded."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            cur = conn.execute("DELETE FROM clusters WHERE name = ?", (name,))
            conn.execute("DELETE FROM revisions WHERE cluster = ?", (name,))
            conn.execute("COMMIT")
        return cur.rowcount > 0

    # ------------------------------------------------------------------ revisions
    def add_revision(
        self,
        cluster: str,
        model: str,
        plan: dict[str, Any] | None = None,
        config_fingerprint: str = "",
        config: dict[str, Any] | None = None,
        status: str = "pending",
    ) -> Revision:
        """Append a revision with the next number (atomically: two writers never share one).
        Anything named after the number (the Serve application) is set afterwards with
        ``set_served_as``: a number guessed before the insert could be taken by another writer."""
        _check_status(status)
        now = self._clock()
        finished = now if status in FINISHED_STATUSES else None
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT MAX(number) FROM revisions WHERE cluster = ?", (cluster,)).fetchone()
                number = int(row[0] or 0) + 1
                conn.execute(
                    """INSERT INTO revisions (cluster, number, model, plan_json, config_fingerprint,
                           config_json, status, error, created_at, finished_at)
                       VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)""",
                    (
                        cluster,
                        number,
                        model,
                        json.dumps(plan or {}, sort_keys=True, default=str),
                        config_fingerprint,
                        json.dumps(redact_secrets(config or {}), sort_keys=True, default=str),
                        status,
                        now,
                        finished,
                    ),
                )
                conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            out = conn.execute("SELECT * FROM revisions WHERE cluster = ? AND number = ?", (cluster, number)).fetchone()
        return _revision_from_row(out)

    def set_served_as(self, cluster: str, number: int, app_name: str, config: dict[str, Any]) -> Revision:
        """Record the Serve application a revision serves as and its config (stored redacted)."""
        with self._connect() as conn:
            cur = conn.execute(
                "UPDATE revisions SET app_name = ?, config_json = ? WHERE cluster = ? AND number = ?",
                (app_name, json.dumps(redact_secrets(config), sort_keys=True, default=str), cluster, number),
            )
            if cur.rowcount == 0:
                raise StateError(f"cluster {cluster!r} has no revision {number}", hint="see `orch status` for revisions")
            row = conn.execute("SELECT * FROM revisions WHERE cluster = ? AND number = ?", (cluster, number)).fetchone()
        return _revision_from_row(row)

    def update_revision(self, cluster: str, number: int, status: str, error: str | None = None) -> Revision:
        """Set a revision's status (and error); finishing statuses stamp ``finished_at``."""
        _check_status(status)
        now = self._clock()
        with self._connect() as conn:
            cur = conn.execute(
                """UPDATE revisions SET status = ?, error = ?,
                       finished_at = CASE WHEN ? THEN COALESCE(finished_at, ?) ELSE NULL END
                   WHERE cluster = ? AND number = ?""",
                (status, error, status in FINISHED_STATUSES, now, cluster, number),
            )
            if cur.rowcount == 0:
                raise StateError(f"cluster {cluster!r} has no revision {number}", hint="see `orch status` for revisions")
            row = conn.execute("SELECT * FROM revisions WHERE cluster = ? AND number = ?", (cluster, number)).fetchone()
        return _revision_from_row(row)

    def get_revision(self, cluster: str, number: int) -> Revision | None:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM revisions WHERE cluster = ? AND number = ?", (cluster, number)).fetchone()
        return _revision_from_row(row) if row else None

    def list_revisions(self, cluster: str) -> list[Revision]:
        """Every revision of the cluster, oldest first."""
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM revisions WHERE cluster = ? ORDER BY number", (cluster,)).fetchall()
        return [_revision_from_row(r) for r in rows]

    def current_revision(self, cluster: str) -> Revision | None:
        """The latest revision whose status is ``ready`` (what is serving), or None."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT * FROM revisions WHERE cluster = ? AND status = 'ready' ORDER BY number DESC LIMIT 1",
                (cluster,),
            ).fetchone()
        return _revision_from_row(row) if row else None


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: SQLite has already rolled back on some errors
    (SQLITE_FULL among them), and a second ROLLBACK would hide the real error under "cannot
    rollback - no transaction is active"."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _ensure_wal(conn: sqlite3.Connection, attempts: int = 100) -> None:
    """Switch the database to WAL (persistent: once per database). The switch needs the database
    to itself and SQLite answers "database is locked" at once, without the busy timeout, when
    another connection is in it: retry briefly, and stop as soon as anyone made it WAL."""
    for _ in range(attempts):
        if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
            return
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            time.sleep(0.02)
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        raise sqlite3.OperationalError("could not switch the state database to WAL: it stays locked")


def _check_status(status: str) -> None:
    if status not in REVISION_STATUSES:
        raise ValueError(f"revision status must be one of {REVISION_STATUSES}, not {status!r}")


def _cluster_from_row(row: sqlite3.Row) -> ClusterRecord:
    return ClusterRecord(
        name=row["name"],
        fingerprint=row["fingerprint"],
        head_address=row["head_address"],
        dashboard_port=int(row["dashboard_port"]),
        node_ids=json.loads(row["node_ids_json"] or "{}"),
        manifest_json=row["manifest_json"],
        manifest_path=row["manifest_path"],
        ray_version=row["ray_version"],
        state=row["state"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
    )


def _revision_from_row(row: sqlite3.Row) -> Revision:
    return Revision(
        cluster=row["cluster"],
        number=int(row["number"]),
        model=row["model"],
        plan=json.loads(row["plan_json"] or "{}"),
        config_fingerprint=row["config_fingerprint"],
        config=json.loads(row["config_json"] or "{}"),
        status=row["status"],
        error=row["error"],
        created_at=float(row["created_at"]),
        finished_at=None if row["finished_at"] is None else float(row["finished_at"]),
        app_name=row["app_name"],
    )
