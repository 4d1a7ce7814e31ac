"""connect()/open_runners(): the adapter each node gets, and that every runner is closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.manifest.load import load_manifest
from orchestrator.remote.connect import connect, open_runners
from orchestrator.remote.local import LocalRunner
from orchestrator.remote.ssh import SshRunner

YAML = """
name: mixed
accelerator: cpu
ssh: {user: deploy, port: 2200, identity_file: keys/id, connect_timeout: 4}
nodes:
  - {name: here, host: 127.0.0.1, role: head, transport: local}
  - {name: w1, host: 10.1.0.2, port: 22, user: root}
  - {name: w2, host: 10.1.0.3}
"""


@pytest.fixture
def manifest(tmp_path):
    return load_manifest(YAML, tmp_path / "cluster.yaml")


def test_connect_picks_the_adapter_and_the_ssh_settings(manifest, tmp_path):
    kh = tmp_path / "known_hosts"
    assert isinstance(connect(manifest, "here", kh), LocalRunner)
    w1 = connect(manifest, "w1", kh, accept_new_host_keys=True)
    assert isinstance(w1, SshRunner)
    assert (w1.node, w1.host, w1.port, w1.user, w1.connect_timeout) == ("w1", "10.1.0.2", 22, "root", 4)
    assert w1.accept_new_host_keys and w1.known_hosts == kh
    assert w1.identity_file == tmp_path / "keys" / "id"
    w2 = connect(manifest, manifest.nodes[2], kh)
    assert (w2.port, w2.user, w2.accept_new_host_keys) == (2200, "deploy", False)
    with pytest.raises(KeyError, match="nope"):
        connect(manifest, "nope", kh)


def test_manifest_known_hosts_wins_over_the_default(tmp_path):
    m = load_manifest(YAML.replace("connect_timeout: 4", "connect_timeout: 4, known_hosts: kh"), tmp_path / "c.yaml")
    assert connect(m, "w1", Path("/elsewhere")).known_hosts == tmp_path / "kh"


def test_open_runners_closes_every_runner_even_on_error(manifest, tmp_path, monkeypatch):
    closed = []
    monkeypatch.setattr(SshRunner, "close", lambda self: closed.append(self.node))
    with pytest.raises(RuntimeError):
        with open_runners(manifest, tmp_path / "kh") as runners:
            assert list(runners) == ["here", "w1", "w2"]
            raise RuntimeError("boom")
    assert closed == ["w1", "w2"]
    with open_runners(manifest, tmp_path / "kh", nodes=["w2"]) as runners:
        assert list(runners) == ["w2"]
    with pytest.raises(KeyError):
        with open_runners(manifest, tmp_path / "kh", nodes=["ghost"]):
            pass
