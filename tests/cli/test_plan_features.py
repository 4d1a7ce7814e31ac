"""`orch plan` / `orch rollout` with LoRA and speculative decoding: the flags, their errors (exit 2,
naming the flag), the memory table's rows and the engine arguments the rollout renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
M405 = REPO / "cluster-templates" / "2x8-h100-405b.yaml"
CONFIGS = REPO / "tests" / "data" / "planner" / "configs"


def test_plan_with_lora_shows_the_slots_and_renders_vllms_arguments(capsys):
    assert main(["plan", "--model", "llama3-8b", "--tp", "1", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["features"]["lora_gib_per_gpu"] == pytest.approx(1.3762, abs=1e-4)  # tests/unit/test_engine_features.py
    assert {k: data["engine_kwargs"][k] for k in ("enable_lora", "max_loras", "max_lora_rank")} == {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64}
    assert main(["plan", "--model", "llama3-8b", "--tp", "1", "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "LoRA slots per GPU │ 1.38 GiB (4 x rank 64)" in out


def test_plan_with_a_speculative_draft_model_shows_its_row(capsys):
    draft = CONFIGS / "Qwen3-0.6B"
    args = ["plan", "--model", str(CONFIGS / "Qwen3-32B"), "--speculative-method", "draft_model", "--speculative-model", str(draft),
            "--num-speculative-tokens", "4"]  # fmt: skip
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine_kwargs"]["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 4, "model": str(draft)}
    assert data["features"]["draft_kv_bytes_per_token_per_gpu"] > 0
    assert main(args) == 0
    assert "draft per GPU" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "needle"), [
    (["--max-loras", "2"], "error: --max-loras needs --enable-lora"),
    (["--enable-lora", "--max-lora-rank", "7"], "error: invalid value for '--max-lora-rank'"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "error: --max-cpu-loras (2) must be at least --max-loras (4)"),
    (["--num-speculative-tokens", "3"], "error: --num-speculative-tokens needs --speculative-method"),
    (["--speculative-method", "eagle3"], "error: --speculative-method eagle3 needs --num-speculative-tokens"),
    (["--speculative-method", "mtp", "--num-speculative-tokens", "1"], "error: --speculative-method mtp: llama3-8b (llama) has no MTP layers"),
    (["--speculative-method", "medusa", "--num-speculative-tokens", "1"], "error: invalid value for '--speculative-method'"),
    (["--speculative-method", "eagle", "--num-speculative-tokens", "0"], "error: invalid value for '--num-speculative-tokens'"),
])  # fmt: skip
def test_bad_feature_flags_exit_2_naming_the_flag(capsys, args, needle):
    assert main(["plan", "--model", "llama3-8b", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_rollout_renders_the_lora_and_speculative_arguments_and_refuses_them_as_engine_args(capsys):
    base = ["rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192", str(M405), "--dry-run", "--json"]
    assert main([*base, "--enable-lora", "--max-loras", "2", "--speculative-method", "ngram", "--num-speculative-tokens", "3"]) == 0
    data = json.loads(capsys.readouterr().out)
    kwargs = data["config"]["args"]["llm_configs"][0]["engine_kwargs"]
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 2, 16)
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert data["plan"]["features"]["lora_gib_per_gpu"] > 0
    assert main([*base, "--engine-arg", "max_loras=4"]) == 2
    assert "use --max-loras instead" in capsys.readouterr().err


def test_rollout_with_lora_adapters_renders_them_and_their_slots(capsys):
    base = ["rollout", "--model", "llama3-8b", "--model-path", "/models/llama3-8b", "--max-model-len", "8192", str(M405), "--dry-run", "--json"]
    assert main([*base, "--lora", "sql=/models/adapters/sql", "--lora", "chat=s3://bucket/adapters/chat", "--max-lora-rank", "8"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    kwargs = config["args"]["llm_configs"][0]["engine_kwargs"]
    # the adapters are the engine deployment's user_config (loaded by the running replicas), not args
    assert "lora_modules" not in kwargs and config["deployments"] == [{"name": "LLMServer:llama3-8b", "user_config": {"lora_adapters": [
        {"name": "chat", "source": "s3://bucket/adapters/chat"}, {"name": "sql", "source": "/models/adapters/sql"}]}}]  # fmt: skip
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 2, 8)  # --lora implies the slots


@pytest.mark.parametrize(("args", "needle"), [
    (["--lora", "sql"], "error: --lora 'sql': expected NAME=SOURCE"),
    (["--lora", "=/m/sql"], "error: --lora '=/m/sql': the adapter's name (before =) is empty"),
    (["--lora", "sql=gs://b/sql"], "error: --lora 'sql=gs://b/sql': the scheme gs:// of 'gs://b/sql' is not supported"),
    (["--lora", "llama3-8b=/m/sql"], "error: --lora llama3-8b=/m/sql: the name 'llama3-8b' is the base model's served name"),
    (["--lora", "sql=/m/a", "--lora", "sql=/m/b"], "error: --lora sql=/m/b: the adapter 'sql' is given twice (also /m/a)"),
])  # fmt: skip
def test_bad_lora_flags_exit_2_with_the_value_and_a_hint(capsys, args, needle):
    base = ["rollout", "--model", "llama3-8b", "--model-path", "/models/llama3-8b", "--max-model-len", "8192", str(M405), "--dry-run"]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "hint: " in err and "Traceback" not in err
