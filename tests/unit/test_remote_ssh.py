"""The pure parts of the SSH adapter: the command string, fingerprints, known_hosts decisions.
(Against real sshd: tests/integration/test_remote_testbed.py.)"""

from __future__ import annotations

import shlex
import subprocess

import paramiko
import pytest

from orchestrator.errors import HostKeyChangedError, HostKeyUnknownError, KnownHostsError
from orchestrator.remote import known_hosts as kh
from orchestrator.remote.ssh import env_file_text, remote_command


def test_remote_command_quotes_once_and_sources_the_env_file():
    cmd = remote_command(["python3", "-c", "print('a b'); x=$HOME"], 10, "/home/ops/.orch/env/x.env")
    assert shlex.split(cmd) == [
        "timeout", "--kill-after=5", "12",
        "sh", "-c", '. "$1" || exit 125; shift; exec "$@"', "sh", "/home/ops/.orch/env/x.env",
        "python3", "-c", "print('a b'); x=$HOME",
    ]  # fmt: skip
    assert shlex.split(remote_command(["true"], 0.2)) == ["timeout", "--kill-after=5", "3", "true"]


def test_env_file_is_sourced_by_sh_with_values_unexpanded(tmp_path):
    """No value reaches the command line; the file gives the command exactly the values."""
    env = {"HF_TOKEN": "hf_s3cr3t", "V": "it's $HOME; `id`\nline2", "EMPTY": ""}
    f = tmp_path / "e.env"
    f.write_text(env_file_text(env))
    cmd = remote_command(["sh", "-c", 'printf "%s|%s|%s" "$HF_TOKEN" "$V" "$EMPTY"'], 10, str(f))
    assert "hf_s3cr3t" not in cmd
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == "hf_s3cr3t|it's $HOME; `id`\nline2|"


@pytest.mark.parametrize("bad", ["", "1X", "A-B", "A B", "X=Y"])
def test_env_file_rejects_bad_env_names(bad):
    with pytest.raises(ValueError, match="environment variable"):
        env_file_text({bad: "v"})


def test_remote_command_rejects_empty_argv():
    with pytest.raises(ValueError):
        remote_command([], 5, None)


@pytest.fixture(scope="module")
def keys():
    return paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()


def test_fingerprint_matches_ssh_keygen(keys, tmp_path):
    pub = tmp_path / "k.pub"
    pub.write_text(f"{keys[0].get_name()} {keys[0].get_base64()} test\n")
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    assert keys[0].fingerprint == out.split()[1]
    assert keys[0].fingerprint.startswith("SHA256:") and not keys[0].fingerprint.endswith("=")


def policy(path, accept=False, hashed=False, port=22):
    return kh.KnownHostsPolicy("gpu3", "10.0.0.3", port, path, accept, hashed)


def test_unknown_host_refused_without_flag_and_file_untouched(keys, tmp_path):
    path = tmp_path / "known_hosts"
    with pytest.raises(HostKeyUnknownError) as info:
        policy(path).missing_host_key(None, "10.0.0.3", keys[0])
    assert info.value.node == "gpu3" and keys[0].fingerprint in str(info.value)
    assert not path.exists()


@pytest.mark.parametrize("port,name", [(22, "10.0.0.3"), (2222, "[10.0.0.3]:2222")])
def test_accepted_key_is_recorded_in_openssh_form(keys, tmp_path, port, name):
    path = tmp_path / "sub" / "known_hosts"
    p = policy(path, accept=True, port=port)
    p.missing_host_key(None, name, keys[0])
    assert path.read_text() == f"{name} {keys[0].get_name()} {keys[0].get_base64()}\n"
    assert p.accepted_new_key == keys[0].fingerprint
    policy(path, port=port).missing_host_key(None, name, keys[0])  # now known: passes
    p.missing_host_key(None, name, keys[0])  # recording again does not duplicate
    assert len(path.read_text().splitlines()) == 1


def test_hashed_entry_is_found_again(keys, tmp_path):
    path = tmp_path / "known_hosts"
    policy(path, accept=True, hashed=True).missing_host_key(None, "10.0.0.3", keys[0])
    assert path.read_text().startswith("|1|") and "10.0.0.3" not in path.read_text()
    policy(path).missing_host_key(None, "10.0.0.3", keys[0])


