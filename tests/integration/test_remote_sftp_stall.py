"""A stalled sftp-server must not block orch forever (issue 12): ``SshRunner.put_file`` gives up
with a typed timeout naming the node and the file.

The server is paramiko's own SSH server on 127.0.0.1, in this process: it runs commands for
real (``mkdir``), but its sftp subsystem is accepted and then never answers, as a hung
sftp-server or a stalled link behaves. No test bed is needed."""

from __future__ import annotations

import socket
import subprocess
import threading

import paramiko
import pytest

from orchestrator.errors import CommandTimeoutError
from orchestrator.remote.ssh import SshRunner

pytestmark = pytest.mark.integration


class _StallingServer(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey) -> None:
        self.client_key = client_key
        self.exec_done = threading.Event()

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if key == self.client_key else paramiko.AUTH_FAILED

    def check_channel_exec_request(self, channel, command):
        def run() -> None:
            out = subprocess.run(["sh", "-c", command.decode()], capture_output=True)
            channel.sendall(out.stdout)
            channel.sendall_stderr(out.stderr)
            channel.send_exit_status(out.returncode)
            channel.close()

        threading.Thread(target=run, daemon=True).start()
        return True

    def check_channel_subsystem_request(self, channel, name):
        return True  # accepted, then silence: the sftp version exchange never comes


@pytest.fixture()
def stalling_host(tmp_path):
    host_key, client_key = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    identity = tmp_path / "id_ecdsa"
    client_key.write_private_key_file(str(identity))
    known = tmp_path / "known_hosts"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(host_key)
            t.start_server(server=_StallingServer(client_key))
            transports.append(t)

    threading.Thread(target=serve, daemon=True).start()
    yield port, identity, known
    listener.close()
    for t in transports:
        t.close()


def test_put_file_times_out_on_a_stalled_sftp_server(stalling_host, tmp_path):
    port, identity, known = stalling_host
    target = tmp_path / "node" / "ray-token"
    errors: list[BaseException] = []

    def put() -> None:
        try:
            r.put_file(str(target), b"s3cret\n", 0o600, timeout=3)
        except BaseException as exc:
            errors.append(exc)

    with SshRunner("gpu7", "127.0.0.1", port=port, known_hosts=known, identity_file=identity, allow_agent=False,
                   connect_timeout=5) as r:  # fmt: skip
        assert r.run(["true"]).exit_code == 0  # commands work: only SFTP is stalled
        worker = threading.Thread(target=put, daemon=True)
        worker.start()
        worker.join(120)  # one generous deadline: before the fix put_file never returned
        assert not worker.is_alive(), "put_file still waits on the stalled sftp-server"
    assert len(errors) == 1 and isinstance(errors[0], CommandTimeoutError)
    err = errors[0]
    assert err.node == "gpu7" and str(target) in err.message and "SFTP" in err.message
    assert target.parent.is_dir() and not target.exists()
