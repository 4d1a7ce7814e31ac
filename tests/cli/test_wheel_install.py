"""orch as a user gets it: a wheel installed without -e into a fresh venv, run from a directory
outside the checkout. The commands must find their data (Serve template, runbooks, example
manifests) inside the installed package.

The wheel is built from a copy of the sources (so a stale build/ of the checkout cannot leak into
it) with `pip wheel --no-deps --no-build-isolation` (offline). The fresh venv gets the wheel with
`pip install --no-deps`; its third-party dependencies come from this interpreter's site-packages
through a plain path line in a .pth file (the same effect as --system-site-packages for a venv
whose base has them; a plain line does not run the .pth files there, so the checkout's editable
install stays invisible). The test asserts the package imported is the installed copy.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("orchestrator", "runbooks", "cluster-templates", "setup.py", "setup.cfg", "pyproject.toml", "README.md", "MANIFEST.in")


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(venv dir, a working directory outside the checkout, environment for the commands)."""
    work = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["ORCH_STATE_DIR"] = str(work / "state")
    env["HOME"] = str(work / "home")
    src = work / "src"
    for name in SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(origin, src / name)
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "dist"), str(src)], work, env)
    assert built.returncode == 0, built.stderr
    (wheel,) = (work / "dist").glob("orch-*.whl")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], work, env)
    assert made.returncode == 0, made.stderr
    py = work / "venv" / "bin" / "python"
    installed = _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)], work, env)
    assert installed.returncode == 0, installed.stderr
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work, env).stdout.strip()
    Path(purelib, "orch-test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    outside = work / "elsewhere"
    outside.mkdir()
    return work / "venv", outside, env


def orch(venv, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    root, cwd, env = venv
    return _run([str(root / "bin" / "orch"), *args], cwd, env, timeout)


def test_the_installed_package_is_the_one_that_runs(venv):
    root, cwd, env = venv
    where = _run([str(root / "bin" / "python"), "-c", "import orchestrator; print(orchestrator.__file__)"], cwd, env)
    assert where.returncode == 0, where.stderr
    path = Path(where.stdout.strip())
    assert path.is_relative_to(root) and not path.is_relative_to(REPO)
    assert (path.parent / "_data" / "runbooks" / "NO_NVLINK.md").is_file()
    assert (path.parent / "_data" / "templates" / "serve-app.yaml.j2").is_file()


def _installed_example(venv, name: str) -> Path:
    root, cwd, env = venv
    out = _run([str(root / "bin" / "python"), "-c", "import orchestrator, pathlib; print(pathlib.Path(orchestrator.__file__).parent)"], cwd, env)
    return Path(out.stdout.strip()) / "_data" / "templates" / name


def test_validate_an_example_shipped_in_the_wheel(venv):
    res = orch(venv, "validate", str(_installed_example(venv, "2x8-h100-405b.yaml")))
    assert res.returncode == 0, res.stderr
    assert "cluster 'llama405' - 2 nodes (1 head, 1 worker), 16 GPUs (H100-80GB), ray :6379" in res.stdout


def test_plan(venv):
    res = orch(venv, "plan", "--model", "llama3-405b", "--gpu-type", "H100-80GB", "--gpus-per-node", "8", "--nodes", "2", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert (data["tp"], data["pp"]) == (8, 2)  # README: Llama 3.1 405B bf16 on 2 x 8 H100 gives TP 8, PP 2


def test_rollout_dry_run_renders_the_packaged_serve_template(venv):
    manifest = _installed_example(venv, "2x8-h100-405b.yaml")
    res = orch(venv, "rollout", "--model", "llama3-405b", "--model-path", "/models/x", "--max-model-len", "8192",
               str(manifest), "--dry-run", "--json", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["action"] == "dry_run:fresh"
    assert data["config"]["import_path"] == "orch_serve_hooks:build_openai_app"  # orch's builder (serve/node_hooks.py)



def test_runbook_is_read_from_the_package(venv):
    res = orch(venv, "runbook", "NO_NVLINK")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (REPO / "runbooks" / "NO_NVLINK.md").read_text()


def test_runbook_lists_and_prints_the_patterns_from_the_package(venv):
    """Issue 25 item 6: the troubleshooting patterns (runbooks/patterns/) reach a pip install."""
    listed = orch(venv, "runbook", "--json")
    assert listed.returncode == 0, listed.stderr
    patterns = {b["code"] for b in json.loads(listed.stdout) if b["kind"] == "pattern"}
    assert patterns == {p.stem for p in (REPO / "runbooks" / "patterns").glob("*.md")}
    res = orch(venv, "runbook", "one-gpu-oom")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (REPO / "runbooks" / "patterns" / "one-gpu-oom.md").read_text()
