"""The transport seam: ``run(argv, timeout) -> CommandResult``, and fan-out over nodes.

No I/O of its own beyond calling the runners it is given (threads for the fan-out).
Commands are argv lists; success is the exit code, never an empty stderr.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from orchestrator.errors import CommandFailedError, RemoteError

T = TypeVar("T")


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one node."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, node: str) -> CommandResult:
        """Return self when the command succeeded, else raise CommandFailedError naming the node."""
        if self.exit_code != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-3:]
            raise CommandFailedError(
                f"{node}: `{' '.join(self.argv)}` exited {self.exit_code}" + (f": {' | '.join(tail)}" if tail else ""),
                node=node,
            )
        return self


@runtime_checkable
class Runner(Protocol):
    """Runs argv on one node. Implementations: SshRunner, LocalRunner, FakeRunner."""

    node: str

    def run(self, argv: Sequence[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> CommandResult:
        """Run argv (no shell) with extra environment variables; raise RemoteError subclasses for
        transport failures (unreachable, auth, host key, timeout); a non-zero exit is a result."""
        ...

    def put_file(self, path: str, content: bytes, mode: int = 0o600) -> None:
        """Write ``content`` to ``path`` on the node atomically, with ``mode`` set before any
        byte is written (the Ray token is written this way)."""
        ...

    def forward(self, remote_host: str, remote_port: int) -> int:
        """A local port whose connections reach remote_host:remote_port as seen from the node
        (an SSH tunnel; a local runner returns the port itself). Closed by ``close()``."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Process(Protocol):
    """A command still running on a node, with its stdin and stdout open (the model-sync agent).
    ``readline`` returns one stdout line ('' at the end); ``kill`` ends it by closing its
    channel or process group, which the agent notices as EOF on its stdin."""

    node: str

    def write(self, data: bytes) -> None: ...

    def close_stdin(self) -> None: ...

    def readline(self) -> str: ...

    def wait(self, timeout: float) -> int: ...

    def stderr(self) -> str: ...

    def kill(self) -> None: ...


@runtime_checkable
class Starter(Protocol):
    """A runner that can also start a long-running command and talk to it (SSH and local)."""

    node: str

    def start(self, argv: Sequence[str], timeout: float = 3600.0) -> Process: ...


@dataclass(frozen=True)
class NodeOutcome(Generic[T]):
    """The per-node result of a fan-out: a value or the RemoteError that node raised."""

    node: str
    value: T | None = None
    error: RemoteError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(
    runners: Iterable[Runner],
    action: Callable[[Runner], T],
    max_workers: int = 32,
) -> list[NodeOutcome[T]]:
    """Run ``action(runner)`` on every node in parallel (bounded), in the given order.

    One slow or dead node delays nothing else beyond its own timeouts; a RemoteError on one node
    becomes that node's outcome and does not hide the others. Other exceptions propagate (bugs).
    """
    runners = list(runners)
    if not runners:
        return []

    def one(r: Runner) -> NodeOutcome[T]:
        try:
            return NodeOutcome(node=r.node, value=action(r))
        except RemoteError as exc:
            if exc.node is None:
                exc.node = r.node
            return NodeOutcome(node=r.node, error=exc)

    with ThreadPoolExecutor(max_workers=min(max_workers, len(runners)), thread_name_prefix="orch-fanout") as pool:
        return list(pool.map(one, runners))
