"""`orch rollout` / `orch rollback` at the CLI boundary: dry-run output, JSON, errors and exit
codes (no cluster: everything here happens before any Ray or SSH)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
M405 = REPO / "cluster-templates" / "2x8-h100-405b.yaml"


def test_dry_run_before_up_prints_plan_decision_and_redacted_config(capsys, monkeypatch):
    monkeypatch.setenv("ORCH_API_KEY", "cli-secret-key-not-to-print")
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/llama3-405b", "--max-model-len", "8192", str(M405), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "TP=8 PP=2" in out.out and "decision" in out.out and "is not up" in out.out
    assert "ray.serve.llm:build_openai_app" in out.out and "<redacted>" in out.out
    assert "orch_node_" in out.out  # stage pins
    assert "cli-secret-key-not-to-print" not in out.out + out.err


def test_dry_run_json(capsys):
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192", str(M405), "--dry-run", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["action"] == "dry_run:fresh" and data["plan"]["tp"] == 8 and data["plan"]["pp"] == 2
    llm = data["config"]["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["api_key"] == ["<redacted>"] and len(llm["placement_group_config"]["bundles"]) == 16


def test_rollout_without_dry_run_needs_the_cluster_up(capsys):
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/x", str(M405)])
    err = capsys.readouterr().err
    assert rc == 1 and "error: cluster 'llama405' is not up" in err and "orch up" in err


def test_bad_engine_arg_and_plan_that_does_not_fit(capsys):
    assert main(["rollout", "--model", "tiny", str(M405), "--engine-arg", "nonsense", "--dry-run"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/m", "--tp", "1", str(M405), "--dry-run"])
    assert rc == 2 and "error:" in capsys.readouterr().err


def test_rollback_without_revisions_says_so(capsys):
    rc = main(["rollback", str(M405)])
    err = capsys.readouterr().err
    assert rc == 1 and "no earlier revision" in err


def test_explicit_tp_across_nodes_is_planned_with_a_warning(capsys):
    """Two nodes of 8 GPUs, --tp 16: one tensor-parallel group over both nodes, allowed on request."""
    rc = main(["rollout", "--model", "llama3-70b", "--model-path", "/m", "--tp", "16", "--max-model-len", "8192", str(M405), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    text = " ".join(out.out.split())  # rich wraps long lines
    assert "warning: forced TP=16 exceeds the 8 GPU(s) per node, so one tensor-parallel group spans 2 nodes" in text
    assert "warning: tensor parallel 16 spans nodes of 8 GPU(s)" in text
    assert "strategy: PACK" in text and "TP=16 PP=1" in text
