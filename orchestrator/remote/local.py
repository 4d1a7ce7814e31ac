"""The local adapter of the runner seam: runs argv on this machine (``transport: local`` nodes).

Does I/O: subprocesses (no shell), files. Same contract as ``SshRunner``: a non-zero exit is a
result; a timeout kills the command's whole process group and raises CommandTimeoutError; a
command that does not exist gives exit 127, as a shell on a remote node would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.errors import CommandFailedError, CommandTimeoutError
from orchestrator.remote.runner import CommandResult

# What a local command inherits from orch's own environment: what a login over SSH would give a
# node's command, nothing more. orch's environment may hold secrets (ORCH_API_KEY, AWS_*, cloud
# tokens) that a local `ray start` would otherwise hand to every Ray worker and Serve replica.
LOCAL_ENV_KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR"})


def local_base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of ``environ`` local commands start from (``LOCAL_ENV_KEEP`` and ``LC_*``)."""
    return {k: v for k, v in environ.items() if k in LOCAL_ENV_KEEP or k.startswith("LC_")}


class LocalRunner:
    """Runs commands on this machine under the node name ``node``, with an explicit environment:
    ``base_env`` (default: ``local_base_env`` of orch's) plus what each command is given."""

    def __init__(self, node: str, base_env: dict[str, str] | None = None) -> None:
        self.node = node
        self.base_env = dict(local_base_env(os.environ) if base_env is None else base_env)

    def __repr__(self) -> str:
        return f"LocalRunner({self.node!r})"

    def run(self, argv: Sequence[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> CommandResult:
        argv = list(argv)
        if not argv:
            raise ValueError("empty argv")
        merged = {**self.base_env, **(env or {})}
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=merged,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), 127, "", f"{argv[0]}: command not found\n", time.monotonic() - start)
        except PermissionError as exc:
            return CommandResult(tuple(argv), 126, "", f"{argv[0]}: {exc.strerror}\n", time.monotonic() - start)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise CommandTimeoutError(
                f"{self.node}: `{' '.join(argv)}` did not finish within {timeout:g}s; it was killed",
                hint="the machine may be overloaded or the command hung",
                node=self.node,
            ) from exc
        return CommandResult(
            argv=tuple(argv),
            exit_code=proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            seconds=time.monotonic() - start,
        )

    def put_file(self, path: str, content: bytes, mode: int = 0o600) -> None:
        """Write ``content`` to ``path`` atomically, with ``mode`` set before any byte is written."""
        target = Path(path)
        tmp = target.with_name(f"{target.name}.orch-{uuid.uuid4().hex[:8]}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), mode)  # the umask may have narrowed it; make it exact
                f.write(content)
            os.replace(tmp, target)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass  # never created (the folder itself is the problem)
            raise CommandFailedError(f"{self.node}: could not write {path}: {exc.strerror}", node=self.node) from exc

    def start(self, argv: Sequence[str], timeout: float = 3600.0) -> _LocalProcess:
        """Start argv here and return it running, stdin and stdout open; ``kill()`` ends its
        process group. ``timeout`` bounds it as on a node (killed when it runs past)."""
        argv = list(argv)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(self.base_env),
            start_new_session=True,
        )
        return _LocalProcess(self.node, proc, timeout)

    def forward(self, remote_host: str, remote_port: int) -> int:
        """Already local: the port itself (``remote_host`` is this machine's loopback)."""
        return remote_port

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _LocalProcess:
    """One running local command (``LocalRunner.start``)."""

    def __init__(self, node: str, proc: subprocess.Popen, timeout: float) -> None:
        self.node, self._proc = node, proc
        self._err: list[bytes] = []
        threading.Thread(target=self._drain, daemon=True, name=f"local-err-{node}").start()
        self._timer = threading.Timer(timeout, self.kill)
        self._timer.daemon = True
        self._timer.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        for chunk in iter(lambda: self._proc.stderr.read(65536), b""):
            self._err.append(chunk)

    def write(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise CommandFailedError(f"{self.node}: the command stopped reading its input", node=self.node) from exc

    def close_stdin(self) -> None:
        try:
            self._proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass

    def readline(self) -> str:
        try:
            return self._proc.stdout.readline().decode("utf-8", "replace")
        except ValueError:
            return ""

    def wait(self, timeout: float) -> int:
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeoutError(f"{self.node}: the command did not end within {timeout:g}s", node=self.node) from exc

    def stderr(self) -> str:
        return b"".join(self._err).decode("utf-8", "replace")

    def kill(self) -> None:
        self._timer.cancel()
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.close_stdin()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
