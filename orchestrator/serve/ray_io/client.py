"""Ray Serve's REST API on the dashboard: apply, read status, delete. Typed values + httpx client.

Does I/O (HTTP) in ``ServeClient`` only; ``parse_serve_status`` and the value classes are pure and
tested against real answers of Ray 2.60 (tests/data/serve/). The dashboard is reached on the
head's 127.0.0.1 through an SSH tunnel (``open_serve_client`` uses the runner's ``forward``, as
``cluster.dashboard.open_dashboard`` does) with the cluster's bearer token.

Serve's REST API is declarative: ``PUT /api/serve/applications/`` takes the full list of
applications; an application missing from the list is deleted, one whose import path, runtime
env and args are unchanged keeps its replicas (only its route or deployment options change).
The side-by-side rollout relies on both.

Deployed configs hold the endpoint's API key (vLLM's ``api_key`` in engine_kwargs): they are kept
in ``AppStatus.deployed_config`` for re-applying unchanged apps, and ``to_dict`` redacts them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchestrator.cluster.dashboard import DashboardClient
from orchestrator.errors import ServeError
from orchestrator.runbooks import runbook
from orchestrator.serve.fingerprint import mask_api_key

APPLICATIONS_PATH = "/api/serve/applications/"
RUNBOOK = runbook("SERVE_API_ERROR")

# Application states (ray.serve._private.common.ApplicationStatus).
APP_NOT_STARTED = "NOT_STARTED"
APP_DEPLOYING = "DEPLOYING"
APP_RUNNING = "RUNNING"
APP_DEPLOY_FAILED = "DEPLOY_FAILED"
APP_UNHEALTHY = "UNHEALTHY"
APP_DELETING = "DELETING"


class ServeApiError(ServeError):
    """The dashboard refused or failed a Serve REST call; ``status_code`` is the HTTP status
    (None when nothing answered)."""

    def __init__(self, message: str, hint: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message, hint)
        self.status_code = status_code


@dataclass(frozen=True)
class ReplicaStatus:
    replica_id: str
    state: str  # STARTING | RUNNING | RECOVERING | STOPPING | PENDING_MIGRATION ...
    node_id: str | None = None
    node_ip: str | None = None
    actor_name: str | None = None
    worker_id: str | None = None
    pid: int | None = None
    log_file_path: str | None = None  # relative to the node's session logs dir ("/serve/replica_...log")
    # When its actor started (Unix s; Serve's ReplicaDetails.start_time_s): a restart is a new time.
    start_time_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "state": self.state,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": self.pid,
            "log_file_path": self.log_file_path,
            "start_time_s": self.start_time_s,
        }


@dataclass(frozen=True)
class DeploymentStatus:
    name: str
    status: str  # UPDATING | HEALTHY | UNHEALTHY | DEPLOY_FAILED | UPSCALING | DOWNSCALING
    status_trigger: str = ""
    message: str = ""
    target_replicas: int | None = None
    replicas: tuple[ReplicaStatus, ...] = ()
    max_ongoing_requests: int | None = None  # Serve's cap per replica, as deployed

    def replica_states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.replicas:
            counts[r.state] = counts.get(r.state, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "status_trigger": self.status_trigger,
            "message": self.message,
            "target_replicas": self.target_replicas,
            "max_ongoing_requests": self.max_ongoing_requests,
            "replicas": [r.to_dict() for r in self.replicas],
        }


@dataclass(frozen=True)
class AppStatus:
    name: str
    status: str
    message: str = ""
    route_prefix: str | None = None
    last_deployed_time_s: float | None = None
    deployments: tuple[DeploymentStatus, ...] = ()
    deployed_config: dict[str, Any] = field(default_factory=dict, repr=False)  # holds the key

    @property
    def failed(self) -> bool:
        return self.status in (APP_DEPLOY_FAILED, APP_UNHEALTHY)

    def deployment(self, name: str) -> DeploymentStatus | None:
        return next((d for d in self.deployments if d.name == name), None)

    def summary(self) -> str:
        """One line: `orch-r2 DEPLOYING; LLMServer:tiny UPDATING (1 STARTING); LLMRouter HEALTHY (1 RUNNING)`."""
        parts = [f"{self.name} {self.status}"]
        for d in self.deployments:
            states = ", ".join(f"{n} {s}" for s, n in sorted(d.replica_states().items()))
            parts.append(f"{d.name} {d.status}" + (f" ({states})" if states else ""))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "route_prefix": self.route_prefix,
            "last_deployed_time_s": self.last_deployed_time_s,
            "deployments": [d.to_dict() for d in self.deployments],
            "deployed_config": mask_api_key(self.deployed_config),
        }


@dataclass(frozen=True)
class ServeStatus:
    applications: dict[str, AppStatus] = field(default_factory=dict)
    http_port: int | None = None
    proxies: dict[str, str] = field(default_factory=dict)  # node id -> HEALTHY/UNHEALTHY/...

    def app(self, name: str) -> AppStatus | None:
        return self.applications.get(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "http_port": self.http_port,
            "proxies": dict(self.proxies),
            "applications": {n: a.to_dict() for n, a in self.applications.items()},
        }


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        out = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return out if out is not None and math.isfinite(out) else None


def parse_serve_status(payload: Any) -> ServeStatus:
    """``GET /api/serve/applications/`` (Ray 2.60's ServeInstanceDetails JSON) -> ServeStatus.

    Serve not started yet answers without applications (or with ``{}``): an empty status."""
    if not isinstance(payload, Mapping):
        raise ServeApiError("the Serve API answered something that is not a JSON object")
    apps: dict[str, AppStatus] = {}
    for name, app in (payload.get("applications") or {}).items():
        deployments = []
        for dname, dep in (app.get("deployments") or {}).items():
            replicas = tuple(
                ReplicaStatus(
                    replica_id=str(r.get("replica_id") or ""),
                    state=str(r.get("state") or "UNKNOWN"),
                    node_id=r.get("node_id"),
                    node_ip=r.get("node_ip"),
                    actor_name=r.get("actor_name"),
                    worker_id=r.get("worker_id"),
                    pid=_int(r.get("pid")),
                    log_file_path=r.get("log_file_path"),
                    start_time_s=_float(r.get("start_time_s")),
                )
                for r in dep.get("replicas") or []
            )
            deployments.append(
                DeploymentStatus(
                    name=str(dep.get("name") or dname),
                    status=str(dep.get("status") or "UNKNOWN"),
                    status_trigger=str(dep.get("status_trigger") or ""),
                    message=str(dep.get("message") or ""),
                    target_replicas=_int(dep.get("target_num_replicas")),
                    replicas=replicas,
                    max_ongoing_requests=_int((dep.get("deployment_config") or {}).get("max_ongoing_requests")),
                )
            )
        apps[str(name)] = AppStatus(
            name=str(app.get("name") or name),
            status=str(app.get("status") or "UNKNOWN"),
            message=str(app.get("message") or ""),
            route_prefix=app.get("route_prefix"),
            last_deployed_time_s=app.get("last_deployed_time_s"),
            deployments=tuple(deployments),
            deployed_config=dict(app.get("deployed_app_config") or {}),
        )
    http = payload.get("http_options") or {}
    proxies = {str(k): str((v or {}).get("status") or "") for k, v in (payload.get("proxies") or {}).items()}
    return ServeStatus(applications=apps, http_port=_int(http.get("port")), proxies=proxies)


def failure_messages(app: AppStatus) -> list[str]:
    """The errors Serve recorded for an application and its deployments (the replica's own
    traceback ends up in the deployment message after its constructor failed)."""
    out = []
    if app.message.strip():
        out.append(app.message.strip())
    for d in app.deployments:
        if d.message.strip() and d.status in ("DEPLOY_FAILED", "UNHEALTHY"):
            out.append(f"{d.name}: {d.message.strip()}")
    return out


# How Serve's controller words a replica that failed to start (ray/serve/_private/
# deployment_state.py, Ray 2.60: record_replica_startup_failure while it retries, then the
# REPLICA_STARTUP_FAILED transition once the retries are spent, alone or during a rolling update).
STARTUP_RETRYING = "A replica failed to start with exception."
STARTUP_GAVE_UP = "The deployment failed to start "
_RETRIES_LEFT = re.compile(r"Retrying (\d+) more time\(s\)")
# The failed replica's process, as Ray names it in a task error's header ("ray::ServeReplica:
# orch-r3:LLMServer:tiny.initialize_and_get_metadata() (pid=28768, ip=192.0.2.2, actor_id=...")
# or in an ActorDiedError ("class_name: ServeReplica:... pid: 28768 ... ip: 192.0.2.2").
_REPLICA_PROCESS = (
    re.compile(r"ray::ServeReplica:\S*\s+\(pid=(\d+), ip=([0-9A-Fa-f.:]+)"),
    re.compile(r"class_name: ServeReplica:.*?\bpid: (\d+)\b.*?\bip: ([0-9A-Fa-f.:]+)", re.DOTALL),
)


@dataclass(frozen=True)
class StartupFailure:
    """A replica of ``deployment`` failed to start, as Serve's deployment message says.

    ``retries_left``: the attempts Serve still makes (0 once it gave up; None when the message
    does not say, as after a replica of this version has already run). ``error``: the replica's
    own error (what follows "Error:"); ``pid``/``node_ip``: the failed replica's process, whose
    worker log on that node holds the engine's lines (None when the error does not name it)."""

    deployment: str
    message: str
    error: str
    retries_left: int | None
    pid: int | None = None
    node_ip: str | None = None


def startup_failures(app: AppStatus) -> list[StartupFailure]:
    """The deployments of ``app`` whose message says a replica failed to start (retrying or not)."""
    out = []
    for d in app.deployments:
        text = d.message.strip()
        if not text.startswith((STARTUP_RETRYING, STARTUP_GAVE_UP)):
            continue
        _, sep, error = text.partition("Error:")
        retries = _RETRIES_LEFT.search(text.split("Error:", 1)[0])
        left = int(retries.group(1)) if retries else (0 if text.startswith(STARTUP_GAVE_UP) else None)
        proc = next((m for m in (p.search(error) for p in _REPLICA_PROCESS) if m), None)
        out.append(StartupFailure(d.name, text, error.strip() if sep else "", left,
                                  int(proc.group(1)) if proc else None, proc.group(2) if proc else None))  # fmt: skip
    return out


class ServeClient(DashboardClient):
    """Synchronous client of Serve's REST API on a dashboard URL (the tunnel's local end); the
    connection, token header and lifetime are the dashboard client's, the errors are Serve's."""

    def __init__(self, base_url: str, token: str | None, timeout: float = 30.0, transport: Any = None) -> None:
        super().__init__(base_url, token, timeout=timeout, transport=transport)

    def _unavailable(self, what: str, exc: httpx.TransportError) -> ServeApiError:
        return ServeApiError(
            f"the Ray dashboard at {self.base_url} did not answer {what}: {type(exc).__name__}",
            hint="is the cluster up? `orch status` shows it; `orch up CLUSTER_YAML` starts it",
        )

    def _refused(self, what: str, status_code: int) -> ServeApiError:
        return ServeApiError(
            f"the Ray dashboard refused orch's token ({status_code} on {what})",
            hint="the cluster was started with another token; `orch down` then `orch up` restarts it",
            status_code=status_code,
        )

    def _call(self, method: str, json_body: Any = None) -> Any:
        resp = self._send(method, APPLICATIONS_PATH, f"{method} {APPLICATIONS_PATH}", json=json_body)
        if resp.status_code >= 400:
            # Serve answers a refused config with its validation error as text: show its end.
            text = resp.text.strip()
            tail = text[-1500:] if len(text) > 1500 else text
            raise ServeApiError(
                f"Serve refused {method} {APPLICATIONS_PATH} ({resp.status_code}): {tail}",
                hint=f"see {RUNBOOK}",
                status_code=resp.status_code,
            )
        if method == "GET":
            try:
                return resp.json()
            except ValueError as exc:
                raise ServeApiError("the Serve API answered something that is not JSON") from exc
        return None

    def apply(self, body: Mapping[str, Any]) -> None:
        """PUT the full list of applications (those not listed are deleted by Serve)."""
        self._call("PUT", dict(body))

    def status(self) -> ServeStatus:
        return parse_serve_status(self._call("GET"))

    def shutdown(self) -> None:
        """DELETE: remove every application and stop Serve on the cluster."""
        self._call("DELETE")


@contextmanager
def open_serve_client(runner: Any, port: int, token: str | None, timeout: float = 30.0) -> Iterator[ServeClient]:
    """A ServeClient of the dashboard on the head's 127.0.0.1:``port``, through the runner's SSH
    tunnel when it has one (``forward``), else directly (a local head)."""
    forward = getattr(runner, "forward", None)
    local_port = forward("127.0.0.1", port) if callable(forward) else port
    client = ServeClient(f"http://127.0.0.1:{local_port}", token, timeout=timeout)
    try:
        yield client
    finally:
        client.close()
