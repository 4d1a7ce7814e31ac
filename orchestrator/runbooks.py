"""Where the runbook of a finding or problem code lives: ``runbooks/<CODE>.md``. Pure."""

from __future__ import annotations


def runbook(code: str) -> str:
    """The runbook path named in hints for ``code``."""
    return f"runbooks/{code}.md"
