"""Smoke runs of the benchmark scripts that need the test bed (root): each script runs as a user
runs it (a subprocess of this Python, through benchmarks/record.py's ``run_script``) at its
smallest setting and must exit 0 and print its JSON, so that a product change that breaks a
benchmark fails the suite the day it lands. The scripts that need no root are smoke-run by
tests/cli/test_benchmark_smokes.py, which also checks that every script in benchmarks/ is run by
one of the two (``SMOKED`` here).

What they cost `make test` (each script here makes and tears down its own test bed; at most one
vLLM engine start each, the bare-vLLM comparison of serve_overhead.py aside):
- light part (SSH and beds only, run beside the heavy part): fanout, preflight, model_sync,
  collective_check;
- heavy part: bring_up (Ray, no engine); bench_agreement against the suite's bare vLLM server
  (``vllm_server``, shared with tests/integration/test_bench_vllm.py: no engine start of its
  own); prefix_routing (one rollout, a few short requests); serve_overhead's measuring part
  (``--bare-url``/``--serve-url``: one round at concurrency 1) on the suite's bare vLLM server and
  the session's served model, no engine start of its own;
- multinode and moe_testbed: their measuring part (``run_layouts``) on the beds of
  tests/integration/test_gpu_path.py and test_moe_dp.py, whose served layouts they match
  (``SMOKED_ON_MODULE_BEDS``): no bed and no engine start of their own.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.testbed import check_capabilities

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from record import run_script  # noqa: E402

pytestmark = pytest.mark.integration

# script -> its smallest arguments (the fast suite checks that every script in benchmarks/ is
# smoke-run here or there)
SMOKED = {
    "fanout.py": ["--hosts", "2", "--repeat", "2"],
    "preflight.py": ["--nodes", "1", "--runs", "1"],
    "model_sync.py": ["--hosts", "1", "--mb", "1"],
    "collective_check.py": ["--repeat", "1"],
    "bring_up.py": ["--nodes", "1"],
    "bench_agreement.py": [],  # the vllm_server's URL, added by its test
    "prefix_routing.py": ["--smoke"],
    "serve_overhead.py": ["--rounds", "1", "--levels", "1", "--output-tokens", "4"],
}
# Scripts whose measuring part runs on a bed a module already serves on (the script's rollout there
# is a no-op, so it costs no engine start): script -> the test that runs it. Their `--help` runs in
# tests/cli/test_benchmark_smokes.py.
SMOKED_ON_MODULE_BEDS = {
    "multinode.py": "tests/integration/test_gpu_path.py::test_multinode_benchmark_measures_the_spanning_replica",
    "moe_testbed.py": "tests/integration/test_moe_dp.py::test_moe_testbed_benchmark_measures_the_dp_group",
}
TIMEOUT_S = 840.0  # under setup.cfg's 900 s per test


@pytest.fixture(autouse=True)
def _bed_capable():
    from tests.conftest import in_ci

    reason = check_capabilities()
    if reason:
        if in_ci():
            pytest.fail(f"multi-host test bed unavailable under CI: {reason}", pytrace=False)
        pytest.skip(f"multi-host test bed unavailable: {reason}")


def overhead_smoke(bare_url: str, serve_url: str, api_key: str) -> dict:
    """serve_overhead.py's measuring part on two running endpoints: its one level's figures."""
    env = {**os.environ, "ORCH_SMOKE_API_KEY": api_key}
    got = smoke("serve_overhead.py", "--bare-url", bare_url, "--serve-url", serve_url, "--api-key-env", "ORCH_SMOKE_API_KEY", env=env)
    return got["variants"]["running"]["levels"]["1"]


def smoke(script: str, *extra: str, env: dict | None = None):
    """Run the script at its smallest setting; its parsed JSON (one object, or a list of rows)."""
    code, figures, stderr, _ = run_script(script, [*SMOKED[script], *extra], timeout=TIMEOUT_S, env=env)
    assert code == 0 and figures is not None, f"{script} exited {code}:\n{stderr[-4000:]}\n{json.dumps(figures)[-4000:]}"
    return figures


# ---- light: beds and SSH only ----


def test_fanout_smoke():
    got = smoke("fanout.py")
    assert got["hosts"] == got["ok"] == 2 and got["errors"] == []


def test_preflight_smoke():
    rows = smoke("preflight.py")
    rows = rows if isinstance(rows, list) else [rows]
    assert [(r["nodes"], r["runs"], "errors" in r) for r in rows] == [(1, 1, False)], rows


def test_model_sync_smoke():
    rows = smoke("model_sync.py")
    rows = rows if isinstance(rows, list) else [rows]
    modes = {r["mode"] for r in rows if "mode" in r}
    assert modes == {"chain", "ssh-each"} and all(r["hosts"] == 1 for r in rows if "mode" in r)


def test_collective_check_smoke():
    *runs, summary = smoke("collective_check.py")
    assert sorted(r["collective_check"] for r in runs) == sorted(summary["median_s"]) and summary["runs"] == 1, (runs, summary)


# ---- heavy: Ray clusters and vLLM engines ----


@pytest.mark.ray
def test_bring_up_smoke():
    row = smoke("bring_up.py")  # one count: one row, no comparison row
    assert row["nodes"] == 1 and row["seconds"] > 0, row


@pytest.mark.vllm
def test_bench_agreement_smoke_against_the_suites_vllm_server(vllm_server):
    got = smoke("bench_agreement.py", "--url", vllm_server.url, "--model", vllm_server.model, "--tokenizer", str(vllm_server.model_dir),
                "--", "--concurrency", "1", "--requests", "2", "--prompt-tokens", "32", "--output-tokens", "4")  # fmt: skip
    (run,) = got["runs"]
    assert "error" not in run, run
    assert [(lv["concurrency"], lv["succeeded"]) for lv in run["levels"]] == [(1, 2)]
    assert run["levels"][0]["ttft"]["server_count"] == 2  # vLLM's own histogram counted exactly these requests


@pytest.mark.ray
@pytest.mark.vllm
def test_prefix_routing_smoke_reads_the_replicas_prefix_cache():
    got = smoke("prefix_routing.py")
    row = got["routers"]["session_affinity"]
    assert row["failed"] == 0 and row["ok"] == 4
    # The engine's own counters, read per replica, count this load and only it (not the warm-up):
    # every prompt token queried, and one hit of each 256-token prefix (two whole 128-token blocks,
    # vLLM's CPU block size: vllm/platforms/cpu.py) for its second turn, one request at a time.
    (replica,) = row["replicas"].values()
    assert replica["requests"] == row["counted_requests"] == 4 and replica["queries"] == row["prompt_tokens"]
    assert replica["hits"] == 2 * 256 and row["prefix_cache_hit_rate"] == round(512 / row["prompt_tokens"], 4), row


@pytest.mark.ray
@pytest.mark.vllm
def test_serve_overhead_smoke_on_the_suites_servers(served_tiny, vllm_server):
    """Its measuring part, on servers that run already: the suite's bare vLLM server
    (``vllm_server``) and the session's served model (the same tiny model, engine settings and KV
    cache, behind Serve as orch deploys it): no engine start of its own."""
    level = overhead_smoke(vllm_server.url, served_tiny.endpoint, served_tiny.api_key)
    assert level["bare"]["failed"] == level["serve"]["failed"] == 0 and level["serve"]["output_tok_s"] > 0, level
    assert level["bare"]["rounds"][0]["ok"] == level["serve"]["rounds"][0]["ok"] == 64, level
