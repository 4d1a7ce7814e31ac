"""``orch doctor``: collect every node's Ray/Serve/vLLM logs and name known failures. CLI only.

Exit 0 when no finding of severity ``fail`` was made (warnings are printed), 1 otherwise, 4 when a
node could not be reached (its logs were not read).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click

from orchestrator.errors import DiagnosisFailed, UsageError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"--since {text!r}: expected a duration such as 30m, 2h or 90s", hint="units: s, m, h, d")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(seconds):  # 400 digits make float() infinite
        raise UsageError(f"--since {text!r}: not a finite duration", hint="e.g. --since 30m")
    return seconds


def _table(report: Any) -> None:
    from rich.table import Table

    from orchestrator.cli.output import code_column, console

    out = console()
    for n in report.nodes:
        if n.reachable:
            where = n.session_dir or "no Ray session found"
            out.print(
                f"[bold]{n.node}[/bold]: {where} ({n.files_read} files, {n.lines_scanned} lines read"
                + (f", {n.skipped_files} more files not read" if n.skipped_files else "")
                + ")"
            )
        else:
            out.print(f"[bold]{n.node}[/bold]: [red]not reachable[/red]: {n.error}")
    for note in report.notes:
        out.print(f"note: {note}")
    if not report.findings:
        out.print("[green]no known failure signature found[/green]")
        return
    table = Table()
    table.add_column("severity")
    code_column(table, [f.code for f in report.findings])
    table.add_column("node")
    table.add_column("evidence at (file:line)", overflow="fold")
    for f in report.findings:
        sev = "[red]fail[/red]" if f.severity == "fail" else f"[yellow]{f.severity}[/yellow]"
        times = f" (x{f.count})" if f.count > 1 else ""
        table.add_row(sev, f.code, f.node, f"{f.where}{times}")  # each hint below names the runbook
    out.print(table)
    for f in report.findings:
        out.print(f"[bold]{f.code}[/bold] on {f.node} ({f.where}):", soft_wrap=True, markup=True)
        out.print(f"  {f.evidence}", soft_wrap=True, markup=False, highlight=False)
        out.print(f"  hint: {f.hint}", soft_wrap=True, markup=False, highlight=False)


@click.command("doctor")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--since", "since", default=None, help="Only log files written in this window (30m, 2h, 90s).")
@click.option("--node", "only_nodes", multiple=True, help="Only this node (repeatable).")
@click.option("--no-preflight", is_flag=True, help="Skip the facts checks (interfaces, /dev/shm, versions, ...).")
@click.option("--max-files", default=80, show_default=True, type=click.IntRange(1, 10000), help="Log files read per node.")
@click.option(
    "--tail-lines", default=20000, show_default=True, type=click.IntRange(1), help="Last lines read of each log file."
)
@click.option("--accept-new-host-keys", is_flag=True, help="Record host keys of nodes met for the first time.")
@click.pass_context
def doctor(
    ctx: click.Context,
    cluster_yaml: Path | None,
    as_json: bool,
    since: str | None,
    only_nodes: tuple[str, ...],
    no_preflight: bool,
    max_files: int,
    tail_lines: int,
    accept_new_host_keys: bool,
) -> None:
    """Collect every node's Ray, Serve and vLLM logs and match known failure signatures.

    Without CLUSTER_YAML, the one cluster recorded by `orch up` is diagnosed.

    \b
    Exit 0: nothing of severity fail found. Exit 1: at least one failure found. Exit 4: a node
    could not be reached over SSH (its logs were not read).
    Each finding names its evidence line (file:line on the node) and its runbook.
    """
    from orchestrator.cli.wiring import known_hosts_path, resolve_manifest
    from orchestrator.doctor.diagnose import diagnose
    from orchestrator.doctor.logscan import ScanLimits
    from orchestrator.remote.connect import open_runners

    since_s = parse_duration(since) if since else None
    state_dir: Path = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, "doctor")
    names = [n.name for n in manifest.nodes]
    unknown = [n for n in only_nodes if n not in names]
    if unknown:
        raise UsageError(
            f"--node {', '.join(unknown)}: not a node of cluster {manifest.name}", hint=f"nodes: {', '.join(names)}"
        )
    known_hosts = known_hosts_path(manifest, state_dir)
    # Runners connect on their first command: a dead node becomes its own finding in the fan-out.
    with open_runners(manifest, known_hosts, accept_new_host_keys, nodes=only_nodes or None) as runners:
        report = diagnose(
            manifest,
            runners,
            limits=ScanLimits(max_files=max_files, tail_lines=tail_lines),
            since_s=since_s,
            with_preflight=not no_preflight,
        )
    if as_json:
        from orchestrator.cli.output import print_json

        print_json(report.to_dict())
    else:
        _table(report)
    failures = [f for f in report.findings if f.severity == "fail"]
    unreached = [n.node for n in report.nodes if not n.reachable]
    if unreached:
        # the logs of these nodes were not read: exit 4, like every command that cannot reach a node
        from orchestrator.errors import UnreachableError

        others = [f for f in failures if f.node not in unreached]
        found = f"; on the others it found {len(others)} failure(s): " + ", ".join(f"{f.code} on {f.node}" for f in others[:5]) if others else ""
        raise UnreachableError(f"doctor could not read the logs of {', '.join(unreached)} (not reachable over SSH){found}",
                               hint="see `orch runbook NODE_UNREACHABLE`, then rerun `orch doctor`")  # fmt: skip
    if failures:
        # Raised rather than ctx.exit(1): the CLI boundary prints it last and returns exit 1.
        named = ", ".join(f"{f.code} on {f.node}" for f in failures[:5]) + (", ..." if len(failures) > 5 else "")
        raise DiagnosisFailed(
            f"doctor found {len(failures)} failure(s): {named}",
            hint="follow the runbook named for each finding above: `orch runbook <CODE>` (runbooks/<CODE>.md)",
        )
