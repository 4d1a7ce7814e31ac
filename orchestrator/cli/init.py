"""`orch init [FILE]`: write a commented starter manifest; with --hosts, filled in by probing the
hosts over SSH. CLI only: flags, the file, what it says.

Without --hosts the file holds placeholders to edit (a valid manifest as written). With
``--hosts h1,h2 --user U`` each host is probed (``workflows/init.py``) and the file says what was
found. An existing file is never overwritten without --force; the text is checked by loading it
before it is written.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import click


def _hosts(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    if not hosts:
        raise click.BadParameter("give one or more hosts separated by commas, e.g. 10.0.0.1,10.0.0.2", param_hint="--hosts")
    if len(set(hosts)) != len(hosts):
        raise click.BadParameter(f"a host is listed twice: {text}", param_hint="--hosts")
    return hosts


@click.command("init")
@click.argument("file", required=False, default="cluster.yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--hosts", default=None, metavar="H1,H2,...", help="Probe these hosts over SSH and fill in the nodes (the first is the head).")
@click.option("--user", default=None, help="SSH user of every node [default: root].")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="SSH port of every node [default: 22].")
@click.option("--identity-file", type=click.Path(dir_okay=False), default=None, help="SSH private key [default: ssh-agent and ~/.ssh keys].")
@click.option("--known-hosts", type=click.Path(dir_okay=False), default=None, help="known_hosts file to verify host keys with [default: orch's own].")
@click.option("--python", default=None, help="Interpreter with ray[llm] and vLLM on every node [default: python3].")
@click.option("--temp-dir", default=None, help="Ray's temp dir on the nodes (ray.temp_dir) [default: /tmp/ray].")
@click.option("--name", default=None, help="The cluster's name [default: the file's name without .yaml].")
@click.option("--accept-new-host-keys", is_flag=True, help="Record the host key of hosts contacted for the first time.")
@click.option("--force", is_flag=True, help="Overwrite FILE if it exists.")
@click.pass_context
def init(ctx: click.Context, file: Path, hosts: str | None, user: str | None, port: int | None, identity_file: str | None,
         known_hosts: str | None, python: str | None, temp_dir: str | None, name: str | None, accept_new_host_keys: bool,
         force: bool) -> None:  # fmt: skip
    """Write a commented starter manifest to FILE [default: cluster.yaml].

    \b
    Examples:
      orch init                                   # placeholders to edit
      orch init --hosts 10.0.0.11,10.0.0.12 --user ubuntu --accept-new-host-keys
    With --hosts, each host is probed over SSH (preflight's probes: nvidia-smi, ip -j addr,
    /sys/class/infiniband) and the file gets its GPUs, gpu_type, the interface that carries its
    address and its active InfiniBand ports. Exit 2 when FILE exists (without --force), 4 when
    a host cannot be reached (nothing is written).
    """
    from orchestrator.cli.wiring import known_hosts_path, progress_display
    from orchestrator.errors import UsageError
    from orchestrator.manifest.load import load_manifest
    from orchestrator.nodes.starter import StarterSettings, placeholder_nodes, render_starter

    if file.exists() and not force:
        raise UsageError(f"{file} exists; orch init never overwrites a manifest", hint="pass --force, or name another FILE")
    host_list = _hosts(hosts)
    settings = StarterSettings(
        name=name or (file.stem if file.suffix in (".yaml", ".yml") and file.stem else "my-cluster"), user=user, port=port,
        identity_file=str(Path(identity_file).expanduser().absolute()) if identity_file else None,
        known_hosts=str(Path(known_hosts).expanduser().absolute()) if known_hosts else None,
        python=python, temp_dir=temp_dir, hosts=host_list,
        command="orch init" + (f" --hosts {','.join(host_list)}" if host_list else ""),
    )  # fmt: skip
    if host_list:
        from orchestrator.remote.connect import open_runners
        from orchestrator.workflows.init import InitDeps, probe_hosts, provisional_manifest

        state_dir: Path = ctx.obj["state_dir"]
        verify_with = known_hosts_path(provisional_manifest(settings), state_dir)
        with progress_display() as progress:
            deps = InitDeps(open_runners=lambda m: open_runners(m, verify_with, accept_new_host_keys), progress=progress)
            nodes, accelerator = probe_hosts(settings, deps)
    else:
        nodes, accelerator = placeholder_nodes(), "gpu"
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = render_starter(settings, nodes, accelerator, when)
    manifest = load_manifest(text, file)  # orch's own output must be a valid manifest
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text)
    click.echo(f"wrote {file}: {manifest.summary()}")
    for node in nodes:
        for note in node.notes:
            click.echo(f"note: {node.name}: {note}")
    click.echo(f"next: read it, then `orch validate {file}` and `orch up {file}`" + ("" if host_list else " (edit the placeholders first)"))
