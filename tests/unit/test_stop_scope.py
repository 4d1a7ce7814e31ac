"""The stop script of `orch down` (``remote/node_programs/stop_ray.py``) against real processes: it kills
this cluster's processes and their descendants, and leaves alone decoys of another cluster of the
same name (another id, a temp dir that shares a prefix), another user's processes, and reports a
process it may not inspect instead of dying part-way.

Issue 12 reproduced the bugs these tests hold: substring matching killed ~20 processes of a
cluster whose temp dir began with the same text, the name tag was shared by clusters of the same
name, and an AccessDenied killed the script.

Each scenario runs in a PID namespace of its own (``stop_scope_harness.py`` under `unshare`):
the script then sees only the scenario's processes, whatever bug it has (a planted "match
everything" once killed every root process of a shared machine when run outside one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import CLUSTER_ID_ENV, parse_stop, stop_argv
from orchestrator.manifest.load import load_manifest

HARNESS = Path(__file__).with_name("stop_scope_harness.py")
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # runnable by every user (the venv's interpreter lives under /root)
READY_SLEEP = "import time; print('ready', flush=True); time.sleep(300)"
SPAWNER = ("import subprocess, sys, time\n"
           "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], env={})\n"
           "print(p.pid, flush=True); print('ready', flush=True); time.sleep(300)")  # fmt: skip


@pytest.fixture(autouse=True)
def _namespaces():
    if os.getuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root with util-linux: the stop-scope scenarios must run")
        pytest.skip("needs root and unshare: the stop script is only ever run inside a PID namespace here")


def _manifest(name: str, temp: str):
    return load_manifest(f"name: {name}\nnodes: [{{name: a, host: 1.2.3.4, role: head, gpus: 1}}]\n"
                         f"ray: {{temp_dir: {temp}}}\n", Path("/x/c.yaml"))  # fmt: skip


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}


def _scenario(stop: list[str], procs: dict, run_as: int | None = None, run_env: dict | None = None) -> dict:
    spec = {"stop_argv": stop, "procs": procs, "run_as": run_as, "run_env": run_env}
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(HARNESS), json.dumps(spec)],
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["returncode"] == 0, result["stderr"]
    result["report"] = parse_stop(result["stdout"])
    return result


def _stop(name: str, temp: str, cid: str | None, python: str = sys.executable) -> list[str]:
    m = _manifest(name, temp)
    argv = stop_argv(m, m.head, cid)
    argv[0] = python
    return argv


def test_stop_kills_this_cluster_and_spares_decoys_of_another():
    name = f"stop-{uuid.uuid4().hex[:6]}"
    cid, other_id = uuid.uuid4().hex[:16], uuid.uuid4().hex[:16]
    temp = f"/tmp/{name}"  # never created: only named on command lines
    base = _base_env()

    def py(*args: str, env: dict | None = None, code: str = READY_SLEEP) -> dict:
        return {"argv": [sys.executable, "-c", code, *args], "env": {**base, **(env or {})}}

    ours = {
        "tagged": py(env={CLUSTER_ID_ENV: cid}),
        "--temp-dir=T": py(f"--temp-dir={temp}"),
        "--temp_dir T/": py("--temp_dir", temp + "/"),
        "--session_dir=T/session": py(f"--session_dir={temp}/session_2026"),
        "tagged spawner": py(env={CLUSTER_ID_ENV: cid}, code=SPAWNER),  # + its untagged child
    }
    decoys = {
        # another cluster of the same name (another control machine): other id, same ORCH_CLUSTER
        "same name, other id": py(env={"ORCH_CLUSTER": name, CLUSTER_ID_ENV: other_id}),
        # a temp dir that merely starts with ours (/tmp/orch vs /tmp/orch-overhead-...)
        "similar temp dir": py(f"--temp-dir={temp}-other"),
        "similar session dir": py(f"--session_dir={temp}-other/session_2026"),
        "similar temp, split": py("--temp-dir", temp + "x"),
        # someone reading our logs is not ours to kill (a bare argument, not an option's value)
        "reads our logs": py(f"{temp}/session_latest/logs/raylet.out"),
        "untagged": py(),
    }
    result = _scenario(_stop(name, temp, cid), {**ours, **decoys})
    report = result["report"]
    assert report["alive"] == [] and report["denied"] == {}
    assert report["killed"] == len(ours) + 1
    killed = [label for label, up in result["alive"].items() if not up]
    assert sorted(killed) == sorted([*ours, "tagged spawner/child"])


def test_stop_without_a_recorded_id_matches_the_temp_dir_only():
    cid = uuid.uuid4().hex[:16]
    temp = f"/tmp/stop-{uuid.uuid4().hex[:6]}"
    base = _base_env()
    procs = {
        "tagged": {"argv": [sys.executable, "-c", READY_SLEEP], "env": {**base, CLUSTER_ID_ENV: cid}},
        "marked": {"argv": [sys.executable, "-c", READY_SLEEP, f"--temp-dir={temp}"], "env": base},
    }
    result = _scenario(_stop("c", temp, None), procs)
    assert result["report"]["killed"] == 1 and result["alive"] == {"tagged": True, "marked": False}


def test_stop_spares_another_users_processes():
    """Run as root, the script leaves another user's tagged, temp-dir-naming process alone."""
    cid = uuid.uuid4().hex[:16]
    temp = f"/tmp/stop-{uuid.uuid4().hex[:6]}"
    procs = {
        "theirs": {"argv": [SYSTEM_PYTHON, "-c", READY_SLEEP, f"--temp-dir={temp}"],
                   "env": {"PATH": "/usr/bin:/bin", CLUSTER_ID_ENV: cid}, "user": NOBODY},  # fmt: skip
        "mine": {"argv": [sys.executable, "-c", READY_SLEEP], "env": {**_base_env(), CLUSTER_ID_ENV: cid}},
    }
    result = _scenario(_stop("c", temp, cid), procs)
    assert result["report"]["killed"] == 1 and result["alive"] == {"theirs": True, "mine": False}


@pytest.fixture()
def shared_lib():
    """psutil where every user can import it (pytest's tmp_path of root is 0700)."""
    import psutil

    d = Path(tempfile.mkdtemp(prefix="orch-stop-"))
    shutil.copytree(Path(psutil.__file__).parent, d / "psutil")
    for root, _dirs, files in os.walk(d):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_stop_reports_a_process_it_may_not_inspect(shared_lib):
    """As an unprivileged user: one of its own processes made non-dumpable (its /proc environ
    then belongs to root) cannot be checked for the tag. The script reports it (``denied``) and
    finishes the rest, instead of dying on psutil.AccessDenied part-way."""
    cid = uuid.uuid4().hex[:16]
    temp = f"/tmp/stop-{uuid.uuid4().hex[:6]}"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shared_lib), CLUSTER_ID_ENV: cid}
    undumpable = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n" + READY_SLEEP  # PR_SET_DUMPABLE 0
    procs = {
        "hidden": {"argv": [SYSTEM_PYTHON, "-c", undumpable], "env": env, "user": NOBODY},
        "plain": {"argv": [SYSTEM_PYTHON, "-c", READY_SLEEP], "env": env, "user": NOBODY},
    }
    run_env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shared_lib)}
    result = _scenario(_stop("c", temp, cid, python=SYSTEM_PYTHON), procs, run_as=NOBODY, run_env=run_env)
    assert result["report"]["denied"] == {result["pids"]["hidden"]: "cannot read its environment"}
    assert result["report"]["killed"] == 1 and result["alive"] == {"hidden": True, "plain": False}
