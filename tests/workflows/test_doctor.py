"""orch doctor's workflow: the real scan script run through LocalRunners over Ray session folders
laid out like Ray's, one per node; an unreachable node; bounds; preflight facts fed into the
report; and, through the scripted FakeRunner, the exact command sent and failed or garbled scans."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from orchestrator.doctor.diagnose import CODES, collect_logs, diagnose
from orchestrator.doctor.logscan import ScanLimits
from orchestrator.errors import UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.remote.fake import FakeRunner, Prefix, result
from orchestrator.remote.local import LocalRunner

LOGS = Path(__file__).resolve().parent.parent / "data" / "logs"
GLOO_LINE = (LOGS / "COLLECTIVE_IFACE_NOT_FOUND.log").read_text().splitlines()[1]
OOM_LINE = (LOGS / "CUDA_OOM.log").read_text().splitlines()[2]
HEALTHY = "INFO 11-29 09:43:20 [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: model='/m'"


@pytest.fixture
def tmp_path():
    """A short folder: Ray (and orch's manifest check) keep temp_dir at most 36 bytes for sockets."""
    path = Path(tempfile.mkdtemp(prefix="odoc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class DeadRunner:
    """A node whose SSH port does not answer."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.calls = 0

    def run(self, argv, timeout=60.0, env=None):
        self.calls += 1
        raise UnreachableError(f"{self.node}: connect to 10.9.9.9:22 timed out", node=self.node)

    def close(self) -> None:
        pass


def _manifest(tmp_path: Path, interface: str | None = None, python: str = sys.executable):
    iface = f"\n    interface: {interface}" if interface else ""
    text = f"""
name: doc
accelerator: cpu
python: {python}
nodes:
  - name: head
    host: 10.0.0.1
    role: head{iface}
  - name: w1
    host: 10.0.0.2
  - name: w2
    host: 10.0.0.3
ray:
  temp_dir: {tmp_path / "ray"}
"""
    return load_manifest(text, tmp_path / "cluster.yaml")


def _session(tmp_path: Path, node: str, files: dict[str, list[str]]) -> Path:
    """<temp_dir>/<node>/session_<ts>/logs/... with the session_latest symlink, as Ray lays it out."""
    base = tmp_path / "ray" / node
    session = base / "session_2026-11-29_09-41-12_423083_14944"
    for rel, lines in files.items():
        p = session / "logs" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(line + "\n" for line in lines))
    (base / "session_latest").symlink_to(session.name)
    return session


@pytest.fixture
def cluster(tmp_path):
    _session(
        tmp_path,
        "head",
        {
            "raylet.out": [HEALTHY] * 30,
            "gcs_server.out": [HEALTHY] * 5,
            "serve/replica_llm_LLMServer_tiny_abc.log": [HEALTHY] * 12 + [OOM_LINE],
        },
    )
    _session(
        tmp_path,
        "w1",
        {
            "raylet.out": [HEALTHY] * 3,
            "worker-1f2e-ffff-16738.err": [HEALTHY] * 56 + [GLOO_LINE, GLOO_LINE],
            "worker-1f2e-ffff-16738.out": [HEALTHY],
        },
    )
    return _manifest(tmp_path)


def test_findings_name_the_node_file_and_line(cluster):
    runners = [LocalRunner("head"), LocalRunner("w1"), DeadRunner("w2")]
    report = diagnose(cluster, runners, with_preflight=False)

    got = {(f.node, f.code): f for f in report.findings}
    assert set(got) == {("head", "CUDA_OOM"), ("w1", "COLLECTIVE_IFACE_NOT_FOUND"), ("w2", "NODE_LOGS_UNAVAILABLE")}
    gloo = got[("w1", "COLLECTIVE_IFACE_NOT_FOUND")]
    assert gloo.where == "logs/worker-1f2e-ffff-16738.err:57"
    assert gloo.count == 2
    assert gloo.evidence == GLOO_LINE
    assert gloo.hint.endswith("runbooks/COLLECTIVE_IFACE_NOT_FOUND.md")
    assert got[("head", "CUDA_OOM")].where == "logs/serve/replica_llm_LLMServer_tiny_abc.log:13"
    assert report.failed


def test_unreachable_node_is_reported_and_does_not_hide_the_others(cluster):
    dead = DeadRunner("w2")
    report = diagnose(cluster, [LocalRunner("head"), LocalRunner("w1"), dead], with_preflight=False)

    nodes = {n.node: n for n in report.nodes}
    assert nodes["w2"].reachable is False and "timed out" in nodes["w2"].error
    assert nodes["head"].reachable and nodes["head"].session_dir.endswith("session_2026-11-29_09-41-12_423083_14944")
    assert nodes["head"].files_read == 3 and nodes["head"].lines_scanned == 30 + 5 + 13
    unavailable = [f for f in report.findings if f.code == "NODE_LOGS_UNAVAILABLE"]
    assert [(f.node, f.severity) for f in unavailable] == [("w2", "fail")]
    assert "UnreachableError" in unavailable[0].evidence
    assert report.to_dict()["ok"] is False


def test_healthy_cluster_has_no_findings(tmp_path):
    for node in ("head", "w1", "w2"):
        _session(tmp_path, node, {"raylet.out": [HEALTHY] * 10, "worker-a.err": [HEALTHY] * 3})
    report = diagnose(_manifest(tmp_path), [LocalRunner(n) for n in ("head", "w1", "w2")], with_preflight=False)
    assert report.findings == ()
    assert not report.failed
    assert [n.files_read for n in report.nodes] == [2, 2, 2]


def test_node_without_ray_session_is_a_warning(tmp_path):
    _session(tmp_path, "head", {"raylet.out": [HEALTHY]})
    report = diagnose(_manifest(tmp_path), [LocalRunner("head"), LocalRunner("w1")], with_preflight=False)
    assert [(f.node, f.code, f.severity) for f in report.findings] == [("w1", "RAY_SESSION_MISSING", "warn")]
    assert not report.failed


def test_shared_temp_dir_without_node_subfolder_is_found(tmp_path):
    """A node that runs Ray with ray.temp_dir itself (the usual case on real machines)."""
    session = tmp_path / "ray" / "session_1"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "raylet.out").write_text(HEALTHY + "\n" + OOM_LINE + "\n")
    (tmp_path / "ray" / "session_latest").symlink_to("session_1")
    lines = collect_logs(LocalRunner("w1"), "w1", _manifest(tmp_path))
    assert [(ln.node, ln.file, ln.line_no) for ln in lines] == [("w1", "logs/raylet.out", 2)]


def test_missing_interpreter_on_a_node_is_reported(tmp_path):
    _session(tmp_path, "head", {"raylet.out": [OOM_LINE]})
    m = _manifest(tmp_path, python=str(tmp_path / "no-such-python"))
    report = diagnose(m, [LocalRunner("head")], with_preflight=False)
    assert [f.code for f in report.findings] == ["NODE_LOGS_UNAVAILABLE"]
    assert "exited 127" in report.findings[0].evidence


def test_tail_bounds_keep_absolute_line_numbers(tmp_path):
    lines = [HEALTHY] * 10000
    lines[4] = OOM_LINE  # line 5: outside the tail
    lines[9989] = GLOO_LINE  # line 9990: inside it
    _session(tmp_path, "head", {"worker-x.err": lines})
    m = _manifest(tmp_path)
    got = collect_logs(LocalRunner("head"), "head", m, limits=ScanLimits(tail_lines=100))
    assert [(ln.file, ln.line_no) for ln in got] == [("logs/worker-x.err", 9990)]
    # a byte-bounded tail still numbers lines from the start of the file
    got = collect_logs(LocalRunner("head"), "head", m, limits=ScanLimits(max_bytes=20000))
    assert [ln.line_no for ln in got] == [9990]


def test_file_cap_reads_the_most_telling_files_first(tmp_path):
    files = {f"worker-{i:02d}.out": [OOM_LINE] for i in range(10)}
    files["raylet.out"] = [GLOO_LINE]
    _session(tmp_path, "head", files)
    report = diagnose(_manifest(tmp_path), [LocalRunner("head")], limits=ScanLimits(max_files=3), with_preflight=False)
    node = report.nodes[0]
    assert (node.files_read, node.skipped_files) == (3, 8)
    assert {f.code for f in report.findings} == {"COLLECTIVE_IFACE_NOT_FOUND", "CUDA_OOM"}


def test_since_skips_files_not_written_recently(tmp_path):
    session = _session(tmp_path, "head", {"raylet.out": [OOM_LINE], "worker-new.err": [GLOO_LINE]})
    old = time.time() - 3 * 3600
    os.utime(session / "logs" / "raylet.out", (old, old))
    report = diagnose(_manifest(tmp_path), [LocalRunner("head")], since_s=3600, with_preflight=False)
    assert [f.code for f in report.findings] == ["COLLECTIVE_IFACE_NOT_FOUND"]


def test_wrong_interface_in_manifest_is_named_by_preflight_facts(tmp_path):
    """The facts check that explains a Gloo/NCCL interface error: the interface does not exist."""
    _session(tmp_path, "head", {"worker-a.err": [GLOO_LINE]})
    m = _manifest(tmp_path, interface="eth99")
    report = diagnose(m, [LocalRunner("head")], with_preflight=True)
    codes = {(f.node, f.code, f.source) for f in report.findings}
    assert ("head", "COLLECTIVE_IFACE_NOT_FOUND", "logs") in codes
    assert ("head", "NIC_MISSING", "preflight") in codes
    nic = next(f for f in report.findings if f.code == "NIC_MISSING")
    assert "eth99" in nic.evidence and nic.hint.endswith("runbooks/NIC_MISSING.md")


def test_collect_logs_refuses_a_runner_of_another_node(cluster):
    with pytest.raises(ValueError):
        collect_logs(LocalRunner("head"), "w1", cluster)


def test_doctor_codes_are_registered():
    assert {"NODE_LOGS_UNAVAILABLE", "RAY_SESSION_MISSING", "CUDA_OOM"} <= set(CODES)


# --- through the scripted FakeRunner: the command doctor sends, and what it makes of answers


def _scan_output(matches: list[list]) -> str:
    payload = {
        "session_dir": "/tmp/ray/session_1",
        "temp_dir": "/tmp/ray",
        "skipped_files": 0,
        "now": 0,
        "files": [{"path": "worker-a.err", "size": 10, "mtime": 0, "first_line": 1, "lines": 90,
                   "matches": matches, "error": None}],
    }  # fmt: skip
    # a stray warning printed before the JSON must not matter
    return "WARNING: something on stdout\n" + json.dumps(payload) + "\n"


def test_scan_command_is_one_argv_with_the_nodes_python_and_temp_dirs(tmp_path):
    m = _manifest(tmp_path)
    fake = FakeRunner("w1", [(Prefix(sys.executable, "-c"), result(_scan_output([[42, GLOO_LINE]])))])
    report = diagnose(m, [fake], with_preflight=False)

    (call,) = fake.calls
    assert call.argv[:2] == (sys.executable, "-c") and len(call.argv) == 4
    cfg = json.loads(call.argv[3])
    assert cfg["temp_dirs"] == [str(tmp_path / "ray" / "w1"), str(tmp_path / "ray")]
    assert "Unable to find address" in cfg["keywords"] and cfg["since_s"] is None
    assert [(f.node, f.code, f.where) for f in report.findings] == [("w1", "COLLECTIVE_IFACE_NOT_FOUND", "logs/worker-a.err:42")]


def test_keyword_hits_that_are_not_signatures_give_no_finding(tmp_path):
    # "Bus error" is a keyword of SHM_EXHAUSTED, but this line is not its signature
    fake = FakeRunner("w1", [(Prefix(sys.executable, "-c"), result(_scan_output([[3, "note: Bus error handler installed"]])))])
    report = diagnose(_manifest(tmp_path), [fake], with_preflight=False)
    assert report.findings == () and report.nodes[0].candidate_lines == 1


@pytest.mark.parametrize(
    "answer,evidence",
    [
        (result(exit_code=1, stderr="Traceback ...\nPermissionError: [Errno 13]"), "exited 1"),
        (result("not json at all\n"), "printed no JSON result"),
    ],
)
def test_failed_or_unreadable_scan_is_reported_for_that_node(tmp_path, answer, evidence):
    fake = FakeRunner("w1", [(Prefix(sys.executable, "-c"), answer)])
    report = diagnose(_manifest(tmp_path), [fake], with_preflight=False)
    (f,) = report.findings
    assert (f.node, f.code, f.severity) == ("w1", "NODE_LOGS_UNAVAILABLE", "fail")
    assert evidence in f.evidence
