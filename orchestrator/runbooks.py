"""Runbooks: how a hint names the runbook of a code, and the runbook texts themselves.

``runbook(CODE)`` is what every hint ends with: the command that prints the runbook on any
install (``orch runbook <CODE>``, like ``rustc --explain``) and the file in the repository
(``runbooks/<CODE>.md``). Pure. ``lookup`` and ``index`` read the runbooks shipped with orch
(package data, see ``orchestrator.resources``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.resources import names, read_text

INDEX_FILE = "README.md"


def path(code: str) -> str:
    """The runbook's file in the repository (and in the sdist)."""
    return f"runbooks/{code}.md"


def runbook(code: str) -> str:
    """How a hint names the runbook of ``code``: the command, then the file (always last)."""
    return f"`orch runbook {code}` or {path(code)}"


@dataclass(frozen=True)
class Runbook:
    code: str
    title: str  # the first heading, without the code and the '#'
    text: str


def _title(code: str, text: str) -> str:
    first = text.splitlines()[0] if text else ""
    heading = first.lstrip("#").strip()
    prefix = f"{code}:"
    return heading[len(prefix) :].strip() if heading.startswith(prefix) else heading


def codes() -> list[str]:
    """Every runbook shipped with orch (finding codes and the few topic runbooks such as
    ``acceptance``), sorted."""
    return [name[: -len(".md")] for name in names("runbooks", ".md") if name != INDEX_FILE]


def lookup(code: str) -> Runbook:
    """The runbook of ``code`` (case-insensitive for finding codes). UsageError naming the
    closest codes when there is none."""
    known = codes()
    match = code if code in known else next((c for c in known if c.lower() == code.lower()), None)
    if match is None:
        close = difflib.get_close_matches(code.upper(), known, n=3, cutoff=0.5)
        did_you_mean = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(
            f"no runbook for '{code}'{did_you_mean}",
            hint="`orch runbook` lists every code; codes are the ones findings print (e.g. GPU_TYPE_MISMATCH)",
        )
    text = read_text("runbooks", f"{match}.md")
    return Runbook(code=match, title=_title(match, text), text=text)


def index() -> list[Runbook]:
    """Every runbook with its title, sorted by code."""
    return [lookup(code) for code in codes()]
