"""`orch doctor` through the CLI boundary: table and JSON, exit codes, flags, a local node."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli.doctor import parse_duration
from orchestrator.errors import UsageError

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
OOM_LINE = (LOGS / "CUDA_OOM.log").read_text().splitlines()[2]
WARN_LINE = (LOGS / "NODE_HEARTBEAT_LOST.log").read_text().splitlines()[3]  # "Last heartbeat was sent ..."


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="odcli-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _cluster(d: Path, lines: list[str]) -> Path:
    session = d / "ray" / "session_1" / "logs"
    session.mkdir(parents=True)
    (session / "raylet.out").write_text("".join(x + "\n" for x in ["INFO started"] + lines))
    (d / "ray" / "session_latest").symlink_to("session_1")
    yaml = d / "cluster.yaml"
    yaml.write_text(
        f"""name: clitest
accelerator: cpu
python: {sys.executable}
nodes:
  - name: local
    host: 127.0.0.1
    role: head
    transport: local
ray:
  temp_dir: {d / "ray"}
"""
    )
    return yaml


def test_failure_found_exits_1_with_table_and_runbook(short_dir, capsys):
    yaml = _cluster(short_dir, [OOM_LINE])
    assert main(["doctor", str(yaml), "--no-preflight"]) == 1
    out, err = capsys.readouterr()
    assert "CUDA_OOM" in out and "logs/raylet.out:2" in out and "runbooks/CUDA_OOM.md" in out
    assert "error: doctor found 1 failure(s): CUDA_OOM on local" in err
    assert "Traceback" not in out + err


def test_json_report(short_dir, capsys):
    yaml = _cluster(short_dir, [OOM_LINE, OOM_LINE])
    assert main(["doctor", str(yaml), "--json", "--no-preflight"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    (f,) = report["findings"]
    assert (f["code"], f["node"], f["file"], f["line_no"], f["count"]) == ("CUDA_OOM", "local", "logs/raylet.out", 2, 2)
    assert report["nodes"][0]["reachable"] is True and report["nodes"][0]["files_read"] == 1


def test_warnings_only_exit_0(short_dir, capsys):
    yaml = _cluster(short_dir, [WARN_LINE])
    assert main(["doctor", str(yaml), "--no-preflight"]) == 0
    assert "NODE_HEARTBEAT_LOST" in capsys.readouterr().out


def test_clean_logs_exit_0(short_dir, capsys):
    yaml = _cluster(short_dir, [])
    assert main(["doctor", str(yaml), "--no-preflight"]) == 0
    assert "no known failure signature found" in capsys.readouterr().out


def test_unknown_node_is_a_usage_error(short_dir, capsys):
    yaml = _cluster(short_dir, [])
    assert main(["doctor", str(yaml), "--node", "nope"]) == 2
    assert "--node nope: not a node of cluster clitest" in capsys.readouterr().err


def test_missing_manifest_is_exit_2(short_dir, capsys):
    assert main(["doctor", str(short_dir / "absent.yaml")]) == 2
    assert "error:" in capsys.readouterr().err


def test_without_cluster_yaml_and_nothing_recorded(capsys):
    assert main(["doctor"]) == 5  # the cluster it needs is not up (README, exit codes)
    err = capsys.readouterr().err
    assert "no cluster is up" in err and "pass CLUSTER_YAML" in err


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_bad_duration_is_a_usage_error():
    with pytest.raises(UsageError):
        parse_duration("yesterday")
