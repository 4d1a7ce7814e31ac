"""The SSH adapter of the runner seam (paramiko): ``SshRunner.run(argv, timeout, env)``.

Does I/O: TCP connections, SSH sessions, SFTP, a local TCP listener per port forward, threads.
The argv is quoted once here with ``shlex.join`` and runs under ``timeout`` on the node so that
a command orch gave up on does not run on forever. Environment variables never travel on the
command line (any user of the node sees it in `ps`, and the manifest's env may hold secrets such
as HF_TOKEN): they are written to a 0600 file in a 0700 folder of the SSH user's home through
SFTP, sourced by a fixed ``sh -c`` before the command, and deleted when it ends (sshd refuses
most ``setenv`` requests). Every SFTP write has a deadline. Host keys
are checked by ``known_hosts.KnownHostsPolicy`` against orch's own known_hosts file. Every
paramiko/socket failure leaves as a typed ``RemoteError`` naming the node (``raise ... from``).
One SSH connection per runner, opened on first use and reused by every command.
"""

from __future__ import annotations

import errno
import logging
import math
import re
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import paramiko

from orchestrator.errors import (
    AuthenticationError,
    CommandFailedError,
    CommandTimeoutError,
    HostKeyChangedError,
    HostKeyUnknownError,
    RemoteError,
    UnreachableError,
)
from orchestrator.remote import known_hosts as kh
from orchestrator.remote.banner import TappedSocket, not_ssh_reason
from orchestrator.remote.runner import CommandResult
from orchestrator.remote.ssh_channels import Forward, SshProcess, drain, wait_exit

# paramiko logs from its transport threads: every connection at INFO, and a failed handshake at
# ERROR with a traceback ('Exception (client): Error reading SSH protocol banner'), printed before
# orch's own error. orch reports every connection problem as a typed error, so paramiko's log is
# off unless `orch --debug` turned it on before this import (cli/__init__.py: library_logging).
if logging.getLogger("paramiko").level == logging.NOTSET:
    logging.getLogger("paramiko").setLevel(logging.CRITICAL + 1)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Grace between orch giving up on a command and the node's `timeout` killing it (TERM, then KILL).
REMOTE_GRACE_S = 2
REMOTE_KILL_AFTER_S = 5
# Where a command's environment file lives on the node, relative to the SSH user's home (0700).
ENV_DIR = ".orch/env"
# Sources the environment file ($1) and replaces itself with the command: a fixed script, the
# file and the argv are separate arguments (nothing is glued into shell text).
SOURCE_AND_EXEC = '. "$1" || exit 125; shift; exec "$@"'
PUT_TIMEOUT_S = 60.0  # for one SFTP write (a stalled sftp-server must not block `orch up` forever)


def _check_env_names(env: dict[str, str] | None) -> None:
    for name in env or {}:
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")


def env_file_text(env: dict[str, str]) -> str:
    """The environment as a POSIX sh file of ``export NAME='value'`` lines (quoted once)."""
    _check_env_names(env)
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def remote_command(argv: Sequence[str], timeout: float, env_file: str | None = None) -> str:
    """The one string sent to the node's shell: ``timeout ... [sh -c SOURCE_AND_EXEC sh FILE]
    argv``, quoted once. No variable's value ever appears in it (``env_file`` holds them)."""
    if not argv:
        raise ValueError("empty argv")
    full = ["timeout", f"--kill-after={REMOTE_KILL_AFTER_S}", f"{math.ceil(timeout) + REMOTE_GRACE_S}"]
    if env_file:
        full += ["sh", "-c", SOURCE_AND_EXEC, "sh", env_file]
    return shlex.join(full + list(argv))


