"""A scripted runner for tests of the workflows: argv matchers -> results or errors; records calls.

No I/O. ``FakeRunner("head", [(("ray", "--version"), result("ray, version 2.60.0\\n")),
(Prefix("ray", "start"), result(exit_code=1, stderr="...")), (lambda argv: ..., UnreachableError(...))])``.
Rules are tried in order; a rule given ``times=n`` (via ``on``) answers n calls and then steps
aside, so ``on(m, fail, times=1).on(m, ok)`` scripts "fails once, then works". A command no rule
matches raises ``UnscriptedCommand`` (an AssertionError: the test forgot to script it) unless a
``default`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from orchestrator.errors import RemoteError
from orchestrator.remote.runner import CommandResult

Argv = tuple[str, ...]


class UnscriptedCommand(AssertionError):
    """The code under test ran a command the test did not script."""


class Prefix:
    """Matches any argv that starts with these items."""

    def __init__(self, *parts: str) -> None:
        self.parts = tuple(parts)

    def __call__(self, argv: Argv) -> bool:
        return argv[: len(self.parts)] == self.parts

    def __repr__(self) -> str:
        return f"Prefix{self.parts!r}"


def result(stdout: str = "", exit_code: int = 0, stderr: str = "", seconds: float = 0.0) -> CommandResult:
    """A CommandResult to script; its argv is replaced by the argv actually run."""
    return CommandResult(argv=(), exit_code=exit_code, stdout=stdout, stderr=stderr, seconds=seconds)


Matcher = Sequence[str] | Callable[[Argv], bool]
Response = CommandResult | BaseException | Callable[[Argv, "dict[str, str] | None"], CommandResult] | str


@dataclass
class _Rule:
    matcher: Matcher
    response: Response
    times: int | None = None  # None: unlimited

    def matches(self, argv: Argv) -> bool:
        if self.times == 0:
            return False
        if callable(self.matcher):
            return bool(self.matcher(argv))
        return tuple(self.matcher) == argv


@dataclass(frozen=True)
class Call:
    argv: Argv
    timeout: float
    env: dict[str, str] | None = None


@dataclass
class PutFile:
    path: str
    content: bytes
    mode: int


@dataclass
class FakeRunner:
    node: str
    responses: Iterable[tuple[Matcher, Response]] | Mapping = ()
    default: Response | None = None
    forward_port: int = 18265
    calls: list[Call] = field(default_factory=list)
    files: dict[str, PutFile] = field(default_factory=dict)
    forwards: list[tuple[str, int]] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        items = self.responses.items() if isinstance(self.responses, Mapping) else self.responses
        self._rules = [_Rule(m, r) for m, r in items]

    def on(self, matcher: Matcher, response: Response, times: int | None = None) -> FakeRunner:
        """Add a rule (after the existing ones); returns self for chaining."""
        self._rules.append(_Rule(matcher, response, times))
        return self

    def run(self, argv: Sequence[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> CommandResult:
        argv_t = tuple(argv)
        self.calls.append(Call(argv_t, timeout, dict(env) if env else None))
        for rule in self._rules:
            if rule.matches(argv_t):
                if rule.times is not None:
                    rule.times -= 1
                return self._answer(rule.response, argv_t, env)
        if self.default is not None:
            return self._answer(self.default, argv_t, env)
        raise UnscriptedCommand(f"{self.node}: unscripted command {argv_t!r}")

    def _answer(self, response: Response, argv: Argv, env: dict[str, str] | None) -> CommandResult:
        if isinstance(response, BaseException):
            if isinstance(response, RemoteError) and response.node is None:
                response.node = self.node
            raise response
        if isinstance(response, str):
            return CommandResult(argv, 0, response, "", 0.0)
        if isinstance(response, CommandResult):
            return replace(response, argv=argv)
        return response(argv, env)

    def ran(self, *prefix: str) -> list[Call]:
        """The recorded calls whose argv starts with ``prefix`` (all calls without one)."""
        return [c for c in self.calls if c.argv[: len(prefix)] == tuple(prefix)]

    def put_file(self, path: str, content: bytes, mode: int = 0o600) -> None:
        self.files[path] = PutFile(path, bytes(content), mode)

    def forward(self, remote_host: str, remote_port: int) -> int:
        self.forwards.append((remote_host, remote_port))
        return self.forward_port

    def close(self) -> None:
        self.closed = True
