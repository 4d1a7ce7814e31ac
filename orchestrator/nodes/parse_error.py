"""The error of a probe parser that cannot read its input. Pure.

It names the tool, the line (1-based) and what the parser expected there, so that preflight's
PROBE_FAILED finding tells a person exactly which output to look at.
"""

from __future__ import annotations


def _shown(line: str, limit: int = 160) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


class ProbeParseError(ValueError):
    """Output of a probe that does not have the expected shape.

    ``ProbeParseError(tool, expected, line_no, line, found=...)`` reads
    ``TOOL: line N: expected EXPECTED; got 'LINE' (FOUND)``; ``ProbeParseError(message)`` alone is
    a message for outputs without lines (JSON)."""

    def __init__(
        self, tool: str, expected: str | None = None, line_no: int | None = None, line: str | None = None, *, found: str | None = None
    ) -> None:
        self.tool, self.expected, self.line_no, self.line, self.found = tool, expected, line_no, line, found
        if expected is None:
            message = tool
        else:
            where = f" line {line_no}:" if line_no is not None else ""
            got = f"; got {_shown(line)}" if line is not None else ""
            extra = f" ({found})" if found else ""
            message = f"{tool}:{where} expected {expected}{got}{extra}"
        super().__init__(message)
