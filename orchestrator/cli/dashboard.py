"""`orch dashboard [CLUSTER_YAML]`: open an SSH tunnel to the Ray dashboard, print its local URL,
keep it open until Ctrl-C (exit 0). CLI only; the tunnel is ``workflows/dashboard.py``."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import click


@click.command("dashboard")
@click.argument("cluster_yaml", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of the head if contacted for the first time.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line {cluster, head, url, ray_version, token_file} instead.")
@click.pass_context
def dashboard(ctx: click.Context, cluster_yaml: Path | None, accept_new_host_keys: bool, as_json: bool) -> None:
    """Tunnel to the head's Ray dashboard over SSH and print its local URL; Ctrl-C closes it.

    \b
    The dashboard listens on the head's 127.0.0.1 only; the tunnel is proved with the cluster's
    token before the URL is printed. The page asks for that token (Ray's token auth): it is in
    orch's state, in the file named; orch never prints it. Without CLUSTER_YAML, the one
    cluster recorded by `orch up`. Exit 5 when the cluster is not up or its dashboard does not
    answer, 4 when the head cannot be reached; Ctrl-C closes the tunnel with exit 0.
    """
    from orchestrator.cli.wiring import known_hosts_path, resolve_manifest
    from orchestrator.cluster.dashboard import open_dashboard
    from orchestrator.remote.connect import open_runners
    from orchestrator.state import StateStore
    from orchestrator.workflows.dashboard import DashboardDeps, dashboard_tunnel

    state_dir: Path = ctx.obj["state_dir"]
    manifest = resolve_manifest(cluster_yaml, state_dir, "dashboard")
    known_hosts = known_hosts_path(manifest, state_dir)
    deps = DashboardDeps(state=StateStore(state_dir),
                         open_runners=lambda m: open_runners(m, known_hosts, accept_new_host_keys, nodes=[m.head.name]),
                         open_dashboard=open_dashboard)  # fmt: skip
    with dashboard_tunnel(manifest, deps) as tunnel:
        if as_json:  # one line, so that a script can read it while the tunnel stays open
            token_file = str(tunnel.token_file) if tunnel.token_file else None
            click.echo(json.dumps({"cluster": manifest.name, "head": manifest.head.name, "url": tunnel.url,
                                   "ray_version": tunnel.ray_version, "token_file": token_file}))  # fmt: skip
        else:
            click.echo(f"Ray dashboard of {manifest.name} (ray {tunnel.ray_version or '?'}, head {manifest.head.name}): {tunnel.url}")
            if tunnel.token_file is not None:
                click.echo(f"it asks for the cluster's token: it is in {tunnel.token_file} (cat it; orch does not print it)")
            click.echo("the tunnel stays open until Ctrl-C")
        try:
            # Wake every half second: Ctrl-C's SIGINT may land on one of the tunnel's threads, and
            # Python raises KeyboardInterrupt only when the main thread runs again.
            idle = threading.Event()
            while not idle.wait(0.5):
                pass
        except KeyboardInterrupt:
            click.echo("tunnel closed", err=True)
