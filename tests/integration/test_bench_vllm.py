"""orch bench against a real vLLM server (CPU build, tiny model): the sweep writes its report and
plot, vLLM's own histograms count exactly orch's requests, TPOT agrees within 10% and vLLM's TTFT
interval lies inside orch's."""

from __future__ import annotations

import json

import pytest

from orchestrator.cli import main
from tests.fixtures.vllm_server import vllm_server  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


def test_bench_sweep_report_and_crosscheck_with_vllm_metrics(vllm_server, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "bench"
    code = main([
        "bench", "--url", vllm_server.url, "--model", vllm_server.model, "--tokenizer", str(vllm_server.model_dir),
        "--concurrency", "1,4,16", "--requests", "16", "--prompt-tokens", "128", "--output-tokens", "64",
        "--out", str(out), "--json",
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads(printed)

    # the report folder
    assert (out / "report.md").read_text().count("| concurrency=") >= 3
    assert (out / "tradeoff.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert json.loads((out / "results.json").read_text())["levels"] == result["levels"]

    # every request answered, with exactly the asked lengths (exact prompts via the tokenizer)
    for level in result["levels"]:
        assert level["succeeded"] == level["requests"] == 16, level["errors"]
        assert level["output_tokens"] == 16 * 64
        assert level["prompt_tokens"] == 16 * 128  # counted by the server: the tokenizer built them exactly
        assert level["crosscheck"]["ttft"]["server_count"] == 16  # vLLM saw exactly this level
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 4, 16]

    # the cross-check over the whole run: vLLM counted exactly orch's requests
    whole = result["crosscheck"]
    for fig in ("ttft", "tpot"):
        assert whole[fig]["server_count"] == 48, whole[fig]
    # TPOT: both sides time first token -> last token over N - 1; they agree within 10%
    tpot = whole["tpot"]
    assert abs(tpot["mean_diff"]) <= 0.10, f"TPOT mean: vLLM {tpot['server_mean_ms']:.2f} ms, orch {tpot['client_mean_ms']:.2f} ms"
    assert abs(tpot["median_diff"]) <= 0.10, f"TPOT median: vLLM {tpot['server_median_ms']:.2f} ms, orch {tpot['client_median_binned_ms']:.2f} ms"
    # TTFT: vLLM's interval (frontend arrival -> first token processed) lies inside orch's (sent ->
    # first token received), so orch's can only be longer; by how much is the server's HTTP
    # front-end, reported and explained in docs/bench.md (not within 10% on a CPU-starved host).
    ttft = whole["ttft"]
    assert ttft["client_mean_ms"] >= ttft["server_mean_ms"], ttft
