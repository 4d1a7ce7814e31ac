"""`orch validate`: exit codes, one line per file, every problem as `error: FILE:LINE: ...`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "cluster-templates").glob("*.yaml"))
GOOD = "name: x\nnodes:\n  - {name: a, host: 10.0.0.1, role: head, gpus: 8, gpu_type: A100-40GB}\n"


def test_all_templates_are_valid(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    files = [str(p.relative_to(REPO)) for p in TEMPLATES]
    assert {"cluster-templates/local.yaml", "cluster-templates/1x8-h100.yaml", "cluster-templates/2x8-h100-405b.yaml"} <= set(files)
    assert main(["validate", *files]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(files)
    assert "ok  cluster-templates/2x8-h100-405b.yaml: cluster 'llama405' - 2 nodes (1 head, 1 worker), 16 GPUs (H100-80GB), ray :6379" in out
    assert "ok  cluster-templates/local.yaml: cluster 'local' - 1 node (1 head), CPU only, ray :6379" in out


def _write(path: Path, data: bytes | str) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


GARBAGE = [
    ("missing", lambda d: d / "nope.yaml", "nope.yaml: no such file"),
    ("directory", lambda d: d, "is a directory, not a manifest file"),
    ("empty", lambda d: _write(d / "empty.yaml", ""), "empty.yaml:1: the file is empty"),
    ("binary", lambda d: _write(d / "bin.yaml", bytes(range(256)) * 4), "bin.yaml:2: not UTF-8 text (byte 0x80 at offset 128)"),
    ("invalid-yaml", lambda d: _write(d / "bad.yaml", "name: x\nnodes: [\n  {name: a\n"), "bad.yaml:4: invalid YAML"),
    ("list-top", lambda d: _write(d / "list.yaml", "- name: a\n  host: h\n"), "list.yaml:1: the top level must be a mapping"),
    ("typo-key", lambda d: _write(d / "typo.yaml", GOOD + "  - {name: b, host: h2, gpu: 8}\n"),
     "typo.yaml:4: nodes[1].gpu: unknown key 'gpu' (did you mean 'gpus'?)"),
]


@pytest.mark.parametrize("make,expected", [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_garbage_input_exits_2_with_error_naming_the_file(tmp_path, capsys, make, expected):
    target = make(tmp_path)
    assert main(["validate", str(target)]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert any(line.startswith(f"error: {target}") and expected in line for line in errors), captured.err
    # a missing file points at `orch init` (a pip install has no cluster-templates/), the others at the templates
    assert "hint: " in captured.err and ("`orch init" if not target.exists() else "cluster-templates/") in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert captured.out == ""


def test_every_problem_is_printed_and_valid_files_still_reported(tmp_path, capsys):
    good = _write(tmp_path / "good.yaml", GOOD)
    bad = _write(tmp_path / "bad.yaml", "name: x\nnodes:\n  - {name: a, host: h, role: head, gpus: 0}\n  - {name: a, host: h2, gpus: 1}\n")
    missing = tmp_path / "missing.yaml"
    assert main(["validate", str(bad), str(good), str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == f"ok  {good}: cluster 'x' - 1 node (1 head), 8 GPUs (A100-40GB), ray :6379\n"
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {bad}:3: nodes[0].gpus: must be at least 1 on a gpu cluster (got 0)",
        f"error: {bad}:4: nodes[1].name: duplicate node name 'a' (also nodes[0])",
        f"error: {missing}: no such file",
        f"error: 2 of 3 manifests are not valid: {bad}, {missing}",
    ]


def test_json_report(tmp_path, capsys):
    good = _write(tmp_path / "good.yaml", GOOD)
    bad = _write(tmp_path / "bad.yaml", GOOD.replace("gpus: 8", "gpus: -8"))
    assert main(["validate", "--json", str(good), str(bad)]) == 2
    report = json.loads(capsys.readouterr().out)
    assert [r["file"] for r in report] == [str(good), str(bad)]
    assert report[0]["valid"] is True and report[0]["summary"].startswith("cluster 'x' - 1 node")
    assert len(report[0]["fingerprint"]) == 64
    assert report[1] == {"file": str(bad), "valid": False, "problems": [f"{bad}:3: nodes[0].gpus: must be at least 1 on a gpu cluster (got -8)"]}


def test_json_all_valid_exits_0(capsys):
    assert main(["validate", "--json", str(REPO / "cluster-templates" / "local.yaml")]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["valid"] is True and "CPU only" in entry["summary"]


def test_no_file_is_a_usage_error(capsys):
    assert main(["validate"]) == 2
    assert "error: missing argument 'FILES...'" in capsys.readouterr().err


def test_console_script_exit_code_and_no_traceback(tmp_path):
    """Through a real process: the exit code reaches the shell."""
    bad = _write(tmp_path / "c.yaml", b"\x00\x01binary")
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "validate", str(bad), str(REPO / "cluster-templates" / "local.yaml")],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2, out
    assert f"error: {bad}:1: invalid YAML: unacceptable character #x0000" in out.stderr
    assert "ok  " in out.stdout and "Traceback" not in out.stderr


@pytest.mark.parametrize("gpu_type, closest", [
    ("H100-80GB", None), ("h100", None), ("H100", None), ("a100-sxm4-80gb", None), ("l40s", None),
    ("H100-100GB", "H100-80GB"), ("h100-80gbb", "H100-80GB"), ("RTX4090", "RTX4090-24GB"), ("cpu", None),
])  # fmt: skip
def test_validate_and_plan_apply_one_gpu_type_rule(tmp_path, capsys, gpu_type, closest):
    """Issue 25 item 3: `orch validate` accepted gpu_type H100-100GB that `orch plan --cluster`
    then refused. Now a manifest validates exactly when the planner can size its GPU type, and
    both name the same closest type."""
    path = _write(tmp_path / "c.yaml", GOOD.replace("gpu_type: A100-40GB", f"gpu_type: '{gpu_type}'"))
    validated = main(["validate", str(path)])
    said_validate = capsys.readouterr().err
    planned = main(["plan", "--model", "llama3-8b", "--cluster", str(path), "--json"])
    said_plan = capsys.readouterr().err
    assert (validated == 0) == (planned == 0), (said_validate, said_plan)
    if validated != 0:
        assert validated == planned == 2
        for said in (said_validate, said_plan):
            assert f"unknown GPU type '{gpu_type}'" in said
            assert (f"did you mean '{closest}'?" in said) if closest else "did you mean" not in said
