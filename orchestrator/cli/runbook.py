"""`orch runbook [CODE]`: print the runbook of a finding code (like `rustc --explain`).

Reads the runbooks shipped with orch (package data), so it works on a pip install without the
repository. Without CODE it lists every runbook with its title, the troubleshooting patterns of
runbooks/patterns/ included.
"""

from __future__ import annotations

import click

from orchestrator.cli.output import print_json
from orchestrator.runbooks import index, lookup, path


@click.command("runbook")
@click.argument("code", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print {code, title, file, text} (or the list) as JSON.")
def runbook(code: str | None, as_json: bool) -> None:
    """Print the runbook of CODE (the code a finding or error printed, e.g. NO_NVLINK).

    \b
    Every hint that names a runbook names this command too:
      hint: ...; see `orch runbook NO_NVLINK` or runbooks/NO_NVLINK.md
    Without CODE: every runbook with its title, then the troubleshooting patterns (by symptom,
    e.g. `orch runbook one-gpu-oom`). Exit 2 for an unknown code.
    """
    if code is None:
        books = index()
        if as_json:
            print_json([{"code": b.code, "title": b.title, "file": path(b.code), "kind": b.kind} for b in books])
            return
        width = max(len(b.code) for b in books)
        for b in books:
            click.echo(f"{b.code:<{width}}  {b.title}")
        return
    book = lookup(code)
    if as_json:
        print_json({"code": book.code, "title": book.title, "file": path(book.code), "kind": book.kind, "text": book.text})
        return
    click.echo(book.text, nl=not book.text.endswith("\n"))