def test_changed_key_refused_even_with_accept_and_names_both_fingerprints(keys, tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("# orch\n10.0.0.9 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n")
    policy(path, accept=True).missing_host_key(None, "10.0.0.3", keys[0])
    for accept in (False, True):
        with pytest.raises(HostKeyChangedError) as info:
            policy(path, accept=accept).missing_host_key(None, "10.0.0.3", keys[1])
        msg = str(info.value)
        assert "gpu3" in msg and "10.0.0.3:22" in msg
        assert keys[0].fingerprint in msg and keys[1].fingerprint in msg
        assert "man-in-the-middle" in msg and "ssh-keygen -R '10.0.0.3'" in info.value.hint
    assert len(path.read_text().splitlines()) == 3  # the comment, 10.0.0.9, 10.0.0.3: nothing added


def test_other_key_type_on_record_counts_as_changed(keys, tmp_path):
    path = tmp_path / "known_hosts"
    ed = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    path.write_text(f"10.0.0.3 ssh-ed25519 {ed}\n")
    with pytest.raises(HostKeyChangedError, match="ssh-ed25519 SHA256:"):
        policy(path, accept=True).missing_host_key(None, "10.0.0.3", keys[0])
    assert kh.recorded_key_types(path, "10.0.0.3", 22) == ["ssh-ed25519"]


def _runner(**kw):
    from pathlib import Path

    from orchestrator.remote.ssh import SshRunner

    return SshRunner("gpu3", "10.0.0.3", port=2222, known_hosts=Path("/nonexistent/kh"), connect_timeout=7, **kw)


def test_connect_failures_map_to_typed_errors_naming_node_and_address():
    import errno
    import socket

    from orchestrator.errors import AuthenticationError, UnreachableError

    r = _runner()
    refused = paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.3", 2222): OSError(errno.ECONNREFUSED, "x")})
    cases = [
        (refused, UnreachableError, "connection refused"),
        (TimeoutError("timed out"), UnreachableError, "no answer within 7s"),
        (socket.gaierror(-2, "Name or service not known"), UnreachableError, "cannot resolve"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), UnreachableError, "No route to host"),
        (paramiko.SSHException("Error reading SSH protocol banner"), UnreachableError, "handshake"),
        (paramiko.AuthenticationException("Authentication failed."), AuthenticationError, "refused authentication"),
        (paramiko.PasswordRequiredException("private key file is encrypted"), AuthenticationError, "encrypted"),
    ]
    for exc, kind, words in cases:
        mapped = r._connect_error(exc)
        assert isinstance(mapped, kind), exc
        assert mapped.node == "gpu3" and words in str(mapped) and mapped.hint
        if kind is UnreachableError and "resolve" not in words:
            assert "10.0.0.3:2222" in str(mapped)
    # After the host key passed, "no authentication methods" means no key was available.
    no_key = r._connect_error(paramiko.SSHException("No authentication methods available"), authenticating=True)
    assert isinstance(no_key, AuthenticationError) and "no key" in str(no_key)
    bug = ValueError("a bug")
    assert r._connect_error(bug) is bug  # not a transport failure: surfaces as is


# The CA line of the example ssh_known_hosts file in OpenSSH's sshd(8) manual, verbatim.
SSHD8_CA_LINE = "@cert-authority *.mydomain.org,*.mydomain.com ssh-rsa AAAAB5W..."


