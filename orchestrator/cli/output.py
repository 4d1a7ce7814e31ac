"""Printing helpers shared by the commands: errors, JSON, the rich console. CLI-only.

Terminal or not decides how orch prints (issue 25 item 1):

- on a terminal, rich lays tables out to the window's width and colours ``error``/``ok``
  (unless ``NO_COLOR`` is set, https://no-color.org, or ``TERM=dumb``);
- piped, redirected or in a CI log, nothing is wrapped, folded or cut (a log line is as long as
  it is, so ``grep`` finds a whole finding code and a hint's command stays on its line) and no
  escape code is written.

A finding code is never shortened, on a terminal either: tables give their code column
``code_column`` (no wrap, as wide as the longest code).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import IO, Any, cast

import click

from orchestrator.errors import OrchError

# The width rich lays out to when the output is not a terminal: wider than any line orch prints,
# so that nothing is wrapped or cut (rich pads nothing to this width: lines stay as long as their
# text).
UNWRAPPED_WIDTH = 1_000_000


def is_terminal(stream: IO[str] | None) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def colour_enabled(stream: IO[str] | None) -> bool:
    """Colour only on a terminal, never with NO_COLOR (any non-empty value) or TERM=dumb."""
    if os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM", "") == "dumb":
        return False
    return is_terminal(stream)


def _style(text: str, stream: IO[str], **style: Any) -> str:
    return click.style(text, **style) if colour_enabled(stream) else text


def error_label(stream: IO[str] | None = None) -> str:
    return _style("error:", stream or sys.stderr, fg="red", bold=True)


def ok_label(stream: IO[str] | None = None) -> str:
    return _style("ok", stream or sys.stdout, fg="green", bold=True)


def print_error(exc: OrchError) -> None:
    click.echo(f"{error_label()} {exc.message}", err=True, color=colour_enabled(sys.stderr))
    for problem in getattr(exc, "problems", None) or []:
        if problem != exc.message:
            click.echo(f"  {problem}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


def print_usage_error(message: str, hint: str | None) -> None:
    """A flag or argument click refused, in orch's form."""
    click.echo(f"{error_label()} {message}", err=True, color=colour_enabled(sys.stderr))
    if hint:
        click.echo(f"hint: {hint}", err=True)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def console(stderr: bool = False) -> Any:
    """A rich console on stdout (or stderr): laid out to the window on a terminal, unwrapped and
    without escape codes otherwise. rich is imported here so that `orch --help` does not pay for it."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    terminal = is_terminal(stream)
    colour = colour_enabled(stream)
    return Console(
        file=stream if terminal else cast(IO[str], _TrimmedLines(stream)),
        highlight=False,
        soft_wrap=False,
        force_terminal=terminal,
        no_color=not colour,
        color_system="auto" if terminal else None,
        width=None if terminal else UNWRAPPED_WIDTH,
    )


class _TrimmedLines:
    """The stream of an unwrapped console without the spaces rich pads a table's title (and
    left-justified text) with up to the table's width: no line of a log ends in blanks."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(_TRAILING_BLANKS.sub("\n", text))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"


_TRAILING_BLANKS = re.compile(r"[ \t]+\n")


def code_column(table: Any, codes: list[str] | tuple[str, ...] = (), header: str = "code") -> None:
    """Add a column for finding codes that is never wrapped nor cut, even in a narrow window."""
    table.add_column(header, no_wrap=True, min_width=max([len(header), *(len(c) for c in codes)]))