class SshRunner:
    """Runs commands on one node over SSH. Thread-safe; ``close()`` ends the connection."""

    def __init__(
        self,
        node: str,
        host: str,
        *,
        known_hosts: Path,
        port: int = 22,
        user: str = "root",
        identity_file: Path | None = None,
        allow_agent: bool = True,
        accept_new_host_keys: bool = False,
        hash_known_hosts: bool = False,
        connect_timeout: float = 10.0,
        keepalive_s: int = 30,
    ) -> None:
        self.node, self.host, self.port, self.user = node, host, port, user
        self.known_hosts = Path(known_hosts)
        self.identity_file = Path(identity_file) if identity_file else None
        self.allow_agent = allow_agent
        self.accept_new_host_keys = accept_new_host_keys
        self.hash_known_hosts = hash_known_hosts
        self.connect_timeout = connect_timeout
        self.keepalive_s = keepalive_s
        self.accepted_new_key: str | None = None  # fingerprint recorded on first contact, if any
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()
        self._forwards: list[Forward] = []
        self._closed = False
        self._home_dir: str | None = None

    def __repr__(self) -> str:
        return f"SshRunner({self.node!r}, {self.user}@{self.host}:{self.port})"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    # --- connection --------------------------------------------------------------------
    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._closed:
                raise RemoteError(f"{self.node}: runner already closed", node=self.node)
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return t
                self._client.close()  # the connection dropped since the last command: reconnect
                self._client = None
            self._client = self._connect()
            return self._client.get_transport()

    def _connect(self) -> paramiko.SSHClient:
        if self.identity_file is not None and not self.identity_file.is_file():
            raise AuthenticationError(
                f"{self.node}: identity file {self.identity_file} does not exist",
                hint="fix ssh.identity_file in cluster.yaml",
                node=self.node,
            )
        policy = kh.KnownHostsPolicy(
            self.node, self.host, self.port, self.known_hosts, self.accept_new_host_keys, self.hash_known_hosts
        )
        preferred = kh.recorded_key_types(self.known_hosts, self.host, self.port)

        taps: list[TappedSocket] = []

        def transport_factory(sock, disabled_algorithms=None):
            taps.append(TappedSocket(sock))  # what the port says, for the error when it is not sshd
            t = paramiko.Transport(taps[-1], disabled_algorithms=disabled_algorithms)
            if preferred:
                # Ask for the key type we have on record first, as OpenSSH does; otherwise a host
                # with several host keys could offer another type and look "changed".
                opts = t.get_security_options()
                want = [k for k in opts.key_types if k in preferred or (k.startswith("rsa-sha2") and "ssh-rsa" in preferred)]
                opts.key_types = want + [k for k in opts.key_types if k not in want]
            return t

        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(policy)  # no keys loaded: paramiko asks the policy every time
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.user,
                key_filename=str(self.identity_file) if self.identity_file else None,
                allow_agent=self.allow_agent,
                look_for_keys=self.identity_file is None,
                timeout=self.connect_timeout,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                channel_timeout=self.connect_timeout,
                transport_factory=transport_factory,  # type: ignore[arg-type]  # paramiko stubs type it as a Protocol
            )
        except (HostKeyChangedError, HostKeyUnknownError):
            client.close()
            raise
        except BaseException as exc:
            client.close()
            raise self._connect_error(exc, authenticating=policy.verified, tap=taps[-1] if taps else None) from exc
        self.accepted_new_key = policy.accepted_new_key
        t = client.get_transport()
        if t is not None and self.keepalive_s:
            t.set_keepalive(self.keepalive_s)
        return client

    def _connect_error(
        self, exc: BaseException, authenticating: bool = False, tap: TappedSocket | None = None
    ) -> BaseException:
        where, t = self.where, self.connect_timeout
        unreachable_hint = (
            f"check that {self.host} is up, that sshd listens on port {self.port} and that no firewall "
            "drops the traffic (`orch runbook NODE_UNREACHABLE` or runbooks/NODE_UNREACHABLE.md); the wait is ssh.connect_timeout in cluster.yaml"
        )
        if isinstance(exc, paramiko.PasswordRequiredException):
            return AuthenticationError(
                f"{self.node}: the key {self.identity_file} is encrypted and no passphrase is available",
                hint="load the key into ssh-agent (ssh-add) or use an unencrypted deploy key",
                node=self.node,
            )
        how = f"key {self.identity_file}" if self.identity_file else "the agent's and default keys"
        auth_hint = (
            f"make sure the public key is in ~{self.user}/.ssh/authorized_keys on {self.host} "
            "(ssh-copy-id), or set ssh.identity_file / ssh.user in cluster.yaml"
        )
        if isinstance(exc, paramiko.SSHException) and authenticating and not isinstance(exc, paramiko.AuthenticationException):
            # The host key passed, so the handshake is done: paramiko found no key to offer.
            return AuthenticationError(
                f"{self.node}: no key to log in to {self.user}@{where} with: no identity file, and neither "
                f"the agent nor ~/.ssh offered a key ({exc})",
                hint="set ssh.identity_file in cluster.yaml or add the key to ssh-agent (ssh-add)",
                node=self.node,
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return AuthenticationError(
                f"{self.node}: {self.user}@{where} refused authentication with {how}: {exc}",
                hint=auth_hint,
                node=self.node,
            )
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            codes = {getattr(e, "errno", None) for e in exc.errors.values()}
            why = "connection refused" if errno.ECONNREFUSED in codes else "no route to host"
            return UnreachableError(f"{self.node}: cannot reach {where}: {why}", hint=unreachable_hint, node=self.node)
        if isinstance(exc, socket.gaierror):
            return UnreachableError(
                f"{self.node}: cannot resolve host name {self.host!r}: {exc.strerror}",
                hint="fix nodes[].host in cluster.yaml or the machine's DNS / /etc/hosts",
                node=self.node,
            )
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return UnreachableError(
                f"{self.node}: cannot reach {where}: no answer within {t:g}s (connect timeout)",
                hint=unreachable_hint,
                node=self.node,
            )
        if isinstance(exc, OSError):
            return UnreachableError(
                f"{self.node}: cannot reach {where}: {exc.strerror or exc}", hint=unreachable_hint, node=self.node
            )
        not_ssh = not_ssh_reason(tap.received, tap.eof) if tap is not None and not authenticating else None
        if isinstance(exc, (paramiko.SSHException, EOFError)) and not_ssh:
            return UnreachableError(
                f"{self.node}: {where} is not an SSH server: {not_ssh}",
                hint=f"give the port sshd listens on at {self.host} (try `ssh -p PORT {self.user}@{self.host}`); "
                "the SSH port is ssh.port of the manifest, --port of `orch init`",
                node=self.node,
            )
        if isinstance(exc, (paramiko.SSHException, EOFError)):
            return UnreachableError(
                f"{self.node}: SSH handshake with {where} failed within {t:g}s: {exc or type(exc).__name__}",
                hint=unreachable_hint,
                node=self.node,
            )
        return exc  # not a transport failure: a bug, let it surface

    # --- commands ----------------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> CommandResult:
        if not argv:
            raise ValueError("empty argv")
        if not env:
            return self._run(argv, timeout, None)
        _check_env_names(env)
        home = self._home()
        folder = f"{home}/{ENV_DIR}"
        self._run(["mkdir", "-p", "-m", "700", "--", folder], 30, None).check(self.node)
        path = f"{folder}/{uuid.uuid4().hex}.env"
        self.put_file(path, env_file_text(env).encode(), 0o600)
        try:
            return self._run(argv, timeout, path)
        finally:
            # The command has read it (a daemon it started inherited the values); a file left by
            # a dropped connection is 0600 in a 0700 folder and replaced by nothing.
            try:
                self._run(["rm", "-f", "--", path], 30, None)
            except RemoteError:
                pass

    def _home(self) -> str:
        """The SSH user's home on the node (SFTP's login directory), asked once."""
        if self._home_dir is None:
            res = self._run(["printenv", "HOME"], 30, None).check(self.node)
            home = res.stdout.strip()
            if not home.startswith("/"):
                raise CommandFailedError(f"{self.node}: HOME is not an absolute path ({home!r})", node=self.node)
            self._home_dir = home.rstrip("/")
        return self._home_dir

    def _run(self, argv: Sequence[str], timeout: float, env_file: str | None) -> CommandResult:
        shown = shlex.join(list(argv))
        command = remote_command(argv, timeout, env_file)
        start = time.monotonic()
        try:
            chan = self._open_session()
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise UnreachableError(
                f"{self.node}: lost the SSH connection to {self.where} before `{shown}` started: {exc}",
                hint="the node or its sshd went away; re-run the command",
                node=self.node,
            ) from exc
        out: list[bytes] = []
        err: list[bytes] = []
        # Read both streams at once: a command that fills stderr while we wait on stdout would
        # otherwise block forever on a full SSH window.
        readers = [
            threading.Thread(target=drain, args=(chan.recv, out), daemon=True, name=f"ssh-out-{self.node}"),
            threading.Thread(target=drain, args=(chan.recv_stderr, err), daemon=True, name=f"ssh-err-{self.node}"),
        ]
        for r in readers:
            r.start()
        deadline = start + timeout
        for r in readers:
            r.join(max(0.0, deadline - time.monotonic()))
        if any(r.is_alive() for r in readers) or not wait_exit(chan, deadline):
            chan.close()  # the node's `timeout` ends the process; we stop waiting now
            raise CommandTimeoutError(
                f"{self.node}: `{shown}` did not finish within {timeout:g}s on {self.where}; it was stopped",
                hint="the node may be overloaded or the command hung; raise the timeout only if it is known to be slow",
                node=self.node,
            )
        code = chan.recv_exit_status()
        chan.close()
        return CommandResult(
            argv=tuple(argv),
            exit_code=code,
            stdout=b"".join(out).decode("utf-8", "replace"),
            stderr=b"".join(err).decode("utf-8", "replace"),
            seconds=time.monotonic() - start,
        )

    def _open_session(self) -> paramiko.Channel:
        """A session channel; when the reused connection turns out to be dead (the node
        rebooted, sshd restarted it), reconnect once: no command has started yet, so it is safe."""
        transport = self._transport()
        try:
            return transport.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError):
            with self._lock:
                if self._client is not None and self._client.get_transport() is transport:
                    self._client.close()
                    self._client = None
            return self._transport().open_session(timeout=self.connect_timeout)

    def put_file(self, path: str, content: bytes, mode: int = 0o600, timeout: float = PUT_TIMEOUT_S) -> None:
        """Write ``content`` to ``path`` on the node atomically; the file has ``mode`` before
        any byte is written (secrets such as the Ray token are never readable by others).
        Raises CommandTimeoutError when SFTP does not finish within ``timeout`` seconds."""
        parent = str(PurePosixPath(path).parent)
        self._run(["mkdir", "-p", "--", parent], 30, None).check(self.node)
        tmp = f"{path}.orch-{uuid.uuid4().hex[:8]}"
        channels: list[paramiko.Channel] = []
        outcome: list[BaseException | None] = []

        def write() -> None:
            try:
                chan = self._transport().open_session(timeout=self.connect_timeout)
                channels.append(chan)
                chan.settimeout(timeout)
                chan.invoke_subsystem("sftp")
                with paramiko.SFTPClient(chan) as sftp:
                    with sftp.open(tmp, "wb") as f:
                        sftp.chmod(tmp, mode)
                        f.write(content)
                    sftp.posix_rename(tmp, path)
                outcome.append(None)
            except BaseException as exc:  # handed to the caller's thread below
                outcome.append(exc)

        # paramiko waits for a subsystem's answer without a deadline: the write runs in a thread,
        # and closing its channel on timeout ends the wait.
        worker = threading.Thread(target=write, daemon=True, name=f"sftp-{self.node}")
        worker.start()
        worker.join(timeout)
        exc = outcome[0] if outcome else None
        # The channel's own timeout (the same seconds) can end the write just before the join
        # does: its socket.timeout is the same stall, not a failed write.
        if worker.is_alive() or isinstance(exc, TimeoutError):
            for chan in channels:
                chan.close()
            raise CommandTimeoutError(
                f"{self.node}: writing {path} over SFTP did not finish within {timeout:g}s on {self.where}",
                hint="the node's sftp-server is stalled or the link is very slow; check `Subsystem sftp` in its sshd_config",
                node=self.node,
            )
        if isinstance(exc, (OSError, paramiko.SSHException, EOFError)):
            raise CommandFailedError(
                f"{self.node}: could not write {path} on {self.where}: {exc}",
                hint="check free space and permissions on the node",
                node=self.node,
            ) from exc
        if exc is not None:
            raise exc

    # --- long-running commands with open streams -------------------------------------
    def start(self, argv: Sequence[str], timeout: float = 3600.0) -> SshProcess:
        """Start argv on the node and return it running, stdin and stdout open (the node's
        ``timeout`` still bounds it). ``kill()`` closes the channel. No environment travels with
        it: secrets go through stdin (see ``run`` for the env-file path)."""
        shown = shlex.join(list(argv)[:3])
        try:
            chan = self._open_session()
            chan.exec_command(remote_command(argv, timeout))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise UnreachableError(
                f"{self.node}: lost the SSH connection to {self.where} before `{shown}` started: {exc}",
                hint="the node or its sshd went away; re-run the command",
                node=self.node,
            ) from exc
        return SshProcess(self.node, self.where, chan)

    # --- port forwarding ---------------------------------------------------------------
    def forward(self, remote_host: str, remote_port: int) -> int:
        """Listen on 127.0.0.1:<free port> here and tunnel each connection to
        remote_host:remote_port as seen from the node. Returns the local port."""
        fwd = Forward(self.node, self._transport, self.connect_timeout, remote_host, remote_port)
        with self._lock:
            self._forwards.append(fwd)
        return fwd.port

    def close(self) -> None:
        with self._lock:
            self._closed = True
            forwards, self._forwards = self._forwards, []
            client, self._client = self._client, None
        for fwd in forwards:
            fwd.close()
        if client is not None:
            client.close()

    def __enter__(self) -> SshRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
