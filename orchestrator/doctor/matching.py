"""Matching log lines against failure signatures: the values (a log line, a signature, a finding)
and the matcher. No I/O.

A ``Signature`` names a finding code, the component that writes the line, a severity and a hint;
its matchers are regular expressions over one log line (plus, where needed, a small predicate on
the match): this is diagnosis of third-party logs, not error handling of orch's own commands
(those use exit codes and typed errors). ``match_logs`` keeps one finding per node and code. The
known signatures themselves are ``doctor.signatures.SIGNATURES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

Severity = Literal["fail", "warn", "info"]
Component = Literal["ray", "serve", "vllm", "nccl", "deepep", "system"]

EVIDENCE_MAX_CHARS = 400

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

@dataclass(frozen=True)
class LogLine:
    """One line of one log file on one node. ``line_no`` is 1-based, None when unknown."""

    node: str
    file: str
    line_no: int | None
    text: str

@dataclass(frozen=True)
class DoctorFinding:
    """A known failure seen on a node, with the first line that shows it.

    ``count`` is how many lines on that node matched the same code; ``source`` is ``logs`` for
    signature matches and ``preflight`` for facts checks fed into the same report.
    """

    code: str
    node: str
    file: str
    line_no: int | None
    evidence: str
    hint: str
    severity: Severity = "fail"
    title: str = ""
    component: str = ""
    count: int = 1
    source: str = "logs"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line_no}" if self.line_no is not None else self.file

    def to_dict(self) -> dict:
        return {
            "code": self.code,
            "severity": self.severity,
            "title": self.title,
            "component": self.component,
            "node": self.node,
            "file": self.file,
            "line_no": self.line_no,
            "evidence": self.evidence,
            "count": self.count,
            "hint": self.hint,
            "source": self.source,
        }

@dataclass(frozen=True)
class Signature:
    """One way a known failure shows up in a log line.

    ``keywords``: cheap substrings, at least one of which must be in the line before the regex
    runs (most lines of a healthy log hold none). ``predicate``: an optional extra test on the
    regex match (for example "the quoted value is a filesystem path"). ``retry_cannot_fix``: a
    replica that failed to start with this line fails the same way on every new attempt, so a
    rollout stops its candidate at once instead of waiting for Serve's retries (the codes and why:
    ``doctor.codes.RETRY_CANNOT_FIX``).
    """

    code: str
    title: str
    component: Component
    severity: Severity
    pattern: re.Pattern[str]
    keywords: tuple[str, ...]
    hint: str
    predicate: Callable[[re.Match[str]], bool] | None = field(default=None, compare=False)
    retry_cannot_fix: bool = False

    def match(self, text: str) -> re.Match[str] | None:
        if not any(k in text for k in self.keywords):
            return None
        m = self.pattern.search(text)
        if m is None:
            return None
        if self.predicate is not None and not self.predicate(m):
            return None
        return m

def clean_evidence(text: str) -> str:
    """The line as a person should read it: no colour codes, no trailing blanks, bounded length."""
    text = _ANSI.sub("", text).rstrip()
    if len(text) > EVIDENCE_MAX_CHARS:
        text = text[: EVIDENCE_MAX_CHARS - 3] + "..."
    return text

def match_line(text: str, signatures: Iterable[Signature]) -> list[Signature]:
    """Every signature that matches one line (at most one per code, the first listed)."""
    hits: list[Signature] = []
    seen: set[str] = set()
    for sig in signatures:
        if sig.code in seen:
            continue
        if sig.match(text) is not None:
            hits.append(sig)
            seen.add(sig.code)
    return hits

_SEVERITY_RANK = {"fail": 0, "warn": 1, "info": 2}

def match_logs(lines: Iterable[LogLine], signatures: Iterable[Signature]) -> list[DoctorFinding]:
    """Match every line; one finding per (node, code), deduplicated.

    The evidence is the first line that matched on that node, upgraded to the first line of a
    ``fail`` signature when a ``warn`` one came first; ``count`` counts every matching line.
    Ray copies a worker's output into several files (worker-*.err, the driver's log, Serve's
    replica log), so repeats are the rule. Findings come out ordered by severity, node, code.
    """
    signatures = tuple(signatures)
    best: dict[tuple[str, str], DoctorFinding] = {}
    for line in lines:
        for sig in match_line(line.text, signatures):
            key = (line.node, sig.code)
            prev = best.get(key)
            if prev is None:
                best[key] = DoctorFinding(
                    code=sig.code,
                    node=line.node,
                    file=line.file,
                    line_no=line.line_no,
                    evidence=clean_evidence(line.text),
                    hint=sig.hint,
                    severity=sig.severity,
                    title=sig.title,
                    component=sig.component,
                )
                continue
            if _SEVERITY_RANK[sig.severity] < _SEVERITY_RANK[prev.severity]:
                best[key] = replace(
                    prev,
                    file=line.file,
                    line_no=line.line_no,
                    evidence=clean_evidence(line.text),
                    hint=sig.hint,
                    severity=sig.severity,
                    count=prev.count + 1,
                )
            else:
                best[key] = replace(prev, count=prev.count + 1)
    return sorted(best.values(), key=lambda f: (_SEVERITY_RANK[f.severity], f.node, f.code))
