"""Calibration records on disk: ``<state-dir>/clusters/<name>/calibration.json``, one record per
engine configuration (``orchestrator.plan.calibration``), the latest measurement winning.
Written atomically (temp file + rename); a missing or unreadable file is no records."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from orchestrator.state import StateStore

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
