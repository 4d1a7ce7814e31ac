"""Calibration records: what each engine logged against what its revision's plan predicted.

``record_calibration`` (the edge both `orch rollout`, after every successful rollout, and `orch
status` call) parses the engine lines (``orchestrator.plan.calibration``) and keeps the record in
``<state-dir>/clusters/<name>/calibration.json``, one per engine configuration, the latest
measurement winning. ``calibrate_rollout`` reads the lines of the rollout's replicas on their nodes
(``workflows.engine_logs``) first, and never fails the rollout: what it could not read is said.
Written atomically (temp file + rename); a missing or unreadable file is no records.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.cluster.node_state import DashboardFormatError
from orchestrator.errors import OrchError
from orchestrator.manifest.model import Manifest
from orchestrator.plan.calibration import calibration_record, parse_engine_figures
from orchestrator.remote.runner import Runner
from orchestrator.state import StateStore
from orchestrator.status.workers import engine_workers
from orchestrator.workflows.engine_logs import engine_lines, engine_replicas

FILE = "calibration.json"


def _path(state: StateStore, cluster: str) -> Path:
    return Path(state.cluster_dir(cluster)) / FILE


def load_calibrations(state: StateStore, cluster: str) -> dict[str, dict[str, Any]]:
    """key -> record; empty when nothing was recorded or the file cannot be read."""
    try:
        data = json.loads(_path(state, cluster).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def save_calibration(state: StateStore, cluster: str, record: dict[str, Any]) -> None:
    """Keep ``record`` under its key (replacing an earlier measurement of the same configuration)."""
    path = _path(state, cluster)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = load_calibrations(state, cluster)
    records[record["key"]] = record
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".calibration-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(records, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def record_calibration(state: StateStore, cluster: str, revision: int, plan: Mapping[str, Any] | None,
                       engine_logs: Mapping[str, list[str]]) -> dict | None:  # fmt: skip
    """Record what the engines logged against ``plan`` (revision ``revision``'s); None (nothing
    kept) when the log or the plan lacks the figures."""
    if not plan or not engine_logs:
        return None
    measured = parse_engine_figures(line for lines in engine_logs.values() for line in lines)
    if measured.kv_gib is None and measured.kv_tokens is None:
        return None
    record = calibration_record(plan, measured)
    if record is None:
        return None
    record["revision"] = revision
    save_calibration(state, cluster, record)
    return record


@dataclass(frozen=True)
class RolloutCalibration:
    record: dict | None
    note: str  # what the rollout says about it (recorded, or why not)


def calibrate_rollout(state: StateStore, manifest: Manifest, runners: Mapping[str, Runner], nodes: list, app: Any,
                      revision: int, plan: Mapping[str, Any] | None, actors: Callable[[], list] | None = None) -> RolloutCalibration:  # fmt: skip
    """After a rollout passed its gate: read the engine lines of ``app``'s replicas (Serve's status
    of the application that now serves) and of their engine worker actors (``actors``: Ray's actor
    list, GPU layout) on their nodes, and record them. Never raises an ``OrchError`` or
    ``OSError``: a log that cannot be read leaves the rollout a success, and says so."""
    if not plan:
        return RolloutCalibration(None, "calibration: not recorded (the revision has no plan)")
    replicas = engine_replicas(app) if app is not None else []
    if not replicas:
        return RolloutCalibration(None, "calibration: not recorded (Serve listed no replica of the application)")
    names = {getattr(n, "node_id", None): getattr(n, "name", None) for n in nodes}
    errors: list[str] = []
    try:
        workers: dict[str, list] = {}
        if actors is not None and manifest.accelerator != "cpu":  # the CPU layout's mp executor has no worker actors
            listed = actors()
            workers = {r.replica_id: engine_workers(r.actor_name, listed) for r in replicas}
        logs, errors = engine_lines(manifest, runners, names, replicas, workers)
        record = record_calibration(state, manifest.name, revision, plan, logs)
    except (OrchError, DashboardFormatError, OSError) as exc:
        errors.append(getattr(exc, "message", None) or str(exc))
        record = None
    if record is None:
        why = "; ".join(errors) or "the engine's log carries none of the memory lines orch reads"
        return RolloutCalibration(None, f"calibration: could not read what the engine logged ({why}); the rollout stands, `orch status` tries again")
    return RolloutCalibration(record, "calibration: " + describe(record))


def stored_for(state: StateStore, cluster: str, revision: int) -> dict | None:
    """The record a revision's rollout (or an earlier status) kept, if any."""
    return next((r for r in load_calibrations(state, cluster).values() if r.get("revision") == revision), None)


def describe(record: Mapping[str, Any]) -> str:
    """One line: what was recorded for which configuration (the rollout's output)."""
    meas = record.get("measured") or {}
    got = ", ".join(f"{label} {fmt.format(meas[k])}" for k, label, fmt in (
        ("weights_gib", "weights", "{:.2f} GiB"), ("kv_gib", "KV cache", "{:.2f} GiB"), ("kv_tokens", "KV tokens", "{:,}"))
        if meas.get(k) is not None)  # fmt: skip
    where = f"vLLM {record.get('vllm_version')} on {record.get('gpu_type')} (platform {record.get('platform') or 'not logged'})"
    head = f"recorded what the engine logged ({got or 'no figures'}) for {where}, TP={record.get('tp')} PP={record.get('pp')}"
    if record.get("mismatch"):
        return f"{head}; {record['mismatch']}"
    reserve = record.get("measured_reserve_gib")
    return head + (f"; measured reserve {reserve:.2f} GiB per GPU, used by `orch plan --cluster`" if reserve is not None else "")
