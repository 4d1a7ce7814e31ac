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
PATTERNS = "patterns"  # troubleshooting by symptom (runbooks/patterns/*.md): not one code each


def path(code: str) -> str:
    """The runbook's file in the repository (and in the sdist)."""
    if code in pattern_names():
        return f"runbooks/{PATTERNS}/{code}.md"
    return f"runbooks/{code}.md"


def runbook(code: str) -> str:
    """How a hint names the runbook of ``code``: the command, then the file (always last)."""
    return f"`orch runbook {code}` or {path(code)}"


@dataclass(frozen=True)
class Runbook:
    code: str  # a finding code, a topic (``acceptance``) or a pattern's name (``one-gpu-oom``)
    title: str  # the first heading, without the code and the '#'
    text: str
    kind: str = "code"  # "code" (a finding code or topic) or "pattern"


def _title(code: str, text: str) -> str:
    first = text.splitlines()[0] if text else ""
    heading = first.lstrip("#").strip()
    prefix = f"{code}:"
    return heading[len(prefix) :].strip() if heading.startswith(prefix) else heading


def codes() -> list[str]:
    """Every runbook of a code shipped with orch (finding codes and the few topic runbooks such
    as ``acceptance``), sorted."""
    return [name[: -len(".md")] for name in names("runbooks", ".md") if name != INDEX_FILE]


def pattern_names() -> list[str]:
    """The troubleshooting patterns shipped with orch (``runbooks/patterns/<name>.md``), sorted."""
    return [name[: -len(".md")] for name in names("runbooks", ".md", PATTERNS)]


def lookup(code: str) -> Runbook:
    """The runbook of ``code`` (case-insensitive), or the pattern of that name. UsageError naming
    the closest ones when there is none."""
    known, patterns = codes(), pattern_names()
    match = next((c for c in known if c == code), None) or next((c for c in known if c.lower() == code.lower()), None)
    if match is not None:
        text = read_text("runbooks", f"{match}.md")
        return Runbook(code=match, title=_title(match, text), text=text)
    pattern = next((p for p in patterns if p.lower() == code.lower()), None)
    if pattern is not None:
        text = read_text("runbooks", f"{PATTERNS}/{pattern}.md")
        return Runbook(code=pattern, title=_title(pattern, text), text=text, kind="pattern")
    close = difflib.get_close_matches(code.upper(), known, n=3, cutoff=0.5) or difflib.get_close_matches(code.lower(), patterns, n=3, cutoff=0.5)
    did_you_mean = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"no runbook for '{code}'{did_you_mean}",
        hint="`orch runbook` lists every code and pattern; codes are the ones findings print (e.g. GPU_TYPE_MISMATCH)",
    )


def index() -> list[Runbook]:
    """Every runbook with its title: the codes sorted, then the patterns sorted."""
    return [lookup(code) for code in codes()] + [lookup(name) for name in pattern_names()]
