"""The agent's source text, sent to nodes as ``python -c SOURCE MODE ...`` (nothing is installed
on them): ``agent_fingerprint``'s text, then ``agent``'s without its import of the first part
(the one import of an orch module there; the joined program defines those names itself). Reads
the package's own files once (like a template); no other I/O."""

from __future__ import annotations

import ast
import functools
import inspect

from orchestrator.sync import agent, agent_fingerprint


def _without_import_of(source: str, module: str) -> str:
    lines = source.splitlines(keepends=True)
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.module == module:
            return "".join(lines[: node.lineno - 1] + lines[node.end_lineno or node.lineno :])
    raise ValueError(f"the agent does not import {module}")  # the two parts no longer fit together


@functools.cache
def agent_source() -> str:
    first = inspect.getsource(agent_fingerprint)
    second = _without_import_of(inspect.getsource(agent), agent_fingerprint.__name__)
    return first + "\n\n" + second
