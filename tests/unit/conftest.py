"""Fixtures shared by the unit tests."""

from __future__ import annotations

import sys

import pytest

from orchestrator.serve import node_hooks


@pytest.fixture
def on_the_node_path(tmp_path, monkeypatch):
    """orch's node module written where `orch up` puts it on a node, that folder on sys.path; after
    the test the module is dropped and Serve LLM's telemetry push, which its callback replaces, is
    put back."""
    folder = tmp_path / ".orch" / "nodes" / "c1" / "python"
    folder.mkdir(parents=True)
    (folder / f"{node_hooks.MODULE}.py").write_text(node_hooks.source())
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    sys.modules.pop(node_hooks.MODULE, None)
    # The callback replaces Serve LLM's telemetry push in its module (as in a replica's process):
    # put Ray's own back for the tests that run after in this process.
    server = sys.modules.get(node_hooks.LLM_SERVER_MODULE)
    if server is not None:
        from ray.llm._internal.serve.observability.usage_telemetry import usage

        setattr(server, node_hooks.TELEMETRY_PUSH, getattr(usage, node_hooks.TELEMETRY_PUSH))
