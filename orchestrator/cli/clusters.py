"""`orch clusters`: the clusters orch knows, from its state store. CLI only; reads the state.

One line per cluster recorded by `orch up`: its state (up or down), what it serves (the current
revision's model; nothing once `orch down` stopped the cluster, whose last revision is then shown
as ``last_served``), its head and the manifest file it was brought up from. No node is contacted:
`orch status CLUSTER_YAML` asks the nodes.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import click


@click.command("clusters")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, state, serving, last_served, head, manifest, updated}.")
@click.pass_context
def clusters(ctx: click.Context, as_json: bool) -> None:
    """List the clusters orch knows (recorded by `orch up`), with their state and what they serve.

    \b
    Reads orch's state only (no SSH). Exit 0, also when none is known.
    """
    from orchestrator.cli.output import print_json
    from orchestrator.state import StateStore

    state_dir: Path = ctx.obj["state_dir"]
    store = StateStore(state_dir)
    rows: list[dict[str, Any]] = []
    for c in store.list_clusters():
        rev = store.current_revision(c.name)
        served = {"revision": rev.number, "model": rev.model, "status": rev.status} if rev is not None else None
        rows.append({
            "name": c.name, "state": c.state,
            # a stopped cluster serves nothing, whatever its last revision was
            "serving": served if c.state == "up" else None,
            "last_served": served if c.state != "up" else None,
            "head": c.head_address, "manifest": c.manifest_path,
            "updated": _dt.datetime.fromtimestamp(c.updated_at, _dt.timezone.utc).isoformat(timespec="seconds") if c.updated_at else None,
        })  # fmt: skip
    if as_json:
        print_json(rows)
        return
    if not rows:
        click.echo(f"no cluster is recorded in {state_dir}; `orch up CLUSTER_YAML` starts one")
        return
    table = [("cluster", "state", "serving", "head", "manifest")]
    for r in rows:
        serving = f"r{r['serving']['revision']} {r['serving']['model']} ({r['serving']['status']})" if r["serving"] else "-"
        if r["last_served"]:
            serving = f"- (was r{r['last_served']['revision']} {r['last_served']['model']}; stopped)"
        table.append((r["name"], r["state"], serving, r["head"] or "-", r["manifest"] or "(recorded manifest)"))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
