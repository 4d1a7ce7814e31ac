"""Smoke runs of the benchmark scripts that need no root, no Ray and no engine: each runs at its
smallest setting, as a user runs it (a subprocess of this Python, through benchmarks/record.py's
``run_script``), and must exit 0 and print its JSON. A product change that breaks one of them
fails here the day it lands. The scripts that need the test bed are smoke-run by
tests/integration/test_benchmark_smokes.py; the list of which test runs which script is
``SMOKED`` there, and a test below checks that every script in benchmarks/ is in one of them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from record import NoJson, parse_output, run_script  # noqa: E402

# Scripts smoke-run here; the test-bed ones are in tests/integration/test_benchmark_smokes.py.
SMOKED_HERE = {"loadgen_capacity.py", "moe_layouts.py", "planner_vs_peers.py", "record.py"}
HELPERS = {"bed_serving.py"}  # imported by the bed benchmarks, not run on its own


def run_ok(script: str, *args: str, timeout: float = 120):
    code, figures, stderr, _ = run_script(script, list(args), timeout=timeout)
    assert code == 0 and figures is not None, stderr[-3000:]
    return figures


def test_loadgen_capacity_smallest_run_answers_every_request():
    got = run_ok("loadgen_capacity.py", "--requests", "20", "--concurrency", "2", "--tokens", "2")
    assert got["benchmark"] == "loadgen_capacity" and got["requests"] == got["ok"] == 20 and got["req_per_s"] > 0


def test_moe_layouts_plan_part_plans_every_catalog_moe_on_both_clusters():
    got = run_ok("moe_layouts.py", "--part", "plan")
    assert "testbed" not in got
    # three catalog MoE models (DeepSeek-V3, Qwen3-235B-A22B, Mixtral-8x22B) on 2 x 8 H100 and 2 x 8 H200
    assert len(got["plan"]) == 6 and {row["gpus"] for row in got["plan"]} == {"2 x 8 H100-80GB", "2 x 8 H200-141GB"}
    assert all(row["chosen"] in row["layouts"] for row in got["plan"])


def test_planner_vs_peers_orch_only_scores_orch_on_every_logged_row():
    rows = json.loads((REPO / "tests" / "data" / "planner" / "vllm_logs.json").read_text())["rows"]
    got = run_ok("planner_vs_peers.py", "--orch-only")
    assert set(got["tools"]) == {"orch"} and set(got["rows"]) == {r["id"] for r in rows}
    fit, held = got["tools"]["orch"]["fit"], got["tools"]["orch"]["held_out"]
    assert fit["of"] + held["of"] == len(rows) and fit["rows"] == fit["of"] and held["rows"] == held["of"]


def test_record_keeps_one_json_per_run_with_date_machine_command_and_figures(tmp_path):
    import record

    figures = run_ok("loadgen_capacity.py", "--requests", "10", "--concurrency", "1")
    path = record.record("loadgen_capacity.py", ["--requests", "10"], figures, 1.23, record.machine(), results=tmp_path)
    doc = json.loads(path.read_text())
    assert path.parent == tmp_path and path.name.startswith("loadgen_capacity-") and path.suffix == ".json"
    assert doc["command"] == ".venv/bin/python benchmarks/loadgen_capacity.py --requests 10" and doc["figures"] == figures
    assert doc["date"].endswith("Z") and doc["machine"]["cpus"] >= 1 and "ray" in doc["machine"]["packages"]
    # a script that fails is recorded nowhere
    code, got, _, _ = run_script("record.py", ["no_such_benchmark.py"], timeout=60)
    assert code == 2 and got is None


def test_parse_output_takes_one_object_or_one_per_line_and_refuses_the_rest():
    assert parse_output('{\n "a": 1\n}\n') == {"a": 1}
    assert parse_output('{"n": 1}\n{"n": 2}\n') == [{"n": 1}, {"n": 2}]
    for bad in ("", "error: no root\n", '{"n": 1}\nTraceback\n'):
        try:
            parse_output(bad)
        except NoJson:
            continue
        raise AssertionError(f"accepted {bad!r}")


def test_every_benchmark_script_has_a_smoke_run():
    from tests.integration.test_benchmark_smokes import SMOKED, SMOKED_ON_MODULE_BEDS

    scripts = {p.name for p in (REPO / "benchmarks").glob("*.py")}
    assert SMOKED_HERE | set(SMOKED) | set(SMOKED_ON_MODULE_BEDS) | HELPERS == scripts, "a benchmark script without a smoke run (or a stale name)"
    for script, test in SMOKED_ON_MODULE_BEDS.items():  # the named test exists and runs the script's measuring part
        path, name = test.split("::")
        source = (REPO / path).read_text()
        assert f"def {name}(" in source and f"from {script[:-3]} import run_layouts" in source, (script, test)


def test_the_scripts_smoked_on_module_beds_parse_their_arguments():
    """multinode.py and moe_testbed.py: their smoke runs call ``run_layouts`` in-process; here their
    command line (imports and argument parser) runs as a user runs it."""
    import subprocess

    from tests.integration.test_benchmark_smokes import SMOKED_ON_MODULE_BEDS

    for script in SMOKED_ON_MODULE_BEDS:
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "--layouts" in done.stdout, (script, done.stderr[-2000:])
