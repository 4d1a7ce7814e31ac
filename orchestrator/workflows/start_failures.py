"""While a rollout waits for its replicas: why one failed to start, and whether to stop at once.
Does I/O (one log scan on the failed replica's node, through its runner).

Serve reports a replica whose constructor failed in its deployment's message ("A replica failed
to start with exception. Retrying 2 more time(s). Error: ...", ``serve.ray_io.client.startup_failures``)
and starts another; after 3 failures in a row it gives up (DEPLOY_FAILED). Each attempt is a new
engine start, minutes on a big model. ``StartWatch`` looks at each failure Serve reports once:
first the lines of Serve's message (the replica's traceback: a missing model folder or a refused
engine argument is there), then, when they do not show the cause, the failed replica's own worker
log on its node (``worker-*-<pid>.out``/``.err``: vLLM's EngineCore writes there, and Ray forwards
the engine workers' lines of a multi-node replica there too; a Gloo/NCCL error is in that log,
not in the message, which only says the engine core failed). When a line shows a failure a retry
cannot fix (``doctor.start_cause``), the watch returns it and the rollout stops the candidate at
once; otherwise it says what failed and Serve's retries stand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.doctor.logscan import ScanLimits
from orchestrator.doctor.start_cause import StartCause, start_cause, start_keywords, text_lines
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.serve.ray_io.client import AppStatus, StartupFailure, startup_failures
from orchestrator.workflows.engine_logs import read_log_lines, worker_target

# The failed replica's two log files, read to their end: the error is among the last lines, and
# what came before (the engine's start-up) is short.
START_SCAN_LIMITS = ScanLimits(max_files=2, tail_lines=20000, max_bytes=8 * 1024 * 1024, count_prefix_bytes=64 * 1024 * 1024,
                               max_line_chars=2000, max_matches_per_file=200)  # fmt: skip


@dataclass(frozen=True)
class Stop:
    """A replica of ``deployment`` failed to start with ``cause``; Serve would have tried
    ``retries_left`` more times."""

    deployment: str
    cause: StartCause
    retries_left: int | None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln
    return lines[-1] if lines else ""


@dataclass
class StartWatch:
    """Called with the application on every poll of a rollout's wait; returns a ``Stop`` when a
    replica failed to start in a way no retry fixes. Each failure Serve reports is read once."""

    manifest: Manifest
    runners: Mapping[str, Runner]
    nodes: list  # cluster.node_state.NodeState: the Ray nodes, for the failed replica's node name
    progress: Callable[[str], None]
    seen: set[tuple[str, str]] = field(default_factory=set)

    def __call__(self, app: AppStatus) -> Stop | None:
        for failure in startup_failures(app):
            key = (failure.deployment, failure.message)
            if key in self.seen:
                continue
            self.seen.add(key)
            cause, read = self._cause(failure)
            if cause is not None:
                return Stop(failure.deployment, cause, failure.retries_left)
            retries = "" if failure.retries_left is None else f"; Serve retries it {failure.retries_left} more time(s)"
            self.progress(f"{failure.deployment}: a replica failed to start ({_last_line(failure.error) or 'no error text'})"
                          f"{retries}: nothing in {read} shows a failure a retry cannot fix")  # fmt: skip
        return None

    def _cause(self, failure: StartupFailure) -> tuple[StartCause | None, str]:
        """The cause in Serve's message, else in the replica's log; and what was read."""
        cause = start_cause(text_lines(failure.error, f"Serve's message for {failure.deployment}"), context=2)
        if cause is not None:
            return cause, "Serve's message"
        node = self._node_of(failure.node_ip)
        if node is None or failure.pid is None:
            return None, "Serve's message (it names no replica process on a manifest node)"
        ((lines, error),) = read_log_lines(self.manifest, self.runners, [worker_target(node, failure.pid)],
                                           keywords=start_keywords(), limits=START_SCAN_LIMITS)  # fmt: skip
        if lines is None:
            return None, f"Serve's message (the replica's log: {error})"
        return start_cause(lines), f"Serve's message or the replica's log on {node}"

    def _node_of(self, ip: str | None) -> str | None:
        if ip is None:
            return None
        for n in self.nodes:
            if getattr(n, "address", None) == ip and getattr(n, "name", None):
                return str(n.name)
        return next((n.name for n in self.manifest.nodes if n.host == ip), None)


def stop_text(name: str, stop: Stop) -> tuple[str, str, str]:
    """(what, detail, hint) of the rollout's error for a ``Stop`` of application ``name``."""
    c = stop.cause
    left = "" if not stop.retries_left else f" (Serve would have tried {stop.retries_left} more time(s))"
    what = f"a replica of {name} failed to start with {c.code} ({c.title}), which a retry cannot fix{left}"
    detail = f"{c.where}: {c.evidence} -- {c.reason}" if c.reason else f"{c.where}: {c.evidence}"
    return what, detail, c.hint


def stop_dict(stop: Stop) -> dict[str, Any]:
    return {"deployment": stop.deployment, "retries_left": stop.retries_left, **stop.cause.to_dict()}
