"""Host keys end to end through the CLI: `orch up --check-only` on a test host never seen, then
with --accept-new-host-keys, then after the host's key changed (the issue's "Done when")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed import HostSpec

pytestmark = pytest.mark.integration
ORCH = Path(sys.executable).with_name("orch")


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def orch_check(path: Path, state: Path, *extra: str) -> tuple[int, dict, str]:
    env = dict(os.environ, ORCH_STATE_DIR=str(state))
    p = subprocess.run([str(ORCH), "up", "--check-only", "--json", *extra, str(path)],
                       capture_output=True, text=True, env=env, timeout=300)
    return p.returncode, json.loads(p.stdout), p.stderr


def node_errors(doc: dict) -> dict[str, str]:
    return {f["node"]: f["message"] for f in doc["findings"] if f["severity"] == "fail"}


def test_host_keys_first_contact_and_change_through_orch_up(make_testbed, tmp_path):
    bed = make_testbed([HostSpec("none", name="head")], name="cli-hostkeys")
    host = bed.host("head")
    pub = host.host_key.with_name(host.host_key.name + ".pub")
    kh = tmp_path / "known_hosts"
    path = bed.write_manifest(tmp_path / "cluster.yaml", accelerator="cpu", ssh={"known_hosts": str(kh)})

    # exit 4: remote execution failed, host key included (README's exit codes; issue 25 made every
    # command give it for a node it cannot reach, `orch up` included, where it was 3)
    rc, doc, err = orch_check(path, tmp_path / "state")
    assert rc == 4 and "error:" in err and "Traceback" not in err
    assert "not in" in node_errors(doc)["head"] and fingerprint(pub) in node_errors(doc)["head"]

    rc, doc, err = orch_check(path, tmp_path / "state", "--accept-new-host-keys")
    assert rc == 0, err
    assert kh.read_text().split() == [host.address, *pub.read_text().split()[:2]]

    old = fingerprint(pub)
    bed.regenerate_host_key(host)
    rc, doc, err = orch_check(path, tmp_path / "state", "--accept-new-host-keys")
    assert rc == 4
    msg = node_errors(doc)["head"]
    assert "CHANGED" in msg and old in msg and fingerprint(pub) in msg and "man-in-the-middle" in msg
    assert len(kh.read_text().splitlines()) == 1  # the changed key was not recorded
