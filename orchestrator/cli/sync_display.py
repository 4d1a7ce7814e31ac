"""How a model sync shows itself on the terminal: per-node progress on stderr (at most one line
per node per second), the dry run's plan and the summary. CLI only; shared by `orch model sync`
and `orch rollout --sync-model`.
"""

from __future__ import annotations

import time
from typing import Any

import click

PROGRESS_EVERY_S = 1.0


def _size(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _rate(n: float, seconds: float) -> str:
    return f"{n / seconds / (1 << 20):,.1f} MiB/s" if seconds > 0 else "-"


class SyncProgress:
    """Step lines as they come; a node's byte counter at most once per PROGRESS_EVERY_S."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last: dict[str, float] = {}

    def __call__(self, ev: Any) -> None:
        if not self.enabled:
            return
        if ev.node is None:
            click.echo(f"- {ev.message}", err=True)
            return
        now = time.monotonic()
        if ev.received < ev.total and now - self.last.get(ev.node, 0.0) < PROGRESS_EVERY_S:
            return
        self.last[ev.node] = now
        pct = 100.0 * ev.received / ev.total if ev.total else 100.0
        click.echo(f"  {ev.node}: {_size(ev.received)} / {_size(ev.total)} ({pct:.0f}%), {_rate(ev.received, ev.seconds)}", err=True)


def print_plan(result: Any) -> None:
    plan = result.plan
    click.echo(f"model {result.model}: {plan.to_dict()['files']} files, {_size(plan.to_dict()['model_bytes'])} "
              f"from {result.source}:{result.source_path} to {result.final_path}")  # fmt: skip
    for n in plan.nodes:
        if n.problem:
            click.echo(f"  {n.node}: refused: {n.problem}")
        elif n.up_to_date:
            click.echo(f"  {n.node}: up to date")
        else:
            extra = f", {len(n.link)} already there, {len(n.keep)} from an earlier run" if (n.link or n.keep) else ""
            rm = f", removes {len(n.remove)} file(s) not in the source" if n.remove else ""
            click.echo(f"  {n.node}: would receive {len(n.receive)} file(s), {_size(n.receive_bytes)}{extra}{rm}")
            for f in n.receive:
                click.echo(f"    {f.rel} ({_size(f.size)})")
    for p in plan.problems:
        click.echo(f"  refused: {p}")
    if plan.chain:
        click.echo(f"chain: {' -> '.join([result.source, *plan.chain])}, {_size(plan.stream_bytes)} sent once")


def print_summary(result: Any) -> None:
    if result.action == "noop":
        click.echo(f"nothing to do: {result.final_path} matches the source on every node ({len(result.nodes)})")
        return
    secs = result.seconds
    click.echo(f"{result.action}: {_size(result.sent_bytes)} sent from {result.source} in {secs:.1f} s "
              f"({_rate(result.sent_bytes, secs)}); {result.final_path}")  # fmt: skip
    for n in result.nodes:
        mark = "ok " if n.verified else "FAILED"
        detail = f"{_size(n.written_bytes)} written, {_rate(n.written_bytes, n.seconds)}" if n.action == "synced" else n.action
        click.echo(f"  {mark} {n.node}: {detail}" + (f": {n.error}" if n.error else ""))
