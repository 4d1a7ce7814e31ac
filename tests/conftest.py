"""Shared pytest configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# `make mutation` (scripts/mutation.py) runs the property tests with few, fixed examples: each
# mutant reruns them, and a test that fails only on a lucky draw would make a verdict random.
settings.register_profile("mutation", max_examples=10, deadline=None, derandomize=True, database=None)

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(autouse=True)
def _isolated_state_dir(tmp_path, monkeypatch):
    """Never touch the user's ~/.orch from a test."""
    monkeypatch.setenv("ORCH_STATE_DIR", str(tmp_path / "orch-state"))
    yield


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")
