"""Printing helpers shared by the commands: errors, JSON, rich console. CLI-only."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from orchestrator.errors import OrchError


def print_error(exc: OrchError) -> None:
    click.echo(f"error: {exc.message}", err=True)
    for problem in getattr(exc, "problems", None) or []:
        if problem != exc.message:
            click.echo(f"  {problem}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def console(stderr: bool = False):
    """A rich console; imported lazily so that `orch --help` does not pay for rich."""
    from rich.console import Console

    return Console(file=sys.stderr if stderr else sys.stdout, highlight=False, soft_wrap=False)
