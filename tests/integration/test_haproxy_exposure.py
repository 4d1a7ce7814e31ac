"""HAProxy on the served test-bed cluster (issue 12): its admin socket (`mode 666 level admin` in
Ray 2.60's template) is out of other users' reach, and what it listens on beyond loopback is the
Serve port plus exactly the two ports Ray offers no bind setting for, which `orch status` names.

Reads the running shared served app (tests/fixtures/serving.py); changes nothing."""

from __future__ import annotations

import json
import re
import stat

import pytest

from orchestrator.cli import main
from orchestrator.cluster.exposure import haproxy_public_ports
from orchestrator.cluster.ray_nodes import haproxy_dir

pytestmark = [pytest.mark.integration, pytest.mark.ray]

LOOPBACK = re.compile(r"^(127\.|\[::1\]|::1)")


def _haproxy_listeners(bed, host) -> tuple[set[tuple[str, int]], list[str]]:
    """(TCP (address, port) pairs, unix socket paths) that haproxy processes listen on."""
    tcp = set()
    for line in bed.ns_exec(host, ["ss", "-H", "-ltnp"]).stdout.splitlines():
        if '"haproxy"' in line:
            local = line.split()[3]
            addr, _, port = local.rpartition(":")
            tcp.add((addr, int(port)))
    # named (filesystem) sockets only: unnamed ones show as "*"; HAProxy binds "<path>.<pid>.tmp"
    # and renames it, so ss may show either name
    unix = [line.split()[4] for line in bed.ns_exec(host, ["ss", "-H", "-xlp"]).stdout.splitlines() if '"haproxy"' in line]
    return tcp, [p for p in unix if p.startswith("/")]


def test_haproxy_admin_socket_is_private_and_only_known_ports_are_public(served_tiny, capsys):
    s = served_tiny
    manifest = s.manifest
    bed = s.cluster.bed
    public = haproxy_public_ports(manifest)
    checked = 0
    for h in bed.hosts:
        tcp, unix = _haproxy_listeners(bed, h)
        if not tcp:
            continue  # no Serve proxy on this node
        checked += 1
        # the admin socket: under the cluster's private folder, never Ray's /tmp/haproxy-serve
        folder = haproxy_dir(manifest.ray.temp_dir)
        assert unix and all(p.startswith(folder + "/") for p in unix), unix
        mode = stat.S_IMODE(int(bed.ns_exec(h, ["stat", "-c", "%a", folder]).stdout.strip(), 8))
        assert mode == 0o700, oct(mode)
        # another user can write to no socket there (the folder, not the socket's mode 666, protects it)
        sockets = bed.ns_exec(h, ["find", folder, "-type", "s"]).stdout.split()
        assert any(p.endswith("/a") for p in sockets), sockets  # the admin socket is among them
        for path in sockets:
            reach = bed.ns_exec(h, ["runuser", "-u", "nobody", "--", "test", "-w", path], check=False)
            assert reach.returncode != 0, path
        # beyond loopback: the Serve port, and the stats/metrics ports Ray binds to every address
        outside = {port for addr, port in tcp if not LOOPBACK.match(addr)}
        stats, metrics = public[h.name]
        assert outside <= {manifest.serve.http_port, stats, metrics}, outside
        assert manifest.serve.http_port in outside
    assert checked >= 1
    # what orch cannot close it says: `orch status` names those very ports
    assert main(s.cluster.cli("status", s.manifest_path, "--json")) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert any(f"port {stats}" in w and f"port {metrics}" in w for w in warnings)
