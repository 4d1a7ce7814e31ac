"""`orch plan`: the JSON contract other tools script against, the tables, and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.plan.calibration import EngineFigures

REPO = Path(__file__).resolve().parents[2]
M405 = REPO / "cluster-templates" / "2x8-h100-405b.yaml"
CONTRACT_KEYS = (
    "model", "params", "weights_gib_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_gib_per_gpu",
    "kv_cache_tokens", "max_concurrency", "tp", "pp", "replicas", "fits", "reasons",
)  # fmt: skip


def run_json(capsys, *args: str, rc: int = 0) -> dict:
    got = main(["plan", *args, "--json"])
    out = capsys.readouterr()
    assert got == rc, out.err
    return json.loads(out.out)


def test_json_has_the_contract_keys_and_seed_tables(capsys):
    data = run_json(capsys, "--model", "llama3-8b", "--gpu-type", "H100-80GB", "--gpus-per-node", "8")
    for key in CONTRACT_KEYS:
        assert key in data, key
    assert (data["tp"], data["pp"], data["replicas"], data["fits"]) == (1, 1, 8, True)
    assert data["kv_bytes_per_token_per_gpu"] == 131072
    assert data["seed"]["weights_gib"]["bf16"] == pytest.approx(14.96, abs=0.01)
    assert [row["gib"] for row in data["seed"]["kv_cache_gib"][:3]] == [1.0, 16.0, 64.0]
    assert data["kv_cache_tokens"] % 16 == 0


def test_405b_on_the_two_node_template_is_tp8_pp2(capsys):
    data = run_json(capsys, "--model", "llama3-405b", "--cluster", str(REPO / "cluster-templates" / "2x8-h100-405b.yaml"))
    assert (data["tp"], data["pp"], data["replicas"], data["fits"]) == (8, 2, 1, True)
    assert data["stage_layers"] == [63, 63]
    assert data["engine_kwargs"]["pipeline_parallel_size"] == 2


@pytest.mark.parametrize("memory", [[], ["--gpu-memory-gib", "79.19"]])
def test_405b_on_two_h100_nodes_is_tp8_pp2_with_or_without_a_memory_override(capsys, memory):
    # --gpu-memory-gib used to drop the default H100 type and its NVLink: TP=1, PP=12 on 12 of 16 GPUs
    data = run_json(capsys, "--model", "llama3-405b", "--gpus-per-node", "8", "--nodes", "2", *memory)
    assert (data["tp"], data["pp"], data["replicas"], data["fits"]) == (8, 2, 1, True)
    assert data["gpu_type"] == "H100-80GB"
    assert data["gpu_memory_gib"] == (79.19 if memory else 79.18)
    assert any("assumed NVLink" in r for r in data["reasons"])


def test_flags_override_the_manifest_shape(capsys):
    # nothing fits: the JSON is still printed whole, and the exit code is 2 (documented: "plan")
    data = run_json(capsys, "--model", "llama3-405b", "--cluster", str(REPO / "cluster-templates" / "2x8-h100-405b.yaml"), "--nodes", "1", rc=2)
    assert data["fits"] is False and data["nodes"] == 1
    assert any("2 nodes of 8" in s for s in data["suggestions"])


def test_nothing_fits_exits_2_after_the_plan_and_names_what_would(capsys):
    assert main(["plan", "--model", "llama3-405b", "--gpus-per-node", "8", "--nodes", "1"]) == 2
    out = capsys.readouterr()
    assert "Why" in out.out
    assert "error: llama3-405b does not fit 1 x 8 H100-80GB" in out.err
    assert "2 nodes of 8 would fit it with TP=8 PP=2" in out.err


HOSTILE_CONFIGS = [
    (b'{"num_hidden_layers": 1000000000000, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008}', "'num_hidden_layers' is 1,000,000,000,000, outside the range"),
    (b'{"num_hidden_layers": 32, "hidden_size": 16, "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 64}', "hidden_size 16 is smaller than num_attention_heads 32"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"num_hidden_layers": ' + b"9" * 5000 + b"}", "not a usable JSON value"),
    (bytes(range(256)) * 4, "not UTF-8 text"),
    (b'{"num_hidden_layers": 32, "hidden_size": 1000000000000000000000000000000, "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008}', "'hidden_size' is 1,000,000,000,000,000,000,000,000,000,000, outside"),
    (b'{"num_hidden_layers": 1024, "hidden_size": 131072, "num_attention_heads": 1024, "vocab_size": 4000000, "intermediate_size": 1048576}', "past the 100T orch accepts"),
    (b'{"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 64, "vocab_size": 32000, "intermediate_size": 11008}', "not a multiple of num_key_value_heads 64"),
    (b'{"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": NaN, "intermediate_size": 11008}', "'vocab_size' must be a non-negative integer, got nan"),
]


@pytest.mark.parametrize(("content", "needle"), HOSTILE_CONFIGS)
def test_hostile_config_json_is_a_clear_error_with_exit_2(capsys, tmp_path, content, needle):
    config = tmp_path / "config.json"
    config.write_bytes(content)
    assert main(["plan", "--model", str(config), "--json"]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    assert "internal error" not in err


def test_a_fifo_as_config_json_is_refused_without_blocking(capsys, tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    assert main(["plan", "--model", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err


def test_tiny_model_folder_on_cpu(capsys, tiny_model_dir):
    data = run_json(capsys, "--model", str(tiny_model_dir), "--gpu-type", "cpu", "--max-model-len", "1024", "--kv-cache-gib", "1")
    assert (data["tp"], data["pp"], data["fits"]) == (1, 1, True)
    assert data["kv_cache_tokens"] == 2**30 // data["kv_bytes_per_token_per_gpu"]


def test_forced_kv_cache_and_memory(capsys):
    data = run_json(capsys, "--model", "llama3-8b", "--gpu-memory-gib", "40", "--gpus-per-node", "1", "--kv-cache-gib", "8", "--max-model-len", "8192")
    assert data["kv_cache_gib_per_gpu"] == 8 and data["kv_cache_gib_fixed"] is True
    assert data["gpu_memory_gib"] == 40


def test_rich_output_shows_the_seed_tables_and_reasons(capsys):
    assert main(["plan", "--model", "llama3-70b", "--gpu-type", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    for needle in ("Weights", "131.4 GiB", "65.7 GiB", "32.9 GiB", "KV cache", "320.0 KiB per token", "B_max", "Why", "tensor parallel"):
        assert needle in out, needle


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model", "llama3_8b"], "did you mean 'llama3-8b'"),
        (["--model", "llama3-70b", "--tp", "3"], "does not divide the 64 attention heads"),
        (["--model", "llama3-70b", "--tp", "1", "--pp", "1"], "does not fit"),
        (["--model", "llama3-8b", "--gpu-type", "H1000"], "unknown GPU type"),
        (["--model", "llama3-8b", "--max-model-len", "999999"], "exceeds the model's"),
        (["--model", "llama3-8b", "--gpu-type", "cpu", "--tp", "2"], "do not apply"),
        (["--model", "llama3-8b", "--cluster", "/nonexistent/cluster.yaml"], ""),
    ],
)
def test_bad_requests_exit_2_with_a_clear_error(capsys, args, needle):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama3-8b", "--tp", "0"],
        ["--model", "llama3-8b", "--gpu-memory-utilization", "1.5"],
        ["--model", "llama3-8b", "--dtype", "fp4"],
        ["--model", "llama3-8b", "--kv-cache-dtype", "int8"],
        ["--model", "llama3-8b", "--nodes", "zero"],
        ["--gpu-type", "H100-80GB"],
    ],
)
def test_bad_flags_exit_2(capsys, args):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert "Error" in err or "error" in err


def test_the_vllm_version_defaults_to_the_gpu_extras_pin_and_changes_the_terms(capsys):
    default = run_json(capsys, "--model", "llama3-70b", "--max-model-len", "8192")
    assert default["vllm_version"] == "0.29.0"
    assert any("vLLM 0.29.0: the version the gpu extra pins" in r for r in default["reasons"])
    old = run_json(capsys, "--model", "llama3-70b", "--max-model-len", "8192", "--vllm-version", "0.20.1", "--tp", "4")
    new = run_json(capsys, "--model", "llama3-70b", "--max-model-len", "8192", "--vllm-version", "0.21.0", "--tp", "4")
    # 0.21 raised the default utilization to 0.92 and began subtracting the CUDA graph estimate
    assert (old["gpu_memory_utilization"], new["gpu_memory_utilization"]) == (0.9, 0.92)
    assert (old["engine_terms"]["cuda_graph_estimate_subtracted"], new["engine_terms"]["cuda_graph_estimate_subtracted"]) == (False, True)
    assert new["reserve_gib_per_gpu"] == pytest.approx(old["reserve_gib_per_gpu"] + 0.36, abs=0.01)  # "Estimated CUDA graph memory: 0.36 GiB" (0.27.1, gpustack/runner#251)
    eager = run_json(capsys, "--model", "llama3-70b", "--max-model-len", "8192", "--vllm-version", "0.21.0", "--tp", "4", "--enforce-eager")
    assert eager["reserve_gib_per_gpu"] == pytest.approx(old["reserve_gib_per_gpu"], abs=0.01)
    assert main(["plan", "--model", "llama3-8b", "--vllm-version", "latest"]) == 2
    assert "unrecognised vLLM version 'latest'" in capsys.readouterr().err


def test_max_num_seqs_and_batched_tokens_size_the_reserve(capsys):
    base = run_json(capsys, "--model", "llama3-8b", "--gpus-per-node", "1", "--vllm-version", "0.11.0", "--max-model-len", "8192")
    fewer = run_json(capsys, "--model", "llama3-8b", "--gpus-per-node", "1", "--vllm-version", "0.11.0", "--max-model-len", "8192", "--max-num-seqs", "64")
    # 0.11 sorts max_num_seqs x vocab fp32 logits in its sampler warm-up: 1024 -> 64 sequences frees ~4.4 GiB
    assert base["max_num_seqs"] == 1024 and fewer["max_num_seqs"] == 64
    assert base["reserve_gib_per_gpu"] - fewer["reserve_gib_per_gpu"] > 3.5
    assert fewer["engine_kwargs"]["max_num_seqs"] == 64
    tokens = run_json(capsys, "--model", "llama3-8b", "--gpus-per-node", "1", "--vllm-version", "0.11.0", "--max-model-len", "8192",
                      "--max-num-seqs", "64", "--max-num-batched-tokens", "32768")  # fmt: skip
    assert tokens["reserve_gib_per_gpu"] > fewer["reserve_gib_per_gpu"] and tokens["engine_kwargs"]["max_num_batched_tokens"] == 32768
    blocks = run_json(capsys, "--model", "llama3-8b", "--gpus-per-node", "1", "--max-model-len", "8192", "--block-size", "128")
    assert blocks["kv_cache_tokens"] % 128 == 0 and blocks["engine_kwargs"]["block_size"] == 128


def test_with_a_cluster_that_is_up_the_probed_vllm_version_is_used(capsys, tmp_path):
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.state import StateStore

    manifest = load_manifest_file(M405)
    state = StateStore(tmp_path / "state")
    state.save_facts(manifest.name, {n.name: {"versions": {"vllm": "0.18.2", "ray": "2.60.0"}} for n in manifest.nodes})
    state.record_cluster(manifest.name, manifest.fingerprint(), "192.0.2.10", 8265)
    rc = main(["--state-dir", str(tmp_path / "state"), "plan", "--model", "llama3-405b", "--cluster", str(M405), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and data["vllm_version"] == "0.18.2"
    assert any("the vLLM that `orch up` probed on the nodes of llama405" in r for r in data["reasons"])
    assert data["engine_terms"]["sampler_warmup"] == "triton"


def test_plan_on_a_cluster_with_a_matching_record_uses_the_measured_reserve(capsys, tmp_path):
    from orchestrator.manifest.load import load_manifest_file
    from orchestrator.plan.calibration import calibration_record, model_fingerprint
    from orchestrator.plan.catalog import CATALOG
    from orchestrator.state import StateStore
    from orchestrator.workflows.calibration import save_calibration

    manifest = load_manifest_file(M405)
    state = StateStore(tmp_path / "state")
    state.save_facts(manifest.name, {n.name: {"versions": {"vllm": "0.29.0"}} for n in manifest.nodes})
    state.record_cluster(manifest.name, manifest.fingerprint(), "192.0.2.10", 8265)
    args = ["--state-dir", str(tmp_path / "state"), "plan", "--model", "llama3-405b", "--cluster", str(M405), "--max-model-len", "8192", "--json"]
    assert main(args) == 0
    modelled = json.loads(capsys.readouterr().out)
    # the engine of that exact configuration measured 9.0 GiB of reserve per GPU (as `orch status` records it)
    plan = {**modelled, "model_fingerprint": model_fingerprint(CATALOG["llama3-405b"])}
    weights = modelled["weights_gib_per_gpu"]
    kv = modelled["gpu_memory_gib"] * modelled["gpu_memory_utilization"] - weights - 9.0
    record = calibration_record(plan, EngineFigures(weights, kv, None, None, "cuda"))
    assert record is not None and record["measured_reserve_gib"] == pytest.approx(9.0, abs=0.01)
    save_calibration(state, manifest.name, {**record, "revision": 3})
    assert main(args) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert (calibrated["tp"], calibrated["pp"]) == (modelled["tp"], modelled["pp"])
    assert calibrated["reserve_gib_per_gpu"] == pytest.approx(9.0, abs=0.01) != modelled["reserve_gib_per_gpu"]
    assert any("calibrated: revision 3 of this configuration measured 9.00 GiB" in r for r in calibrated["reasons"])
    # a different flag is a different configuration: the model again
    assert main([*args, "--max-num-seqs", "256"]) == 0
    assert json.loads(capsys.readouterr().out)["reserve_gib_per_gpu"] != pytest.approx(9.0, abs=0.01)
    # the same configuration measured by vLLM's CPU backend standing in for the H100s (the test
    # beds): kept under "cpu", never used for the H100 plan, and the plan says why
    cpu = calibration_record(plan, EngineFigures(None, None, 1_048_576, None, "cpu"))
    assert cpu is not None
    (tmp_path / "state" / "clusters" / manifest.name / "calibration.json").unlink()
    save_calibration(state, manifest.name, {**cpu, "revision": 4})
    assert main(args) == 0
    stood_in = json.loads(capsys.readouterr().out)
    assert stood_in["reserve_gib_per_gpu"] == pytest.approx(modelled["reserve_gib_per_gpu"], abs=0.001)
    assert any("not calibrated: the record of revision 4 of this configuration is not used (its engine ran on vLLM's cpu platform, not on H100-80GB)" in r
               for r in stood_in["reasons"]), stood_in["reasons"]  # fmt: skip


def test_dp_and_expert_parallel_flags_and_both_layouts_in_the_json(capsys):
    data = run_json(capsys, "--model", "deepseek-v3", "--gpu-type", "H200-141GB", "--nodes", "2", "--dp", "8")
    assert (data["dp"], data["tp"], data["expert_parallel"], data["ep_size"], data["replicas"]) == (8, 1, True, 8, 2)
    assert data["engine_kwargs"]["data_parallel_size"] == 8 and data["engine_kwargs"]["enable_expert_parallel"] is True
    assert data["kv_cache_tokens"] == 8 * data["kv_cache_tokens_per_rank"]
    assert set(data["layouts"]) == {"tp_pp", "dp_ep"} and data["layouts"]["dp_ep"]["chosen"] is True
    off = run_json(capsys, "--model", "deepseek-v3", "--gpu-type", "H200-141GB", "--nodes", "2", "--dp", "8", "--no-expert-parallel")
    assert off["expert_parallel"] is False and "enable_expert_parallel" not in off["engine_kwargs"]


def test_the_table_shows_both_layouts_side_by_side(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    assert main(["plan", "--model", "deepseek-v3", "--gpu-type", "H200-141GB", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "Layouts side by side" in out and "DP=16 x TP=1 EP=16" in out and "TP=8 x PP=1" in out
    assert "data parallel" in out and "(DP groups)" in out


def test_dp_on_a_dense_model_is_a_usage_error_with_a_hint(capsys):
    assert main(["plan", "--model", "llama3-8b", "--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert "error: llama3-8b is a dense model: data parallelism is for MoE models" in err
    assert "hint: leave out --dp" in err and "Traceback" not in err


def test_a_target_rate_is_sized_with_the_goodput_recorded_on_the_cluster(capsys, tmp_path):
    from orchestrator.bench.goodput import LoadLevel
    from orchestrator.plan.calibration import model_fingerprint
    from orchestrator.plan.model_ref import resolve_model
    from orchestrator.state import StateStore
    from orchestrator.workflows.load_record import record_load

    assert main(["plan", "--model", "llama3-8b", "--target-rps", "10"]) == 2
    assert "--target-rps needs --cluster" in capsys.readouterr().err
    manifest = tmp_path / "c.yaml"
    manifest.write_text("name: c\nnodes:\n  - {name: a, host: 10.0.0.1, role: head, gpus: 8, gpu_type: H100-80GB}\n"
                        "  - {name: b, host: 10.0.0.2, gpus: 8, gpu_type: H100-80GB}\nslo: {ttft_p95_ms: 500}\n")  # fmt: skip
    state_dir = tmp_path / "state"
    args = ["--state-dir", str(state_dir), "plan", "--model", "llama3-8b", "--cluster", str(manifest), "--json"]
    assert main([*args, "--target-rps", "40"]) == 0
    assert "no goodput: no revision serves" in json.loads(capsys.readouterr().out)["target"]["summary"]
    state = StateStore(state_dir)
    rev = state.add_revision("c", "llama3-8b", plan={"model_fingerprint": model_fingerprint(resolve_model("llama3-8b")), "tp": 1, "pp": 1})
    state.update_revision("c", rev.number, "ready")
    # 2 replicas carried 6 req/s at 8 in flight within TTFT p95 500 ms; 16 in flight missed (900 ms).
    levels = [LoadLevel("concurrency=8", 8, None, 32, 32, 0.0, 6.0, 300.0, 9.0, 1300.0),
              LoadLevel("concurrency=16", 16, None, 32, 32, 0.0, 9.0, 900.0, 12.0, 1800.0)]  # fmt: skip
    record_load(state, state.current_revision("c"), levels, {"prompt_tokens": 128, "output_tokens": 64}, 2, None, "orch bench", 1.0)
    # 40 req/s at 3 req/s per replica: ceil(13.3) = 14 replicas of TP 1 = 14 GPUs; 2 x 8 H100 hold 16.
    assert main([*args, "--target-rps", "40"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert (target["replicas"], target["gpus_needed"], target["gpus_total"], target["max_replicas"], target["fits"]) == (14, 14, 16, 16, True)
    # 50 req/s: ceil(16.7) = 17 replicas; the plan is printed, then exit 2.
    assert main([*args, "--target-rps", "50"]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["target"]["replicas"] == 17 and "the target needs 17 replica(s) and the cluster holds 16" in out.err


def test_plan_shows_what_one_replica_takes_at_once(capsys, tmp_path):
    # 1024 sequences: vLLM's default on an H100-80GB (engine/arg_utils.py get_batch_defaults); Serve
    # gets 1.25x that per replica, not twice the concurrency at full context (32 before).
    data = run_json(capsys, "--model", "llama3-405b", "--cluster", str(M405))
    assert data["in_flight"]["max_ongoing_requests"] == 1280 >= data["max_num_seqs"] == 1024
    assert data["in_flight"]["source"] == "engine"
    assert main(["plan", "--model", "llama3-405b", "--cluster", str(M405)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "max_ongoing_requests │ 1280 per Serve replica (max_num_seqs 1024 x 1.25" in text
    # The manifest's serve.max_ongoing_requests is what orch would deploy, and the plan says so.
    configured = tmp_path / "c.yaml"
    configured.write_text(M405.read_text().replace("serve:\n", "serve:\n  max_ongoing_requests: 300\n", 1))
    data = run_json(capsys, "--model", "llama3-405b", "--cluster", str(configured))
    assert (data["in_flight"]["max_ongoing_requests"], data["in_flight"]["source"]) == (300, "serve.max_ongoing_requests")


def test_a_layer_type_orch_does_not_know_exits_2_naming_the_field(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "gemma3_text", "num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 32000, "sliding_window": 512,
        "layer_types": ["sliding_attention", "hourglass_attention", "sliding_attention", "full_attention"],
    }))  # fmt: skip
    assert main(["plan", "--model", str(config)]) == 2
    err = capsys.readouterr().err
    assert "layer_types[1]" in err and "hourglass_attention" in err and "Traceback" not in err


def test_a_hybrid_plan_shows_its_layer_types_and_the_lines_vllm_will_print(capsys):
    data = run_json(capsys, "--model", str(REPO / "tests/data/planner/configs/Qwen3.8-27B"), "--gpu-type", "H100-80GB",
                    "--gpus-per-node", "2", "--max-model-len", "131072")  # fmt: skip
    assert data["layer_types"] == "48 Gated DeltaNet + 16 full attention"
    lines = data["vllm_lines"]
    assert lines["max_model_len"] == 131072
    # the size line is concurrency x max_model_len (vLLM >= 0.21), and the plan's concurrency is that one
    assert lines["kv_cache_size_tokens"] == pytest.approx(lines["max_concurrency"] * 131072, rel=0.01)
    assert data["max_concurrency"] == pytest.approx(lines["max_concurrency"], abs=0.01)
    assert data["seed"]["kv_formula"].startswith("by layer type")
