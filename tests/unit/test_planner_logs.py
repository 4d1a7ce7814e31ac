"""The planner against public vLLM start-up logs: a fitting set and a HELD-OUT set.

Every expected figure is what vLLM printed, copied by hand into tests/data/planner/vllm_logs.json
next to the source lines it came from (tests/data/planner/SOURCES.md). Rows where the source
logged only the available KV-cache memory are compared on memory, never on tokens derived with
orch's own bytes per token. The held-out rows were set aside before any term was fitted; no term
may change because of them (add new logs instead).

Targets (issue 16): KV within 10% on every row, held-out median error <= 5%, weights within 3%.
"""

from __future__ import annotations

import json
import statistics

import pytest

from orchestrator.plan.calibration import relative_error
from orchestrator.plan.shape import GPU_TYPES
from tests.fixtures.planner_rows import DATA, predict_row

ROWS = json.loads((DATA / "vllm_logs.json").read_text())["rows"]
FIT = [r for r in ROWS if r["set"] == "fit"]
HELD_OUT = [r for r in ROWS if r["set"] == "held_out"]


def kv_error(row: dict) -> float:
    """Tokens where vLLM printed tokens, else the KV memory it printed."""
    got = predict_row(row)
    if row["kv_tokens"] is not None:
        assert got.kv_tokens is not None
        return relative_error(got.kv_tokens, row["kv_tokens"])
    assert got.kv_gib is not None
    return relative_error(got.kv_gib, row["kv_gib"])


def test_the_table_covers_versions_gpus_and_both_parallelisms():
    assert len(ROWS) >= 15
    assert len({r["vllm"].rsplit(".", 1)[0] if r["vllm"].count(".") > 1 else r["vllm"] for r in ROWS}) >= 4
    assert len({r["gpu"] for r in ROWS}) >= 4 and all(r["gpu"] in GPU_TYPES for r in ROWS)
    assert any(r["tp"] > 1 for r in ROWS) and any(r["pp"] > 1 for r in ROWS)
    assert all(r["set"] == "held_out" for r in ROWS if "dp" in r or "expert_parallel" in r)  # no term was fitted to a DP/EP log
    assert len(HELD_OUT) >= len(ROWS) // 3
    assert len({r["vllm"] for r in HELD_OUT}) >= 3  # spread across versions
    for row in ROWS:
        assert row["source"].startswith("https://github.com/") and row["lines"], row["id"]


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['set']}-{r['id']}" for r in ROWS])
def test_kv_within_10_percent_of_what_vllm_printed(row):
    assert abs(kv_error(row)) <= 0.10, (row["id"], predict_row(row), row["kv_tokens"], row["kv_gib"])


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['set']}-{r['id']}" for r in ROWS])
def test_kv_memory_within_10_percent_where_tokens_were_printed_too(row):
    got = predict_row(row)
    assert got.kv_gib is not None
    assert abs(relative_error(got.kv_gib, row["kv_gib"])) <= 0.10, (row["id"], got.kv_gib, row["kv_gib"])


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['set']}-{r['id']}" for r in ROWS])
def test_weights_within_3_percent_of_what_vllm_printed(row):
    got = predict_row(row)
    assert got.weights_gib is not None
    assert abs(relative_error(got.weights_gib, row["weights_gib"])) <= 0.03, (row["id"], got.weights_gib, row["weights_gib"])


def test_held_out_median_error_at_most_5_percent():
    errors = [abs(kv_error(r)) for r in HELD_OUT]
    assert statistics.median(errors) <= 0.05, dict(zip([r["id"] for r in HELD_OUT], errors, strict=True))


# The peers' errors per row as benchmarks/planner_vs_peers.py measured them (its JSON output of
# 2026-12-01, tests/data/planner/SOURCES.md): llm-d-planner 0.3.3, hf-mem 0.5.6, aiconfigurator 0.12.0.
PEERS_RUN = json.loads((DATA / "peers-2026-12-01.json").read_text())
PEERS = ("llm-d-planner", "hf-mem", "aiconfigurator")
# The expert-parallel rows (row S, 2026-12-03) came after that run; the peers have not been run on them.
# Until the benchmark is rerun they are compared with vLLM above but left out of the comparison with the peers.
PEER_ROWS = [r for r in ROWS if "expert_parallel" not in r]


def test_orch_has_the_lowest_held_out_median_among_the_peers():
    assert set(PEERS_RUN["rows"]) == {r["id"] for r in PEER_ROWS}  # a new TP/PP row needs a new run of the benchmark
    assert {p: PEERS_RUN["peer_versions"][p] for p in PEERS} == {"llm-d-planner": "0.3.3", "hf-mem": "0.5.6", "aiconfigurator": "0.12.0"}
    held_out = [r for r in PEER_ROWS if r["set"] == "held_out"]
    orch = statistics.median(abs(kv_error(r)) for r in held_out)  # orch as it is now, not as recorded
    for peer in PEERS:
        errors = [PEERS_RUN["rows"][r["id"]][peer] for r in held_out]
        measured = [e for e in errors if isinstance(e, float)]  # a row the peer could not run says why instead
        assert len(measured) == len(errors), (peer, errors)
        assert orch < statistics.median(measured), (peer, orch, statistics.median(measured))
