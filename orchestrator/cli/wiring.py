"""What every command shares to reach a cluster: which manifest, orch's known_hosts, the real
dependencies of the workflows, and the progress display. CLI wiring only: no domain logic.

Heavy imports (paramiko through ``remote``, httpx through the Serve client) stay inside the
functions so that ``orch --help`` and ``orch validate`` stay fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.output import console
from orchestrator.errors import ClusterNotUp, StateError, UsageError

if TYPE_CHECKING:
    from orchestrator.manifest.model import Manifest
    from orchestrator.workflows.cluster import ClusterDeps
    from orchestrator.workflows.model_sync import SyncDeps
    from orchestrator.workflows.rollout import ServingDeps

Progress = Callable[[str], None]


def known_hosts_path(manifest: Manifest, state_dir: Path) -> Path:
    """The manifest's ssh.known_hosts, else orch's own file in the state dir."""
    return Path(manifest.ssh.known_hosts) if manifest.ssh.known_hosts else state_dir / "known_hosts"


def resolve_manifest(cluster_yaml: Path | None, state_dir: Path, command: str) -> Manifest:
    """Which manifest a command acts on: CLUSTER_YAML when given; else the one cluster that
    `orch up` recorded as up: its file when it still exists, else the manifest recorded at
    bring-up. No cluster up, or several, is a usage error that says how to name one."""
    from orchestrator.manifest.load import load_manifest, load_manifest_file
    from orchestrator.state import StateStore

    if cluster_yaml is not None:
        return load_manifest_file(cluster_yaml)
    up = [c for c in StateStore(state_dir).list_clusters() if c.state == "up"]
    if not up:
        raise ClusterNotUp(f"no cluster is up in {state_dir}", hint=f"pass CLUSTER_YAML (orch {command} cluster.yaml), or run `orch up CLUSTER_YAML` first")
    if len(up) > 1:
        names = ", ".join(c.name for c in up)
        raise UsageError(f"{len(up)} clusters are up ({names}); say which", hint=f"pass its CLUSTER_YAML: orch {command} cluster.yaml")
    rec = up[0]
    if rec.manifest_path and Path(rec.manifest_path).is_file():
        return load_manifest_file(Path(rec.manifest_path))
    if rec.manifest_json:
        return load_manifest(rec.manifest_json, Path(rec.manifest_path or f"{rec.name}.yaml"))
    raise StateError(f"cluster {rec.name!r} has no manifest recorded", hint=f"pass CLUSTER_YAML: orch {command} cluster.yaml")


def cluster_deps(manifest: Manifest, state_dir: Path, accept_new_host_keys: bool, progress: Progress) -> ClusterDeps:
    """The real dependencies of the cluster workflows (up, down, status)."""
    from orchestrator.remote.connect import open_runners
    from orchestrator.state import StateStore
    from orchestrator.workflows.cluster import ClusterDeps

    known_hosts = known_hosts_path(manifest, state_dir)
    return ClusterDeps(
        state=StateStore(state_dir),
        open_runners=lambda m: open_runners(m, known_hosts, accept_new_host_keys),
        progress=progress,
    )


def model_sync_deps(manifest: Manifest, state_dir: Path, accept_new_host_keys: bool, progress: Callable[[Any], None]) -> SyncDeps:
    """The real dependencies of `orch model sync` (and `orch rollout --sync-model`): SSH runners
    with orch's known_hosts, and this machine for ``--from local``."""
    from orchestrator.remote.connect import open_runners
    from orchestrator.remote.local import LocalRunner
    from orchestrator.workflows.model_sync import SyncDeps

    known_hosts = known_hosts_path(manifest, state_dir)
    return SyncDeps(
        open_runners=lambda m: open_runners(m, known_hosts, accept_new_host_keys),
        local=LocalRunner("local"),
        local_python=sys.executable,
        progress=progress,
    )


def rollout_deps(manifest: Manifest, state_dir: Path, progress: Progress) -> ServingDeps:
    """The real dependencies of the rollout workflows (rollout, rollback)."""
    from orchestrator.cli.cluster_apis import open_cluster_apis
    from orchestrator.remote.connect import open_runners
    from orchestrator.serve.ray_io.validate import validate_app
    from orchestrator.state import StateStore
    from orchestrator.workflows.rollout import ServingDeps

    known_hosts = known_hosts_path(manifest, state_dir)
    return ServingDeps(
        state=StateStore(state_dir),
        open_runners=lambda m: open_runners(m, known_hosts),
        open_apis=open_cluster_apis,
        validate=validate_app,
        progress=progress,
        environ=os.environ,  # where the secrets of a stored config (rollback, restore) come from
    )


@contextmanager
def progress_display(enabled: bool = True) -> Iterator[Progress]:
    """A progress callback: a rich spinner on a terminal, one plain line per step otherwise."""
    err = console(stderr=True)
    if not enabled:
        yield lambda _m: None
        return
    if not err.is_terminal:
        yield lambda m: err.print(f"- {m}", markup=False)
        return
    with err.status("starting", spinner="dots") as status:

        def show(message: str) -> None:
            err.print(f"[dim]-[/dim] {message}", markup=True, highlight=False)
            status.update(message)

        yield show


def resolve_load_target(
    state_dir: Path,
    cluster_yaml: Path | None,
    url: str | None,
    model: str | None,
    api_key_env: str | None,
    metrics_url: tuple[str, ...],
) -> dict:
    """URL, model, API key and metrics pages from the flags and, when given, the manifest."""
    from orchestrator.bench import target as bench_target

    manifest = None
    if cluster_yaml is not None:
        from orchestrator.manifest.load import load_manifest_file

        manifest = load_manifest_file(cluster_yaml)
    if url is None and manifest is None:
        raise UsageError("no endpoint: give CLUSTER_YAML or --url", hint="e.g. orch bench --url http://127.0.0.1:8000")
    base = (url or manifest.serve_url()).rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    key_var = api_key_env or (manifest.serve.api_key_env if manifest else None)
    api_key = bench_target.api_key_from_env(key_var)
    if model is None:
        models = bench_target.served_models(base, api_key)
        if not models:
            raise UsageError(f"{base}/v1/models lists no model", hint="pass --model NAME")
        if len(models) > 1:  # several models behind orch's front: which one is the user's to say
            raise UsageError(f"{base} serves {len(models)} models ({', '.join(models)}): name the one to measure",
                             hint=f"pass --model {models[0]}")  # fmt: skip
        model = models[0]
    metrics = list(metrics_url)
    settle_s = 5.0  # a bare vLLM's page is current at once
    if not metrics and manifest is not None:
        settle_s = 30.0  # Ray exports every few seconds: wait for the run to show up
        from orchestrator.remote.connect import connect

        runner = connect(manifest, manifest.head, known_hosts_path(manifest, state_dir))
        try:
            metrics = bench_target.discover_metrics_urls(runner, manifest)
        finally:
            runner.close()
    if not metrics and url is not None and manifest is None:
        metrics = [f"{base}/metrics"]  # a bare vLLM server serves its own metrics
    targets = manifest.targets.model_dump() if manifest and manifest.targets else {}
    return {"url": base, "model": model, "api_key": api_key, "metrics": tuple(metrics), "targets": targets, "manifest": manifest,
            "settle_s": settle_s}  # fmt: skip
