"""The SSH runner against real test hosts (network namespaces with their own sshd).

Each test asserts what a user of orch sees: the result of a command, or a typed error that
names the node (and, for host keys, both fingerprints).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from orchestrator.errors import (
    AuthenticationError,
    CommandTimeoutError,
    HostKeyChangedError,
    HostKeyUnknownError,
    UnreachableError,
)
from orchestrator.remote.connect import open_runners
from orchestrator.remote.runner import fan_out
from orchestrator.remote.ssh import SshRunner
from tests.testbed import HostSpec
from tests.wait import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(testbed_factory):
    """Four hosts of different kinds; tests that break a host repair it before they end."""
    bed = testbed_factory.make(
        [
            HostSpec("8xH100-80GB", name="h100", nics=("ib0",), shm_size="256m"),
            HostSpec("4xA100-40GB", name="a100", versions={"ray": "2.59.0"}),
            HostSpec("none", name="cpu", ssh_port=2222),
            HostSpec("mig", name="mig"),
        ],
        name="remote-tests",
    )
    yield bed
    bed.close()


def runner(bed, name: str, **kw) -> SshRunner:
    h = bed.host(name)
    opts = dict(known_hosts=bed.known_hosts, identity_file=bed.identity_file, allow_agent=False, connect_timeout=5)
    opts.update(kw)
    return SshRunner(h.name, h.address, port=h.ssh_port, **opts)


def fingerprint_by_ssh_keygen(pub: Path) -> str:
    """The fingerprint as OpenSSH computes it (independent of orch's code)."""
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_command_stdout_stderr_exit_code_and_env(bed):
    with runner(bed, "h100") as r:
        res = r.run(["sh", "-c", 'printf "%s|%s" "$GREETING" "$1"; echo oops >&2; exit 3', "sh", "a b"],
                    env={"GREETING": "it's $HOME; `x`"})
    assert res.exit_code == 3
    assert res.stdout == "it's $HOME; `x`|a b"  # quoted once: nothing expanded by the node's shell
    assert res.stderr == "oops\n"
    assert res.argv[0] == "sh"


def test_env_values_never_appear_on_a_command_line(bed):
    """A secret of the manifest's env (HF_TOKEN) reaches the command but no process's command
    line on the node (any user reads those in `ps`); its 0600 file is gone afterwards."""
    secret = f"hf_{uuid.uuid4().hex}"
    code = "import os, time; print(os.environ['HF_TOKEN'], flush=True); time.sleep(4)"
    lines: list[str] = []
    with runner(bed, "cpu") as r:
        worker = threading.Thread(target=lambda: lines.append(r.run(["python3", "-c", code], env={"HF_TOKEN": secret}).stdout))
        worker.start()
        seen_running = False
        for _ in range(200):  # while it runs: every command line on the host
            ps = bed.ns_exec("cpu", ["ps", "-eo", "args"]).stdout
            assert secret not in ps
            if "print(os.environ['HF_TOKEN']" in ps:
                seen_running = True
                break
            time.sleep(0.05)
        worker.join(60)
        home = r.run(["printenv", "HOME"]).stdout.strip()
        left = r.run(["sh", "-c", 'ls -A "$1" 2>/dev/null', "sh", f"{home}/.orch/env"]).stdout.split()
        mode = r.run(["stat", "-c", "%a", f"{home}/.orch/env"]).stdout.strip()
    assert seen_running and lines == [secret + "\n"]
    assert left == [] and mode == "700"


def test_connection_is_reused_by_every_command_of_a_runner(bed):
    with runner(bed, "a100") as r:
        first = r.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()
        second = r.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()
    assert first[1] == second[1]  # same client port: one TCP connection


def test_a_dropped_connection_is_reopened_for_the_next_command(bed):
    with runner(bed, "mig") as r:
        first = r.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[1]
        # Kill the session's sshd process on the node (as a reboot or sshd restart would).
        bed.ns_exec("mig", ["pkill", "-f", "sshd: root@notty"])
        second = r.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[1]
    assert first != second  # a new TCP connection, and the command still ran


def test_big_outputs_on_both_streams_do_not_deadlock(bed):
    code = "import sys\nfor _ in range(40): sys.stdout.write('o' * 50000); sys.stderr.write('e' * 50000)"
    with runner(bed, "h100") as r:
        res = r.run(["python3", "-c", code], timeout=60)
    assert res.exit_code == 0
    assert (len(res.stdout), len(res.stderr)) == (2_000_000, 2_000_000)


def test_command_timeout_is_typed_and_the_remote_process_is_stopped(bed):
    marker = "4242.5"  # an unusual sleep length to find the process by
    with runner(bed, "h100") as r:
        with pytest.raises(CommandTimeoutError) as info:  # not the 4242 s of the command
            r.run(["sleep", marker], timeout=1)
        assert "h100" in str(info.value) and f"sleep {marker}" in str(info.value)
        assert info.value.node == "h100"
        # The same connection still runs commands after a timeout.
        assert r.run(["true"]).exit_code == 0
    # the node's `timeout` stops it a few seconds later (pgrep exits 1: no such process)
    wait_until(lambda: bed.ns_exec("h100", ["pgrep", "-f", f"slee[p] {marker}"], check=False).returncode == 1,
               what="the timed-out command to stop on the node", timeout=30)  # fmt: skip


def test_refused_connection_names_the_node(bed):
    bed.stop_sshd("a100")
    try:
        with pytest.raises(UnreachableError) as info:
            runner(bed, "a100").run(["true"])
        msg = str(info.value)
        assert "a100" in msg and bed.host("a100").address in msg and "refused" in msg
        assert info.value.hint
    finally:
        bed.start_sshd("a100")
    assert runner(bed, "a100").run(["true"]).exit_code == 0


def test_address_without_a_host_is_unreachable(bed):
    empty = bed.host("h100").address.rsplit(".", 1)[0] + ".250"  # on the bridge, nobody there
    with pytest.raises(UnreachableError) as info:
        SshRunner("ghost", empty, known_hosts=bed.known_hosts, identity_file=bed.identity_file,
                  allow_agent=False, connect_timeout=5).run(["true"])
    assert info.value.node == "ghost" and empty in str(info.value)


def test_wrong_key_is_an_authentication_error(bed, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(AuthenticationError) as info:
        runner(bed, "h100", identity_file=other).run(["true"])
    assert "h100" in str(info.value) and str(other) in str(info.value)
    with pytest.raises(AuthenticationError, match="does not exist"):
        runner(bed, "h100", identity_file=tmp_path / "missing").run(["true"])


def test_agent_authentication(bed, tmp_path, monkeypatch):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, what="ssh-agent's socket", timeout=30)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no default keys: only the agent can log in
        with pytest.raises(AuthenticationError):
            runner(bed, "a100", identity_file=None, allow_agent=True).run(["true"])  # agent still empty
        subprocess.run(["ssh-add", "-q", str(bed.identity_file)], check=True, env={"SSH_AUTH_SOCK": str(sock)})
        with runner(bed, "a100", identity_file=None, allow_agent=True) as r:
            assert r.run(["whoami"]).stdout == "root\n"
    finally:
        agent.kill()
        agent.wait()


def test_unknown_host_is_refused_then_accepted_and_recorded(bed, tmp_path):
    kh = tmp_path / "known_hosts"
    host = bed.host("cpu")  # port 2222: recorded as [host]:2222
    with pytest.raises(HostKeyUnknownError) as info:
        runner(bed, "cpu", known_hosts=kh).run(["true"])
    pub = host.host_key.with_name(host.host_key.name + ".pub")
    assert "cpu" in str(info.value) and fingerprint_by_ssh_keygen(pub) in str(info.value)
    assert "--accept-new-host-keys" in info.value.hint
    assert not kh.exists() or kh.read_text() == ""

    r = runner(bed, "cpu", known_hosts=kh, accept_new_host_keys=True)
    assert r.run(["true"]).exit_code == 0
    r.close()
    line = kh.read_text().strip()
    assert line.split() == [f"[{host.address}]:2222", *pub.read_text().split()[:2]]
    assert r.accepted_new_key == fingerprint_by_ssh_keygen(pub)
    # OpenSSH itself accepts the recorded line, and orch now connects without the flag.
    ssh = ["ssh", "-p", "2222", "-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={kh}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{host.address}", "true"]
    assert subprocess.run(ssh, capture_output=True, timeout=30).returncode == 0
    assert runner(bed, "cpu", known_hosts=kh).run(["true"]).exit_code == 0


def test_hashed_known_hosts_entry_is_written_and_honoured(bed, tmp_path):
    kh = tmp_path / "known_hosts"
    runner(bed, "mig", known_hosts=kh, accept_new_host_keys=True, hash_known_hosts=True).run(["true"])
    text = kh.read_text()
    assert text.startswith("|1|") and bed.host("mig").address not in text
    found = subprocess.run(["ssh-keygen", "-F", bed.host("mig").address, "-f", str(kh)], capture_output=True)
    assert found.returncode == 0  # OpenSSH finds the hashed entry
    assert runner(bed, "mig", known_hosts=kh).run(["true"]).exit_code == 0


def test_changed_host_key_is_refused_naming_node_and_both_fingerprints(make_testbed, tmp_path):
    small = make_testbed([HostSpec("8xH100-80GB", name="gpu7")], name="changed-key")
    host = small.host("gpu7")
    pub = host.host_key.with_name(host.host_key.name + ".pub")
    old_fp = fingerprint_by_ssh_keygen(pub)
    kh = tmp_path / "known_hosts"
    opts = dict(known_hosts=kh, identity_file=small.identity_file, allow_agent=False)
    SshRunner("gpu7", host.address, accept_new_host_keys=True, **opts).run(["true"])

    small.regenerate_host_key(host)
    new_fp = fingerprint_by_ssh_keygen(pub)
    assert new_fp != old_fp
    for accept in (False, True):  # the accept flag never overrides a changed key
        with pytest.raises(HostKeyChangedError) as info:
            SshRunner("gpu7", host.address, accept_new_host_keys=accept, **opts).run(["true"])
        msg = str(info.value)
        assert "gpu7" in msg and f"{host.address}:22" in msg
        assert old_fp in msg and new_fp in msg
        assert "man-in-the-middle" in msg
        assert "ssh-keygen -R" in info.value.hint
    assert len(kh.read_text().splitlines()) == 1  # nothing was recorded


def test_put_file_writes_atomically_with_mode(bed):
    target = bed.dir / "put" / "ray-token"
    with runner(bed, "h100") as r:
        r.put_file(str(target), b"s3cret\n", 0o600)
        res = r.run(["stat", "-c", "%a %s", str(target)])
    assert res.stdout.split() == ["600", "7"]
    assert target.read_bytes() == b"s3cret\n"


def test_forward_reaches_a_port_bound_to_the_hosts_loopback(bed):
    h = bed.host("h100")
    port = 18265
    server = subprocess.Popen(
        h.ns_exec + [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(h.bin_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        with runner(bed, "h100") as r:
            connect = ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}))"]
            wait_until(lambda: r.run(connect).ok, what=f"the http.server on the host's 127.0.0.1:{port}", timeout=60)
            local = r.forward("127.0.0.1", port)
            body = urllib.request.urlopen(f"http://127.0.0.1:{local}/gpus.json", timeout=10).read()
            assert b"NVIDIA H100 80GB HBM3" in body
            # Issue 12: the SSH connection under the tunnel drops (sshd restarted, a network
            # blip); the next connection through the same local port re-dials instead of failing
            # until orch exits.
            dropped = r._client.get_transport()
            dropped.close()
            body = urllib.request.urlopen(f"http://127.0.0.1:{local}/gpus.json", timeout=10).read()
            assert b"NVIDIA H100 80GB HBM3" in body and r._client.get_transport() is not dropped
        with pytest.raises(OSError):  # closed with the runner
            urllib.request.urlopen(f"http://127.0.0.1:{local}/gpus.json", timeout=2)
    finally:
        server.kill()
        server.wait()


def test_stand_in_nvidia_smi_matches_each_profile(bed):
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,mig.mode.current", "--format=csv,noheader,nounits"]
    expected = {"h100": (8, "NVIDIA H100 80GB HBM3", "81559"), "a100": (4, "NVIDIA A100-PCIE-40GB", "40960"),
                "mig": (1, "NVIDIA A100-PCIE-40GB", "40960")}
    for name, (count, gpu, mem) in expected.items():
        with runner(bed, name) as r:
            res = r.run(query)
            topo = r.run(["nvidia-smi", "topo", "-m"]).stdout
        rows = [row.split(", ") for row in res.stdout.splitlines()]
        assert len(rows) == count
        assert [row[0] for row in rows] == [str(i) for i in range(count)]
        assert {row[1] for row in rows} == {gpu} and {row[2] for row in rows} == {mem}
        assert ("NV18" in topo) == (name == "h100")
    assert rows[0][3] == "Enabled"  # the mig host
    with runner(bed, "cpu") as r:
        assert r.run(query).exit_code == 127  # no nvidia-smi at all on a CPU host


def test_hosts_differ_in_nics_shm_and_installed_versions(bed):
    with runner(bed, "h100") as r:
        assert bed.host("h100").ib_address in r.run(["ip", "-br", "addr", "show", "ib0"]).stdout
        assert r.run(["df", "--output=size", "-B1M", "/dev/shm"]).stdout.split()[-1] == "256"
    version = ["python3", "-c", "import importlib.metadata as m, ray; print(m.version('ray'), ray.__version__)"]
    with runner(bed, "a100") as r:
        venv = r.run([sys.executable] + version[1:])
        assert venv.stdout.split() == ["2.59.0", "2.59.0"]  # a real ray 2.59.0 installed for this host
        missing = r.run(["ip", "link", "show", "ib0"])  # this host has no InfiniBand link
        assert (missing.exit_code, missing.stderr.strip()) == (1, 'Device "ib0" does not exist.')
    with runner(bed, "mig") as r:
        assert r.run([sys.executable] + version[1:]).stdout.split() == ["2.60.0", "2.60.0"]


def test_manifest_of_the_bed_opens_runners_for_every_node(bed):
    from orchestrator.manifest.load import load_manifest

    manifest = load_manifest(bed.manifest_yaml(name="tb"), bed.dir / "cluster.yaml")
    with open_runners(manifest, known_hosts=bed.dir / "unused") as runners:
        outcomes = fan_out(runners.values(), lambda r: r.run(["hostname", "-I"]).stdout.split())
    assert [o.node for o in outcomes] == [h.name for h in bed.hosts]
    assert all(o.ok for o in outcomes)
    assert [o.value[0] for o in outcomes] == [h.address for h in bed.hosts]


def test_fan_out_to_eight_hosts_with_one_dropping_packets(make_testbed):
    eight = make_testbed([HostSpec("8xH100-80GB", name=f"n{i}") for i in range(8)], name="fanout")
    dead = eight.host("n5")
    eight.drop_all(dead)
    timeout = 3.0
    runners = [
        SshRunner(h.name, h.address, known_hosts=eight.known_hosts, identity_file=eight.identity_file,
                  allow_agent=False, connect_timeout=timeout)
        for h in eight.hosts
    ]
    outcomes = fan_out(runners, lambda r: r.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]).stdout)
    for r in runners:
        r.close()
    assert [o.node for o in outcomes] == [f"n{i}" for i in range(8)]
    good = [o for o in outcomes if o.ok]
    assert len(good) == 7 and all(o.value.split() == [str(i) for i in range(8)] for o in good)
    bad = outcomes[5]
    assert isinstance(bad.error, UnreachableError) and bad.error.node == "n5"
    assert dead.address in str(bad.error) and "3s" in str(bad.error)  # it gave up after its connect timeout