def _ssh_keygen(tmp_path, name: str) -> tuple[str, paramiko.PKey]:
    """A host key made by OpenSSH itself: its public line and the key."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    kind, blob = (tmp_path / f"{name}.pub").read_text().split()[:2]
    return f"{kind} {blob}", paramiko.Ed25519Key(filename=str(tmp_path / name))


def test_known_hosts_with_cert_authority_and_revoked_lines_still_verifies(tmp_path):
    """Before: one @cert-authority or @revoked line broke every command ("internal error:
    InvalidHostKey"). Now the CA line is skipped, the trusted key still passes."""
    good, key = _ssh_keygen(tmp_path, "good")
    _, other = _ssh_keygen(tmp_path, "other")
    path = tmp_path / "known_hosts"
    path.write_text(f"# orch\n{SSHD8_CA_LINE}\n10.0.0.3 {good}\n@revoked 10.9.9.9 {other.get_name()} {other.get_base64()}\n")
    p = policy(path)
    p.missing_host_key(None, "10.0.0.3", key)
    assert p.verified
    assert kh.recorded_key_types(path, "10.0.0.3", 22) == ["ssh-ed25519"]


def test_a_revoked_key_is_refused_even_when_recorded_as_trusted(tmp_path):
    line, key = _ssh_keygen(tmp_path, "k")
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.3 {line}\n10.0.0.4 {line}\n@revoked 10.0.0.3,[10.0.0.5]:2222 {line}\n")
    with pytest.raises(HostKeyChangedError) as info:
        policy(path).missing_host_key(None, "10.0.0.3", key)
    assert f"{path}:3" in str(info.value) and "@revoked" in str(info.value) and info.value.node == "gpu3"
    ok = kh.KnownHostsPolicy("gpu4", "10.0.0.4", 22, path, False, False)  # not named by the @revoked line
    ok.missing_host_key(None, "10.0.0.4", key)
    assert ok.verified
    wildcard = tmp_path / "wild"
    wildcard.write_text(f"10.0.0.5 {line}\n@revoked 10.0.0.* {line}\n")
    with pytest.raises(HostKeyChangedError):
        kh.KnownHostsPolicy("gpu5", "10.0.0.5", 22, wildcard, False, False).missing_host_key(None, "10.0.0.5", key)


def test_a_revoked_hashed_host_is_matched(tmp_path):
    line, key = _ssh_keygen(tmp_path, "k")
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.3 {line}\n@revoked {paramiko.HostKeys.hash_host('10.0.0.3')} {line}\n")
    with pytest.raises(HostKeyChangedError, match="@revoked"):
        policy(path).missing_host_key(None, "10.0.0.3", key)


@pytest.mark.parametrize("bad,what", [
    ("10.0.0.7 ssh-ed25519 not*base64", "the ssh-ed25519 key does not decode"),
    ("10.0.0.7 ssh-ed25519", "expected 'HOSTS KEY-TYPE BASE64-KEY'"),
    ("@marker-of-a-future-openssh 10.0.0.7 ssh-ed25519 AAAA", "unknown marker '@marker-of-a-future-openssh'"),
])  # fmt: skip
def test_an_unreadable_line_is_named_by_file_and_line(tmp_path, bad, what):
    good, key = _ssh_keygen(tmp_path, "good")
    path = tmp_path / "known_hosts"
    path.write_text(f"10.0.0.3 {good}\n\n{bad}\n")
    with pytest.raises(KnownHostsError) as info:
        policy(path).missing_host_key(None, "10.0.0.3", key)
    assert info.value.message.startswith(f"{path}:3: cannot read this known_hosts line: {what}")
    assert info.value.exit_code == 2 and "line 3" in (info.value.hint or "")


@pytest.mark.parametrize(("raised", "expected"), [("timeout", "CommandTimeoutError"), ("eof", "CommandFailedError")])
def test_put_file_reports_the_channels_own_timeout_as_a_timeout(monkeypatch, raised, expected):
    """The SFTP channel's timeout (paramiko's Channel.recv raises a bare socket.timeout) has the
    same seconds as the caller's wait and can end the write first on a fast machine: fresh14
    (2026-12-05) got "could not write ...: " (a CommandFailedError with an empty reason) for a
    stalled sftp-server. A real failure of the write stays a CommandFailedError."""
    from orchestrator import errors
    from orchestrator.remote import ssh
    from orchestrator.remote.runner import CommandResult

    class Channel:
        def settimeout(self, seconds):
            pass

        def invoke_subsystem(self, name):
            pass

        def close(self):
            pass

    class Transport:
        def open_session(self, timeout=None):
            return Channel()

    def stalled_sftp(chan):
        raise TimeoutError() if raised == "timeout" else EOFError("server closed the channel")  # socket.timeout is TimeoutError

    r = _runner()
    monkeypatch.setattr(r, "_run", lambda argv, timeout, env_file: CommandResult(tuple(argv), 0, "", "", 0.0))
    monkeypatch.setattr(r, "_transport", lambda: Transport())
    monkeypatch.setattr(ssh.paramiko, "SFTPClient", stalled_sftp)
    with pytest.raises(getattr(errors, expected)) as err:
        r.put_file("/etc/orch/token", b"t", 0o600, timeout=5)
    assert err.value.node == "gpu3" and "/etc/orch/token" in str(err.value)
