"""Why a replica failed to start, when another attempt cannot fix it. No I/O.

Serve retries a replica whose constructor failed (3 attempts in a row by default, each a new
engine start). Some failures come back on every attempt: a socket interface that makes a rank
advertise a loopback address, a model folder missing on the node, a config that does not fit
the GPU. ``start_cause`` reads the text Serve reported for the failed replica and the lines of
its own log, in that order, and returns the first line that a signature marked
``retry_cannot_fix`` matches (``doctor.codes.RETRY_CANNOT_FIX`` says which and why), as
the cause a rollout stops for; None when no line shows such a failure (then Serve's retries
stand: the next attempt may start).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.doctor.codes import RETRY_CANNOT_FIX
from orchestrator.doctor.matching import LogLine, Signature, clean_evidence, match_line
from orchestrator.doctor.signatures import SIGNATURES


@dataclass(frozen=True)
class StartCause:
    """The line that shows a start failure no retry fixes: its code, the line, where it was read
    (``node:file:line``, or the text Serve reported), the signature's hint (ending with the
    code's runbook) and why a retry cannot fix it."""

    code: str
    title: str
    evidence: str
    where: str
    hint: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "title": self.title, "evidence": self.evidence, "where": self.where,
                "hint": self.hint, "reason": self.reason}  # fmt: skip


def text_lines(text: str, source: str) -> list[LogLine]:
    """A multi-line text (Serve's deployment message with the replica's traceback) as log lines
    of ``source``, numbered from 1."""
    return [LogLine(node="", file=source, line_no=i, text=t) for i, t in enumerate(text.splitlines(), 1) if t.strip()]


def _where(line: LogLine) -> str:
    place = f"{line.file}:{line.line_no}" if line.line_no is not None else line.file
    return f"{line.node}:{place}" if line.node else place


def start_cause(lines: Iterable[LogLine], signatures: Iterable[Signature] = SIGNATURES, context: int = 0) -> StartCause | None:
    """The first of ``lines`` that shows a failure a retry cannot fix, as a ``StartCause``; its
    evidence takes up to ``context`` lines that follow it in the same file (a pydantic error
    names the config class, then the field, then the value refused, on three lines)."""
    lines = list(lines)
    signatures = tuple(s for s in signatures if s.retry_cannot_fix)
    for i, line in enumerate(lines):
        for sig in match_line(line.text, signatures):
            text = " | ".join(ln.text.strip() for ln in [line, *_following(lines, i, context)])
            return StartCause(code=sig.code, title=sig.title, evidence=clean_evidence(text), where=_where(line),
                              hint=sig.hint, reason=RETRY_CANNOT_FIX.get(sig.code, ""))  # fmt: skip
    return None


def _following(lines: list[LogLine], i: int, n: int) -> list[LogLine]:
    """Up to ``n`` lines right after ``lines[i]`` in its file (consecutive line numbers)."""
    out: list[LogLine] = []
    prev = lines[i]
    for line in lines[i + 1 : i + 1 + n]:
        if line.file != prev.file or line.node != prev.node or line.line_no is None or prev.line_no is None \
                or line.line_no != prev.line_no + 1:  # fmt: skip
            break
        out.append(line)
        prev = line
    return out


def start_keywords(signatures: Iterable[Signature] = SIGNATURES) -> list[str]:
    """The cheap substrings a log line needs to be worth matching for such a cause (what a log
    scan on the node sends back)."""
    return sorted({k for s in signatures if s.retry_cannot_fix for k in s.keywords})
