"""Issue 25 item 12: `orch completion SHELL` (click's own mechanism, `_ORCH_COMPLETE`) and
`orch clusters` (the clusters orch's state knows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orchestrator.cli import main
from orchestrator.state import StateStore
from tests.cli.unreachable import REPO, orch_env


def _orch(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, timeout=120,
                          env=orch_env(tmp_path, **env), cwd=tmp_path)  # fmt: skip


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_own_script(tmp_path, shell):
    printed = _orch(tmp_path, "completion", shell)
    assert printed.returncode == 0, printed.stderr
    # the script click makes for `_ORCH_COMPLETE=<shell>_source orch` (the program's name is orch:
    # the console script; here it runs as python -m, so the variable is read under that name)
    from click.shell_completion import get_completion_class

    from orchestrator.cli import cli

    assert printed.stdout == get_completion_class(shell)(cli, {}, "orch", "_ORCH_COMPLETE").source() + "\n"
    assert "_ORCH_COMPLETE" in printed.stdout


def test_the_shell_asks_and_orch_answers_with_commands_and_options(tmp_path):
    ask = _orch(tmp_path, _ORCH_COMPLETE="bash_complete", COMP_WORDS="orch pl", COMP_CWORD="1")
    assert ask.stdout.split() == ["plain,plan"]
    ask = _orch(tmp_path, _ORCH_COMPLETE="bash_complete", COMP_WORDS="orch model s", COMP_CWORD="2")
    assert ask.stdout.split() == ["plain,sync"]
    ask = _orch(tmp_path, _ORCH_COMPLETE="bash_complete", COMP_WORDS="orch completion ", COMP_CWORD="2")
    assert ask.stdout.split() == ["plain,bash", "plain,zsh", "plain,fish"]


def test_bash_completes_through_the_printed_script(tmp_path):
    """The script as bash runs it: sourced, then asked for `orch ro<TAB>` the way bash's
    completion calls the function (an `orch` on PATH that is this checkout)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "orch").write_text(f"#!/bin/sh\nexec {sys.executable} -m orchestrator \"$@\"\n")
    (bindir / "orch").chmod(0o755)
    env = orch_env(tmp_path, PATH=f"{bindir}:{os.environ['PATH']}")
    script = (
        'eval "$(orch completion bash)"\n'
        "COMP_WORDS=(orch ro); COMP_CWORD=1\n"
        "_orch_completion orch\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["rollout", "rollback"]


def test_clusters_lists_what_the_state_knows(tmp_path, capsys):
    state_dir = tmp_path / "state"
    assert main(["--state-dir", str(state_dir), "clusters"]) == 0
    assert capsys.readouterr().out == f"no cluster is recorded in {state_dir}; `orch up CLUSTER_YAML` starts one\n"
    store = StateStore(state_dir, clock=lambda: 1_700_000_000.0)
    store.record_cluster("alpha", "f1", "10.0.0.1:6379", 8265, manifest_path="/etc/orch/alpha.yaml")
    store.record_cluster("beta", "f2", "10.0.0.9:6379", 8265, manifest_path=None, state="down")
    store.add_revision("alpha", "tiny", status="ready")
    # beta served a model until `orch down` stopped it: its revision is still recorded as ready,
    # but nothing runs there, so it is not listed as serving (issue 46)
    store.add_revision("beta", "small", status="ready")
    assert main(["--state-dir", str(state_dir), "clusters", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [
        {"name": "alpha", "state": "up", "serving": {"revision": 1, "model": "tiny", "status": "ready"}, "last_served": None,
         "head": "10.0.0.1:6379", "manifest": "/etc/orch/alpha.yaml", "updated": "2023-11-14T22:13:20+00:00"},
        {"name": "beta", "state": "down", "serving": None, "last_served": {"revision": 1, "model": "small", "status": "ready"},
         "head": "10.0.0.9:6379", "manifest": None, "updated": "2023-11-14T22:13:20+00:00"},
    ]  # fmt: skip
    assert main(["--state-dir", str(state_dir), "clusters"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "cluster  state  serving                    head           manifest",
        "alpha    up     r1 tiny (ready)            10.0.0.1:6379  /etc/orch/alpha.yaml",
        "beta     down   - (was r1 small; stopped)  10.0.0.9:6379  (recorded manifest)",
    ]
    assert "ready" not in out.splitlines()[2]
