"""`orch rollout` / `orch rollback` at the CLI boundary: dry-run output, JSON, errors and exit
codes (no cluster: everything here happens before any Ray or SSH)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
M405 = REPO / "cluster-templates" / "2x8-h100-405b.yaml"


def test_dry_run_before_up_prints_plan_decision_and_redacted_config(capsys, monkeypatch):
    monkeypatch.setenv("ORCH_API_KEY", "cli-secret-key-not-to-print")
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/llama3-405b", "--max-model-len", "8192", str(M405), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "TP=8 PP=2" in out.out and "decision" in out.out and "is not up" in out.out
    assert "orch_serve_hooks:build_openai_app" in out.out and "<redacted>" in out.out
    assert "orch_node_" in out.out  # stage pins
    assert "cli-secret-key-not-to-print" not in out.out + out.err


def test_dry_run_json(capsys):
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192", str(M405), "--dry-run", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert data["action"] == "dry_run:fresh" and data["plan"]["tp"] == 8 and data["plan"]["pp"] == 2
    llm = data["config"]["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["api_key"] == ["<redacted>"] and len(llm["placement_group_config"]["bundles"]) == 16
    # without the memory flags the engine still gets the values the plan was sized with (the version's defaults)
    kwargs = llm["engine_kwargs"]
    assert (kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"], kwargs["enforce_eager"]) == (1024, 8192, False)
    assert (data["plan"]["max_num_seqs"], data["plan"]["max_num_batched_tokens"]) == (1024, 8192)
    assert "block_size" not in kwargs  # vLLM picks per attention backend unless --block-size is given


def test_rollout_without_dry_run_needs_the_cluster_up(capsys):
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/x", str(M405)])
    err = capsys.readouterr().err
    assert rc == 5 and "error: cluster 'llama405' is not up" in err and "orch up" in err


def test_bad_engine_arg_and_plan_that_does_not_fit(capsys):
    assert main(["rollout", "--model", "tiny", str(M405), "--engine-arg", "nonsense", "--dry-run"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/m", "--tp", "1", str(M405), "--dry-run"])
    assert rc == 2 and "error:" in capsys.readouterr().err


def test_rollback_without_revisions_says_so(capsys):
    rc = main(["rollback", str(M405)])
    err = capsys.readouterr().err
    assert rc == 1 and "no earlier revision" in err


def test_remove_needs_a_cluster_and_a_served_model(capsys):
    assert main(["remove", "tiny"]) == 5
    assert "hint: pass CLUSTER_YAML (orch remove tiny cluster.yaml)" in capsys.readouterr().err
    assert main(["remove", "tiny", str(M405), "--dry-run"]) == 2
    assert "error: cluster 'llama405' serves no model: nothing to remove" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arg, says",
    [
        ("'tensor_parallel_size'=1", "is not a vLLM engine argument name"),  # quotes made YAML read it as TP
        ('"pipeline_parallel_size"=4', "is not a vLLM engine argument name"),
        ("tensor-parallel-size=1", "'tensor_parallel_size' is set by orch"),
        ("max_num_seqs: 1\napi_key=x", "is not a vLLM engine argument name"),  # a newline in the key
        ("max_num_seqs=64\ntensor_parallel_size: 1", "the value is not valid YAML"),  # a newline in the value
        ("max_num_seqs=&a 64", "anchors and aliases"),
        ("max_num_seqs=[1, 2", "the value is not valid YAML"),
    ],
)
def test_engine_arg_keys_and_values_that_would_inject_yaml_are_refused_with_exit_2(capsys, arg, says):
    """Issue 12 item 10: an --engine-arg never reaches the template unchecked."""
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/m", "--max-model-len", "8192", str(M405), "--engine-arg", arg, "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert "internal error" not in err and "Traceback" not in err


def test_the_rendered_engine_kwargs_carry_the_planned_values(capsys):
    rc = main([
        "rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192", str(M405), "--dry-run", "--json",
        "--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--enforce-eager", "--block-size", "32",
        "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.85", "--vllm-version", "0.20.1",
    ])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert rc == 0
    kwargs = data["config"]["args"]["llm_configs"][0]["engine_kwargs"]
    planned = {
        "tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 8192, "gpu_memory_utilization": 0.85,
        "kv_cache_dtype": "fp8", "max_num_seqs": 64, "max_num_batched_tokens": 4096, "enforce_eager": True, "block_size": 32,
    }  # fmt: skip
    assert {k: kwargs.get(k) for k in planned} == planned
    assert data["plan"]["vllm_version"] == "0.20.1" and data["plan"]["max_num_seqs"] == 64


def test_an_engine_arg_may_not_override_what_the_plan_sized(capsys):
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/m", str(M405), "--dry-run", "--engine-arg", "max_num_seqs=4096"])
    err = capsys.readouterr().err
    assert rc == 2 and "--engine-arg max_num_seqs sizes the engine's memory" in err and "--max-num-seqs" in err
def test_explicit_tp_across_nodes_is_planned_with_a_warning(capsys):
    """Two nodes of 8 GPUs, --tp 16: one tensor-parallel group over both nodes, allowed on request."""
    rc = main(["rollout", "--model", "llama3-70b", "--model-path", "/m", "--tp", "16", "--max-model-len", "8192", str(M405), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    text = " ".join(out.out.split())  # rich wraps long lines
    assert "warning: forced TP=16 exceeds the 8 GPU(s) per node, so one tensor-parallel group spans 2 nodes" in text
    assert "warning: tensor parallel 16 spans nodes of 8 GPU(s)" in text
    assert "strategy: PACK" in text and "TP=16 PP=1" in text


def test_dp_dry_run_renders_the_dp_builder_with_the_forced_layout(capsys):
    """`--dp 4 --tp 4 --expert-parallel` on 2 x 8 H100 (DeepSeek-V3): the planner's forced DP x TP
    layout becomes Ray Serve LLM's build_dp_openai_app (docs/moe.md), one group of 4 ranks."""
    rc = main(["rollout", "--model", "deepseek-v3", "--model-path", "/models/ds", "--dp", "4", "--tp", "4", "--expert-parallel",
               "--max-model-len", "8192", str(M405), "--dry-run", "--json"])  # fmt: skip
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["plan"]["dp"], data["plan"]["tp"], data["plan"]["expert_parallel"], data["plan"]["replicas"]) == (4, 4, True, 1)
    app = data["config"]
    assert app["import_path"] == "ray.serve.llm:build_dp_openai_app" and list(app["args"]) == ["llm_config"]
    kw = app["args"]["llm_config"]["engine_kwargs"]
    assert (kw["data_parallel_size"], kw["tensor_parallel_size"], kw["enable_expert_parallel"], kw["api_key"]) == (4, 4, True, ["<redacted>"])
    assert app["args"]["llm_config"]["placement_group_config"] == {"strategy": "PACK", "bundles": [{"GPU": 1}] * 4}
    rc = main(["rollout", "--model", "deepseek-v3", "--model-path", "/m", "--dp", "4", str(M405), "--dry-run", "--engine-arg", "data_parallel_rank=1"])
    assert rc == 2 and "set for each data-parallel rank by Ray Serve LLM" in capsys.readouterr().err


