"""The sampler the plan assumes is the one the engine gets (issue 26 item 4): --sampler, the nodes'
probe (flashinfer installed or not) and the version's default decide it, and the rendered runtime
env sets VLLM_USE_FLASHINFER_SAMPLER to match. Sources: vllm 0.29.0 and 0.32.0 vllm/envs.py (the
variable, on by default), v1/sample/ops/topk_topp_sampler.py (read at sampler construction), the
0.29.0 wheel's Requires-Dist flashinfer-python==0.6.18; vllm 0.11.0 envs.py (the variable, unset
by default) and its optional flashinfer extra; vllm 0.6.4 engine/arg_utils.py + config.py (V0's
chunked prefill past 32K tokens with 512 batched tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.manifest.load import load_manifest_file
from orchestrator.plan.engine_terms import default_flashinfer_sampler, engine_terms, parse_vllm_version
from orchestrator.serve.desired import RolloutRequest
from orchestrator.state import StateStore
from orchestrator.workflows.desired import desired_for_model

REPO = Path(__file__).resolve().parents[2]
M405 = REPO / "cluster-templates" / "2x8-h100-405b.yaml"
LOCAL = REPO / "cluster-templates" / "local.yaml"


@pytest.mark.parametrize(
    ("version", "installed", "expected"),
    [
        ("0.29.0", None, True), ("0.32.0", None, True), ("0.29.0", False, False),  # a requirement of the wheel from 0.29
        ("0.27.1", None, False), ("0.27.1", True, True), ("0.21.0", True, True),  # on when installed again from 0.21
        ("0.15.1", True, False), ("0.11.1", True, False),  # opt-in only between 0.11.1 and 0.21
        ("0.10.1", True, True), ("0.10.1", None, False), ("0.7.3", True, False),
    ],
)  # fmt: skip
def test_the_versions_default_sampler(version, installed, expected):
    assert default_flashinfer_sampler(parse_vllm_version(version), installed) is expected


def test_v0_batches_512_tokens_past_32k_with_chunked_prefill_and_a_whole_sequence_below():
    v0 = engine_terms(parse_vllm_version("0.6.4"))
    assert v0.batch_defaults(80 * 2**30, "H100-80GB", 131072) == (512, 256)
    assert v0.batch_defaults(80 * 2**30, "H100-80GB", 32768) == (32768, 256)
    assert v0.batch_defaults(80 * 2**30, "H100-80GB", 131072, multimodal=True) == (131072, 256)  # not for multimodal models


def _plan(capsys, *args: str) -> dict:
    # 512 batched tokens: the sampler's warm-up, not the forward pass, is the profile's peak
    assert main(["plan", "--model", "mixtral-8x7b", "--max-num-batched-tokens", "512", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_sampler_flag_sets_the_warm_up_and_the_engines_env(capsys):
    default = _plan(capsys)  # vLLM 0.29: FlashInfer, 8 bytes per logit (MoE: no Model Runner V2)
    assert (default["engine_terms"]["sampler_warmup"], default["engine_env"]) == ("flashinfer", {"VLLM_USE_FLASHINFER_SAMPLER": "1"})
    pytorch = _plan(capsys, "--sampler", "pytorch")
    assert (pytorch["engine_terms"]["sampler_warmup"], pytorch["engine_env"]) == ("triton", {"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    assert any(r.startswith("sampler: PyTorch/Triton (--sampler pytorch); the rollout sets VLLM_USE_FLASHINFER_SAMPLER=0") for r in pytorch["reasons"])
    # 1,024 sequences x 32,000 logits x (12 - 8) bytes more to warm up, so a smaller KV cache
    assert pytorch["reserve_gib_per_gpu"] > default["reserve_gib_per_gpu"]
    old = _plan(capsys, "--vllm-version", "0.10.1", "--sampler", "flashinfer")
    assert old["engine_terms"]["sampler_warmup"] == "flashinfer"


def test_the_nodes_probe_decides_where_the_version_uses_flashinfer_only_when_installed(capsys, tmp_path):
    manifest = load_manifest_file(M405)
    state = StateStore(tmp_path / "state")
    state.record_cluster(manifest.name, manifest.fingerprint(), "192.0.2.10", 8265)
    for installed, sampler in ((None, "triton"), ("0.2.14", "flashinfer")):
        versions = {"vllm": "0.27.1", "ray": "2.60.0", "flashinfer": installed}
        state.save_facts(manifest.name, {n.name: {"versions": versions} for n in manifest.nodes})
        assert main(["--state-dir", str(tmp_path / "state"), "plan", "--model", "mixtral-8x7b", "--cluster", str(M405), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["engine_terms"]["sampler_warmup"] == sampler
        where = "installed on" if installed else "missing on"
        assert any(f"vLLM 0.27.1's default with flashinfer {where} the nodes `orch up` probed" in r for r in data["reasons"])


def test_the_rendered_runtime_env_carries_the_planned_sampler_on_gpus_only():
    gpu = load_manifest_file(M405)

    def env(manifest, **request) -> dict:
        app = desired_for_model(manifest, RolloutRequest(**request))([], None).rendered.app
        return app["runtime_env"]["env_vars"]

    common = {"model": "mixtral-8x7b", "model_path": "/m/mixtral", "max_model_len": 8192}
    assert env(gpu, **common)["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    assert env(gpu, **common, flashinfer_sampler=False)["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env(gpu, **common, vllm_version="0.27.1")["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    cpu = load_manifest_file(LOCAL)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in env(cpu, model="tiny", max_model_len=1024)
