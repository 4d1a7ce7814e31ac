"""`orch dashboard` on the session's Ray test bed cluster (issue 25 item 11): the command opens an
SSH tunnel to the head's dashboard (which listens on the head's 127.0.0.1 only), prints the local
URL and where the token is, and keeps the tunnel open until Ctrl-C (exit 0). Through that URL the
real dashboard answers with the cluster's token and refuses a request without it. Reuses
``ray_testbed_cluster``: no Ray start and no engine start of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from orchestrator.cluster.dashboard import DashboardClient
from orchestrator.state import StateStore
from tests.signals import sigint_default

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def test_the_tunnel_reaches_the_dashboard_until_ctrl_c(ray_testbed_cluster):
    c = ray_testbed_cluster
    argv = [sys.executable, "-m", "orchestrator", *c.cli("dashboard", c.manifest_path, "--json")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
                            preexec_fn=sigint_default)  # fmt: skip
    try:
        line = proc.stdout.readline()  # printed once the tunnel answered (the command then waits)
        assert line, proc.stderr.read()
        shown = json.loads(line)
        name = c.manifest.name
        token_path = StateStore(c.state_dir).token_path(name)
        assert shown["cluster"] == name and shown["head"] == "host0"
        assert shown["token_file"] == str(token_path)
        assert shown["url"].startswith("http://127.0.0.1:")
        token = token_path.read_text().strip()
        assert token not in line  # the token is named, never printed
        with c.dashboard() as direct:
            assert shown["ray_version"] == direct.ray_version()
        # the URL is the head's real dashboard: the cluster's nodes with the token, 401 without it
        with DashboardClient(shown["url"], token) as through:
            assert {n.name for n in through.nodes() if n.alive} == {"host0", "host1", "host2"}
        assert httpx.get(shown["url"] + "/api/v0/nodes", timeout=10).status_code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