def test_max_ongoing_requests_flag_sets_serves_cap(capsys):
    base = ["rollout", "--model", "llama3-405b", "--model-path", "/m", "--max-model-len", "8192", str(M405), "--dry-run"]
    assert main([*base, "--json", "--max-ongoing-requests", "500"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["args"]["llm_configs"][0]["deployment_config"]["max_ongoing_requests"] == 500
    assert data["plan"]["in_flight"]["source"] == "--max-ongoing-requests"
    assert main(base) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "in flight: 1280 per Serve replica (max_num_seqs 1024 x 1.25 headroom)" in out
    rc = main([*base, "--max-ongoing-requests", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-ongoing-requests" in err and "Traceback" not in err


# ---- issue 25 item 8: a dry run says what it does, and a wrong --engine-arg is refused first ----


def test_a_mistyped_engine_arg_is_refused_before_ray_or_vllm_is_imported():
    """The error used to come from Ray Serve LLM's own check, after importing it and vLLM (13 s)."""
    import subprocess
    import sys

    code = (
        "import sys; from orchestrator.cli import main\n"
        f"rc = main(['rollout', '--model', 'llama3-405b', '--model-path', '/m', '--max-model-len', '8192', {str(M405)!r},"
        " '--dry-run', '--engine-arg', 'max_num_seq=64'])\n"
        "print('IMPORTED', sorted(m for m in ('ray', 'vllm', 'torch') if m in sys.modules)); sys.exit(rc)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 2, res.stderr
    assert "IMPORTED []" in res.stdout
    assert "error: --engine-arg max_num_seq: not an engine argument of the installed vLLM; did you mean 'max_num_seqs'?" in res.stderr


def test_the_names_read_from_the_sources_are_the_ones_ray_serve_llm_checks():
    """The static reading gives exactly the fields of the two classes Ray Serve LLM's rule reads
    (ray/llm/_internal/serve/engines/vllm/vllm_models.py), imported here for the comparison."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import FrontendArgs

    from orchestrator.serve.ray_io.engine_arg_names import accepted_engine_args

    real = {f.name for cls in (AsyncEngineArgs, FrontendArgs) for f in dataclasses.fields(cls)}
    assert accepted_engine_args() == real
    assert {"max_num_seqs", "enable_prefix_caching", "api_key", "enforce_eager"} <= real


def test_engine_arg_names_unknown_when_the_sources_are_missing(monkeypatch):
    from orchestrator.serve.ray_io import engine_arg_names

    monkeypatch.setattr(engine_arg_names, "RAY_RULE_MODULE", "ray.no_such_module_here")
    engine_arg_names.accepted_engine_args.cache_clear()
    try:
        assert engine_arg_names.accepted_engine_args() is None
        engine_arg_names.check_engine_arg_names(["anything_at_all"])  # nothing known: nothing refused here
    finally:
        engine_arg_names.accepted_engine_args.cache_clear()


def test_a_dry_run_says_each_step_before_the_slow_validation(capsys, monkeypatch):
    seen: dict[str, str] = {}

    def validate(app, check_engine_args=True):  # stands in for the 13 s import; records what was said before it
        seen["err"] = capsys.readouterr().err
        raise SystemExit(0)

    monkeypatch.setattr("orchestrator.serve.ray_io.validate.validate_app", validate)
    try:
        main(["rollout", "--model", "llama3-405b", "--model-path", "/m", "--max-model-len", "8192", str(M405), "--dry-run"])
    except SystemExit:
        pass
    lines = seen["err"].splitlines()
    assert lines == [
        "- planning llama3-405b on 2 x 8 H100-80GB (79.18 GiB each, NVLink)",
        "- rendering the Serve application (the cluster is not up: sized on the manifest)",
        "- validating the Serve application with Ray Serve LLM's own models (imports ray.serve.llm and vLLM: the slow step)",
    ]


def test_request_router_offers_only_what_runs_and_refuses_prefix_affinity_with_exit_2(capsys):
    # Issue 44: `--request-router prefix-affinity` was offered by --help and always refused by the
    # renderer (serve/routing.py: Ray 2.60's LLMRouter never feeds PrefixCacheAffinityRouter a prefix).
    rc = main(["rollout", "--help"])
    text = capsys.readouterr().out
    assert rc == 0 and "[default|session-affinity]" in text and "prefix-affinity" not in text
    rc = main(["rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192", str(M405),
               "--dry-run", "--request-router", "prefix-affinity"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "'prefix-affinity' is not one of 'default', 'session-affinity'" in err, err
