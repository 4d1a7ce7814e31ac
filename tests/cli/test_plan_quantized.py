"""`orch plan` on quantized checkpoints: what it says it read, and the errors (exit 2, hint)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from orchestrator.cli import main

CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"


def test_the_405b_fp8_checkpoint_folder_plans_tp8_on_one_h100_node_and_names_its_quantization(capsys):
    folder = CHECKPOINTS / "meta-llama--Llama-3.1-405B-Instruct-FP8"
    assert main(["plan", "--model", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["tp"], data["pp"], data["fits"], data["dtype"]) == (8, 1, True, "fp8")
    assert data["quantization"]["method"] == "fbgemm_fp8" and data["quantization"]["source"] == f"{folder / 'config.json'} (quantization_config)"
    assert "quantization" not in data["engine_kwargs"]
    assert main(["plan", "--model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Checkpoint dtype fp8." in out and "Quantization: fbgemm_fp8 (fp8 weights, fp32 scale per output channel)" in " ".join(out.split())


def test_an_unknown_quant_method_exits_2_naming_it(capsys, tmp_path):
    config = json.loads((CHECKPOINTS / "Qwen--Qwen3-32B-FP8" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "exl2", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(tmp_path), "--json"]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'config.json'} (quantization_config): unknown quant_method 'exl2' in quantization_config" in err
    assert "hint: orch sizes fp8, fbgemm_fp8, compressed-tensors, awq, gptq, modelopt" in err and "Traceback" not in err


def test_hf_quant_config_json_beside_config_json_is_read(capsys, tmp_path):
    shutil.copy(CHECKPOINTS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "config.json", tmp_path / "config.json")
    assert main(["plan", "--model", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "bf16"  # the config alone says nothing of fp8
    shutil.copy(CHECKPOINTS / "nvidia--Llama-3.1-70B-Instruct-FP8" / "hf_quant_config.json", tmp_path / "hf_quant_config.json")
    assert main(["plan", "--model", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["dtype"], data["quantization"]["method"], data["quantization"]["source"]) == ("fp8", "modelopt", str(tmp_path / "hf_quant_config.json"))
    (tmp_path / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A8_AWQ"}}')
    assert main(["plan", "--model", str(tmp_path)]) == 2
    assert "ModelOpt quant_algo 'W4A8_AWQ'" in capsys.readouterr().err


def test_dtype_int4_on_a_16_bit_checkpoint_is_refused_with_the_checkpoints_that_would_do_it(capsys):
    assert main(["plan", "--model", "llama3-8b", "--dtype", "int4"]) == 2
    err = capsys.readouterr().err
    assert "error: --dtype int4: vLLM does not quantize a bf16 checkpoint to int4 on load" in err
    assert "hint: use an int4 checkpoint of the model (AWQ, GPTQ or compressed-tensors W4A16), or --dtype fp8" in err


def test_dtype_fp8_on_a_16_bit_checkpoint_is_vllms_on_the_fly_quantization(capsys):
    assert main(["plan", "--model", "llama3-8b", "--dtype", "fp8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine_kwargs"]["quantization"] == "fp8_per_tensor" and data["quantization"] is None
    assert any(r.startswith("weights: --dtype fp8 on a bf16 checkpoint: vLLM quantizes the linear layers") for r in data["reasons"])
