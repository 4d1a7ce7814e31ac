"""orch accept on the shared Ray Serve LLM test-bed cluster (tiny model on CPU): every stage runs
for real, the failure stage kills the replica's VLLM::EngineCore process on its host and measures
the recovery, the restart stage redeploys the same revision; the report folder states each verdict.

This test disrupts the session's shared application on purpose (kill, redeploy) and leaves it
answering again: the restart stage only passes once a completion has come back.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.vllm, pytest.mark.disrupts_serving]

# The load stages' context: the served model allows 4,096 tokens (tests/fixtures/serving.py); at
# 1,024 the long prompts are 976 tokens, a quarter of the prefill on 2 CPU cores (31 s for the
# stage at 4,096), and the sweep stops at concurrency 2. Every stage still runs for real.
ACCEPT_CONTEXT = 1024


def test_accept_runs_every_stage_on_the_local_cluster(served_tiny, tiny_model_dir, tmp_path, monkeypatch, capsys, measured):
    manifest = served_tiny.manifest
    monkeypatch.setenv(manifest.serve.api_key_env, served_tiny.api_key)
    out = tmp_path / "accept"
    code = main(served_tiny.cluster.cli(
        "accept", served_tiny.manifest_path, "--out", out, "--json", "--tokenizer", tiny_model_dir,
        "--requests", "4", "--max-concurrency", "2", "--max-model-len", str(ACCEPT_CONTEXT),
    ))  # fmt: skip
    printed = capsys.readouterr().out
    data = json.loads(printed)
    measured("accept stages: " + ", ".join(f"{s['name']} {s.get('seconds', 0):.0f} s" for s in data["stages"]))
    verdicts = {s["name"]: s["verdict"] for s in data["stages"]}
    # The bed's manifest sets no latency targets (only the default 1% error budget), nothing else
    # disturbs the application, and the failure and restart stages must see it answer again: every
    # stage passes, so the run does and exits 0.
    summaries = {s["name"]: s["summary"] for s in data["stages"]}
    assert verdicts == {
        "topology": "pass", "cold_load": "pass", "short_prompts": "pass", "long_prompts": "pass",
        "concurrency_sweep": "pass", "output_heavy": "pass", "failure": "pass", "restart": "pass",
    }, summaries  # fmt: skip
    assert list(verdicts) == ["topology", "cold_load", "short_prompts", "long_prompts", "concurrency_sweep", "output_heavy", "failure", "restart"]
    assert (data["verdict"], code) == ("pass", 0)

    stages = {s["name"]: s for s in data["stages"]}
    # topology: every host of the bed probed
    assert set(stages["topology"]["details"]["nodes"]) == {n.name for n in manifest.nodes}
    # the failure stage really killed an engine process and saw the replica come back
    failure = stages["failure"]
    assert failure["verdict"] == "pass", failure["summary"]
    assert failure["metrics"]["killed"]["process"] == "VLLM::EngineCore" and failure["metrics"]["killed"]["pid"] > 0
    assert failure["metrics"]["unhealthy_seen_after_s"] is not None
    assert failure["metrics"]["time_to_recovery_s"] > failure["metrics"]["unhealthy_seen_after_s"]
    # the restart stage redeployed and got answers back
    assert stages["restart"]["verdict"] == "pass", stages["restart"]["summary"]
    # load stages: real requests, lengths as asked
    long = stages["long_prompts"]["details"]["bench"]["levels"][0]
    # near the context asked for: 1,024 - 32 output tokens - 16 of room (accept/stages.py), 4 requests
    assert long["succeeded"] == long["requests"] == 4 and long["prompt_tokens"] >= 4 * 900
    sweep = stages["concurrency_sweep"]["details"]["levels"]
    assert [lv["concurrency"] for lv in sweep] == [1, 2], sweep
    # vLLM's metrics were found through Ray's discovery file and count exactly the stage's requests
    short = stages["short_prompts"]["details"]["bench"]["levels"][0]
    assert short["crosscheck"]["tpot"]["server_count"] == short["requests"] == 4
    # the report folder
    md = (out / "acceptance.md").read_text()
    for name in verdicts:
        assert f"| {name} |" in md
    assert (out / "sweep.png").read_bytes().startswith(b"\x89PNG")
