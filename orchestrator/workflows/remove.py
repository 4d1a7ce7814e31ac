"""`orch remove NAME CLUSTER`: stop serving one model and free what its replicas held; Ray and
the cluster stay up.

Each served model is its own Serve application (``workflows/served_models.py``): NAME is a
served name (what requests name in ``model``) with a ready revision. Under the cluster lock, one
Serve PUT keeps every other application as Serve runs it (the other models are not restarted) and
leaves out NAME's application and any candidate of an unfinished rollout of it (``orch-rN``); the
revision is recorded ``removed`` at once (nothing serves it from then on), then orch waits until
Serve has deleted the applications. A later `orch rollout` of NAME deploys fresh; `orch rollback`
brings the removed revision back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator import cluster_lock
from orchestrator.errors import ServeError, UsageError
from orchestrator.manifest.model import Manifest
from orchestrator.polling import poll_until
from orchestrator.serve import decisions
from orchestrator.state import Revision
from orchestrator.workflows.front_steps import front_without
from orchestrator.workflows.rollout_steps import ServingDeps, put, serving_now
from orchestrator.workflows.served_models import served_name_of, serving_by_name


@dataclass(frozen=True)
class RemoveOptions:
    dry_run: bool = False
    timeout_s: float = 300.0  # for Serve to delete the applications
    poll_s: float = 2.0


@dataclass
class RemoveResult:
    cluster: str
    model: str
    revision: int
    apps: list[str]  # the Serve applications left out of the PUT
    kept: list[str]  # the other applications, untouched
    action: str = "removed"  # or dry_run
    seconds: float | None = None
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "model": self.model, "revision": self.revision, "apps": self.apps,
                "kept": self.kept, "action": self.action, "seconds": self.seconds, "steps": self.steps}  # fmt: skip


def remove(manifest: Manifest, name: str, deps: ServingDeps, options: RemoveOptions = RemoveOptions()) -> RemoveResult:
    """Remove the model served as ``name`` (see the module doc). UsageError (exit 2) when nothing
    or another model is served; ServeError when Serve refuses or does not delete in time."""
    _served_as(manifest, name, deps)  # refused before any SSH
    if options.dry_run:
        return _run(manifest, name, deps, options)
    with cluster_lock.hold(deps.state.cluster_dir(manifest.name), manifest.name, "remove", deps.wall_clock):
        return _run(manifest, name, deps, options)


def _served_as(manifest: Manifest, name: str, deps: ServingDeps) -> Revision:
    """The ready revision that serves ``name``; else UsageError naming what serves."""
    serving = serving_by_name(deps.state, manifest.name)
    if name in serving:
        return serving[name]
    if not serving:
        raise UsageError(f"cluster {manifest.name!r} serves no model: nothing to remove", hint="orch status shows what runs")
    listed = ", ".join(f"{n!r} (revision {r.number})" for n, r in sorted(serving.items()))
    raise UsageError(f"cluster {manifest.name!r} serves no model named {name!r}; it serves {listed}",
                     hint=f"orch remove {sorted(serving)[0]} ...")  # fmt: skip


def _run(manifest: Manifest, name: str, deps: ServingDeps, options: RemoveOptions) -> RemoveResult:
    token = deps.state.read_token(manifest.name) if manifest.ray.token_auth else None
    with deps.open_runners(manifest) as runners, deps.open_apis(manifest, runners, token) as apis:
        status = apis.serve.status()
        current = _served_as(manifest, name, deps)  # again under the lock: another command may have changed it
        _, serving = serving_now(deps.state, manifest.name, status, name)
        # a candidate goes unless it is another model's (one left with no record goes too)
        theirs = {r.number for r in deps.state.list_revisions(manifest.name) if served_name_of(deps.state, manifest.name, r) != name}
        gone = sorted(n for n in status.applications
                      if n == serving.app_name or decisions.revision_of_app(n) not in (None, *theirs))  # fmt: skip
        kept = sorted(n for n in status.applications if n not in gone)
        unknown = [n for n in kept if not status.applications[n].deployed_config]
        if unknown and not options.dry_run:
            raise ServeError(f"Serve reports no deployed config for {', '.join(unknown)}: a PUT without it would delete it",
                             hint="orch status; remove it with Serve's own tools first")  # fmt: skip
        # The front routes to the models left; with none left it goes too.
        body = front_without([dict(status.applications[n].deployed_config or {"name": n}) for n in kept], manifest)
        gone = sorted({*gone, *(set(kept) - {a["name"] for a in body})})
        kept = sorted(a["name"] for a in body)
        result = RemoveResult(manifest.name, name, current.number, gone, kept, action="dry_run" if options.dry_run else "removed")
        if options.dry_run:
            return result
        t0 = deps.clock()
        step = _stepper(result, deps.progress)
        step(f"removing {', '.join(gone) or 'nothing (not in Serve)'} (revision {current.number}, '{name}'); keeping {', '.join(kept) or 'no other application'}")
        put(apis.serve, body, manifest)
        deps.state.update_revision(manifest.name, current.number, "removed")
        step(f"revision {current.number} recorded removed: nothing serves '{name}' now")
        waited = poll_until(lambda: set(gone) & set(apis.serve.status().applications), lambda left: not left,
                            deadline=deps.clock() + options.timeout_s, clock=deps.clock, sleep=deps.sleep, interval=options.poll_s)  # fmt: skip
        if not waited.done:
            raise ServeError(f"Serve still lists {', '.join(sorted(waited.value))} {options.timeout_s:g} s after the removal (DELETING)",
                             hint="orch status; Serve keeps deleting in the background")  # fmt: skip
        step("Serve deleted them: their replicas and the resources they held are free")
        result.seconds = round(deps.clock() - t0, 1)
        return result


def _stepper(result: RemoveResult, progress: Callable[[str], None]) -> Callable[[str], None]:
    def step(text: str) -> None:
        result.steps.append(text)
        progress(text)

    return step
