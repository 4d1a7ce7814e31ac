"""The agent's source text, sent to nodes as ``python -c SOURCE MODE ...`` (nothing is installed
on them): ``agent_fingerprint``'s text, then ``agent``'s without its import of the first part
(the one import of an orch module there; the joined program defines those names itself). Reads
the package's own files once (like a template); no other I/O.

One thread builds it, under a lock: `orch model sync` asks for it from several threads at once
(the source's fingerprint beside every node's inspection), and CPython 3.11's ``ast.parse`` is
not safe in two threads at once: its recursion-depth counter is shared by the interpreter, and
a race ends in ``SystemError: AST constructor recursion depth mismatch`` (seen here once in
`orch model sync --dry-run` under load). ``functools.cache`` alone would let both threads in."""

from __future__ import annotations

import ast
import functools
import inspect
import threading

from orchestrator.sync import agent, agent_fingerprint


def _without_import_of(source: str, module: str) -> str:
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == module:
            return "".join(lines[: node.lineno - 1] + lines[node.end_lineno or node.lineno :])
    raise ValueError(f"the agent does not import {module}")  # the two parts no longer fit together


_BUILD_LOCK = threading.Lock()


def agent_source() -> str:
    with _BUILD_LOCK:
        return _build()


@functools.cache
def _build() -> str:
    first = inspect.getsource(agent_fingerprint)
    second = _without_import_of(inspect.getsource(agent), agent_fingerprint.__name__)
    return first + "\n\n" + second
