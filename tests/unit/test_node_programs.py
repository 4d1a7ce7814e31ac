"""The code orch runs on nodes (issue 44 item 4): one mechanism. Every program is a real module of
``orchestrator.remote.node_programs`` (ruff and mypy check it as any other), imports nothing of orch (the
nodes have no orch installed), does nothing on import, and each argv builder ships the module's
file whole and unchanged."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import private_dir_argv, stop_argv
from orchestrator.collective.plan import free_port_argv, job_argv
from orchestrator.doctor.logscan import scan_argv
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes import probes
from orchestrator.remote import node_programs
from orchestrator.remote.fake import FakeRunner
from orchestrator.serve import node_hooks
from orchestrator.workflows.node_files import install_serve_hooks

FOLDER = Path(node_programs.__file__).resolve().parent
PROGRAMS = sorted(p.stem for p in FOLDER.glob("*.py") if p.stem != "__init__")
MANIFEST = load_manifest("name: tb\npython: /opt/py/bin/python\nnodes: [{name: a, host: 10.0.0.1, role: head, gpus: 8}]\n",
                         Path("tb.yaml"))  # fmt: skip
PY = "/opt/py/bin/python"

# Each program and the argv that ships it, as orch's own code builds it.
SHIPPED = {
    "ib_sysfs": probes.ib_sysfs_argv(PY),
    "versions": probes.versions_argv(PY),
    "storage": probes.storage_argv(PY, "/models"),
    "head_connect": probes.connect_argv(PY, "10.0.0.1", 6379, 10.0, 1.0),
    "head_listen": probes.listen_argv(PY, "10.0.0.1", 6379, 10.0, 2),
    "log_scan": scan_argv(PY, ["/tmp/ray"], ["ERROR"]),
    "private_dir": private_dir_argv(MANIFEST, MANIFEST.head, "/tmp/ray/haproxy"),
    "stop_ray": stop_argv(MANIFEST, MANIFEST.head, "0123456789abcdef0123"),
    "free_port": free_port_argv(PY),
    "collective_job": job_argv(PY, {"rank": 0}),
    "sync_agent": probes.agent_argv(PY, "receive"),
}


def test_every_program_is_shipped_by_a_builder_or_written_whole():
    assert set(PROGRAMS) == set(SHIPPED) | {"orch_serve_hooks"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_argv_carries_the_module_file_whole(name):
    argv = SHIPPED[name]
    assert argv[1] == "-c" and argv[2] == (FOLDER / f"{name}.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_imports_nothing_of_orch(name):
    tree = ast.parse((FOLDER / f"{name}.py").read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert [m for m in imported if m.split(".")[0] in ("orchestrator", "tests")] == []


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_program_is_a_real_module_that_does_nothing_on_import(name):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        module = importlib.import_module(f"orchestrator.remote.node_programs.{name}")
    assert out.getvalue() == "" and Path(module.__file__).resolve() == FOLDER / f"{name}.py"
    if name != "orch_serve_hooks":  # imported by Ray by name; the others run as `python -c`
        tree = ast.parse((FOLDER / f"{name}.py").read_text(encoding="utf-8"))
        guards = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
        assert len(guards) == 1


def test_an_unknown_program_is_refused():
    with pytest.raises(ValueError, match="no node program named 'nope'"):
        node_programs.source("nope")


def test_the_serve_hooks_are_written_whole_where_the_applications_pythonpath_finds_them():
    runner = FakeRunner("a")
    path = install_serve_hooks(runner, MANIFEST, "/home/ops")
    assert path == "/home/ops/.orch/nodes/tb/python/orch_serve_hooks.py" == node_hooks.hooks_path("tb", "/home/ops")
    assert runner.files[path].content == (FOLDER / "orch_serve_hooks.py").read_bytes() and runner.files[path].mode == 0o644


def test_the_names_orch_renders_and_reads_are_the_hook_modules_own():
    """What the rendered application names (classes by import path) and what orch looks for in
    the replicas' logs, against the module that Ray imports on the nodes."""
    hooks = importlib.import_module("orchestrator.remote.node_programs.orch_serve_hooks")
    for name in ("SKIPPED_LINE", "AMX_GRANTED_LINE", "AMX_REFUSED_LINE", "ADAPTER_LINE", "LLM_SERVER_MODULE", "TELEMETRY_PUSH",
                 "CHECKED_RAY", "INGRESS_CLASS", "AMX_CLASS"):  # fmt: skip
        assert getattr(hooks, name) == getattr(node_hooks, name), name
    for dotted in (node_hooks.CALLBACK_CLASS, node_hooks.INGRESS_CLASS, node_hooks.AMX_CLASS):
        module, attr = dotted.rsplit(".", 1)
        # made on first use (vLLM, torch): named without being made
        assert module == node_hooks.MODULE and (attr in vars(hooks) or attr in hooks._MADE_ON_FIRST_USE), dotted
    module, attr = node_hooks.BUILDER_IMPORT_PATH.split(":")
    assert module == node_hooks.MODULE and callable(getattr(hooks, attr))
