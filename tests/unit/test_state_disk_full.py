"""A full disk under orch's state gives an error that names the file and the filesystem, exit 5
(issue 12: SQLite's "cannot rollback - no transaction is active" or a raw OSError before).

The disk is a real one: a 1 MiB tmpfs mounted in a mount namespace of its own (`unshare
--mount`), so nothing outside the test sees it. The state is used in a child Python there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Runs inside the namespace: argv[1] = the mount point. Records a cluster while there is room,
# fills the disk, then tries each kind of write and reports what was raised.
SCENARIO = r"""
import json, os, sys
from pathlib import Path
from orchestrator.errors import OrchError
from orchestrator.state import StateStore
disk = Path(sys.argv[1])
os.makedirs(disk, exist_ok=True)
assert os.system(f"mount -t tmpfs -o size=1m orchtest {disk}") == 0
store = StateStore(disk / "state")
store.record_cluster("c", "fp", "10.0.0.1", 8265)
fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # every free block
try:
    while True:
        os.write(fd, b"x" * 4096)
except OSError:
    pass
os.close(fd)
out = {}
for what, write in (
    ("add_revision", lambda: store.add_revision("c", "m", config={"k": "v" * 200_000})),
    ("ensure_token", lambda: store.ensure_token("c", lambda: "t" * 64)),
    ("save_facts", lambda: store.save_facts("c", {"n": {"x": "y" * 100_000}})),
):
    try:
        write()
        out[what] = None
    except OrchError as exc:
        out[what] = {"type": type(exc).__name__, "exit_code": exc.exit_code, "message": exc.message, "hint": exc.hint}
out["token_left"] = store.token_path("c").exists() or store.token_path("c").with_name("ray-token.tmp").exists()
print(json.dumps(out))
"""


def test_full_disk_is_named_with_the_file_and_exits_5(tmp_path):
    if os.getuid() != 0 or shutil.which("unshare") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root with util-linux: the full-disk case must run")
        pytest.skip("needs root to mount a small filesystem in a mount namespace")
    disk = tmp_path / "disk"
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SCENARIO, str(disk)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for what, file in (("add_revision", "state.db"), ("ensure_token", "ray-token"), ("save_facts", "facts.json")):
        err = out[what]
        assert err is not None, f"{what} wrote on a full disk?"
        assert err["type"] == "DiskFullError" and err["exit_code"] == 5, err
        assert file in err["message"] and f"mounted at {disk}" in err["message"], err["message"]
        assert "cannot rollback" not in err["message"] and str(disk) in err["hint"]
    assert out["token_left"] is False  # no partial secret file
