"""How long `orch status` waits for its readiness probe once everything else is read. Pure.

`orch status` sends its readiness completion in the background while it reads Ray, Serve and the
nodes (``orchestrator.workflows.status``). A healthy but loaded engine gets the probe's whole
timeout. When the reads already show that no engine replica of the serving application can
answer (each one has a failing problem: a worker on a DEAD node, a lost engine worker, a replica
that is not RUNNING), the probe can only fail or hang until its timeout: measured on the test bed,
it hung its full 20 s after the host of a tensor-parallel worker died, and that wait was most of
the time `orch status` took to show the outage. Then status waits only ``BROKEN_GRACE_S`` for it.
"""

from __future__ import annotations

from orchestrator.status.serving import model_of_deployment
from orchestrator.status.views import ServingStatus

BROKEN_GRACE_S = 2.0


def replicas_all_failing(report: ServingStatus) -> bool:
    """True when the application has engine replicas (``LLMServer:<model>``, else any) and every
    one of them has a problem of severity ``fail`` about it."""
    deployments = [d for d in report.deployments if model_of_deployment(d.name) is not None] or list(report.deployments)
    replicas = [r.replica_id for d in deployments for r in d.replicas]
    failing = {p.subject for p in report.problems if p.severity == "fail"}
    return bool(replicas) and all(r in failing for r in replicas)


def probe_wait_s(report: ServingStatus, remaining_s: float, grace_s: float = BROKEN_GRACE_S) -> float:
    """Seconds to keep waiting for a probe that has ``remaining_s`` left of its timeout."""
    return min(remaining_s, grace_s) if replicas_all_failing(report) else remaining_s
