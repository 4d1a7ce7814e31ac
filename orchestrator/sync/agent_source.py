"""The agent's source text, sent to nodes as ``python -c SOURCE MODE ...`` (nothing is installed
on them). Reads the package's own file once (like a template); no other I/O."""

from __future__ import annotations

import functools
import inspect

from orchestrator.sync import agent


@functools.cache
def agent_source() -> str:
    return inspect.getsource(agent)
