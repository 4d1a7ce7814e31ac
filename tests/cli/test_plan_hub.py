"""`--model org/name`: a Hugging Face repo id read from the local Hugging Face cache (the layout
huggingface_hub writes: models--org--name/refs/main and snapshots/<commit>/), the Hub only when
allowed, and never a hang without a network (issue 26 item 2). No test reaches past loopback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.model_ref import ModelRef
from orchestrator.serve.desired import RolloutRequest
from orchestrator.serve.location import locate
from orchestrator.workflows.desired import desired_for_model

REPO = Path(__file__).resolve().parents[2]
CHECKPOINTS = REPO / "tests" / "data" / "checkpoints"
REPO_ID = "meta-llama/Llama-3.1-405B-Instruct-FP8"
COMMIT = "0d6a2c8a7b3e3f2f5b1f0b7d9d8c2e4a6b1c3d5e"


def _cache(root: Path, repo_id: str = REPO_ID, folder: str = "meta-llama--Llama-3.1-405B-Instruct-FP8", ref: bool = True) -> Path:
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    for name in ("config.json", "hf_quant_config.json"):
        if (CHECKPOINTS / folder / name).exists():
            shutil.copy(CHECKPOINTS / folder / name, snap / name)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    return snap


@pytest.fixture
def offline_home(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf" / "hub"


def test_a_repo_id_in_the_cache_is_planned_from_its_snapshot(capsys, offline_home):
    snap = _cache(offline_home)
    assert main(["plan", "--model", REPO_ID, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["model"], data["tp"], data["fits"]) == (REPO_ID, 8, True)
    assert data["quantization"]["source"] == f"{snap / 'config.json'} (quantization_config)"


def test_hf_hub_cache_wins_over_hf_home_and_modelopt_files_come_along(capsys, offline_home, monkeypatch, tmp_path):
    _cache(tmp_path / "other", "nvidia/Llama-3.1-70B-Instruct-FP8", "nvidia--Llama-3.1-70B-Instruct-FP8", ref=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "other"))
    assert main(["plan", "--model", "nvidia/Llama-3.1-70B-Instruct-FP8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # the only snapshot, without refs/main
    assert (data["dtype"], data["quantization"]["method"]) == ("fp8", "modelopt")
    assert data["quantization"]["source"].endswith(f"snapshots/{COMMIT}/hf_quant_config.json")


def test_a_repo_id_missing_from_the_cache_offline_exits_2_with_what_to_do(capsys, offline_home):
    assert main(["plan", "--model", "Qwen/Qwen3-32B-FP8"]) == 2
    err = capsys.readouterr().err
    assert f"error: Qwen/Qwen3-32B-FP8: no config.json of this Hugging Face repo in the cache {offline_home} (HF_HUB_OFFLINE is set)" in err
    assert "hint: download it where this machine can reach the Hub (`huggingface-cli download Qwen/Qwen3-32B-FP8 config.json`)" in err


def test_without_a_reachable_hub_the_download_fails_fast_and_clearly(capsys, offline_home, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # loopback, nothing listens: refused at once
    assert main(["plan", "--model", "Qwen/Qwen3-32B-FP8"]) == 2  # one request without retries, then the error
    err = capsys.readouterr().err
    assert "error: Qwen/Qwen3-32B-FP8: no config.json of this Hugging Face repo in the cache" in err
    assert "the Hub did not answer within 10 s" in err and "Traceback" not in err
    assert not (offline_home / "models--Qwen--Qwen3-32B-FP8" / "snapshots").exists()


def test_an_existing_local_path_wins_over_the_repo_id_reading(capsys, offline_home, monkeypatch, tmp_path):
    local = tmp_path / "work" / "meta-llama" / "Llama-3.1-405B-Instruct-FP8"
    local.mkdir(parents=True)
    shutil.copy(CHECKPOINTS / "Qwen--Qwen3-32B-FP8" / "config.json", local / "config.json")
    monkeypatch.chdir(tmp_path / "work")
    _cache(offline_home)  # the Hub's 405B is cached too, but the folder here is what is meant
    assert main(["plan", "--model", REPO_ID, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] < 40e9  # Qwen3-32B's, not the 405B's


def test_the_rollout_passes_the_repo_id_to_vllm_or_the_synced_path_with_a_model_store(offline_home, tmp_path):
    _cache(offline_home)
    gpu = load_manifest_file(REPO / "cluster-templates" / "2x8-h100-405b.yaml")  # model_store: /mnt/shared/models
    where = locate(gpu, REPO_ID)
    assert (where.served_name, where.node_path, where.planner_ref) == (REPO_ID, "/mnt/shared/models/Llama-3.1-405B-Instruct-FP8", ModelRef("hub", REPO_ID, REPO_ID))
    no_store = gpu.model_copy(update={"model_store": None})
    where = locate(no_store, REPO_ID)
    assert (where.served_name, where.node_path, where.planner_ref) == (REPO_ID, REPO_ID, ModelRef("hub", REPO_ID, REPO_ID))
    app = desired_for_model(no_store, RolloutRequest(model=REPO_ID, max_model_len=8192))([], None).rendered.app
    llm = app["args"]["llm_configs"][0]
    assert llm["model_loading_config"] == {"model_id": REPO_ID, "model_source": REPO_ID}
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 8 and "quantization" not in llm["engine_kwargs"]
