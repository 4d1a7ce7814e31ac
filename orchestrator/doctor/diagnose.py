"""``orch doctor``: read every node's Ray session logs through its runner and name known failures.

I/O only through the runners it is given (one ``python -c`` scan per node, see
``orchestrator.doctor.logscan``); matching is pure (``orchestrator.doctor.signatures``). ``diagnose`` fans out
over the nodes: an unreachable node, or one whose logs cannot be read, becomes a finding of its
own and does not hide the others. When ``orchestrator.nodes.inventory`` and ``orchestrator.preflight.run``
are available, the facts checks that still mean something on a running cluster (an interface
named in the manifest that does not exist, too small /dev/shm, versions that differ, a missing
model path, ...) are fed into the same report, so that a log line such as Gloo's
``Unable to find address for: eth99`` comes with its cause.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.doctor.logscan import DEFAULT_GROUPS, NodeScan, ScanLimits, ScanParseError, parse_scan, scan_argv
from orchestrator.doctor.matching import DoctorFinding, LogLine, match_logs
from orchestrator.doctor.signatures import SIGNATURE_CODES, SIGNATURES
from orchestrator.errors import CommandFailedError, RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.inventory import gather_facts
from orchestrator.preflight.findings import CODES as PREFLIGHT_CODES
from orchestrator.preflight.run import run_checks
from orchestrator.remote.runner import NodeOutcome, Runner, fan_out
from orchestrator.runbooks import runbook

# Codes doctor reports about the collection itself (not log signatures).
NODE_LOGS_UNAVAILABLE = "NODE_LOGS_UNAVAILABLE"
RAY_SESSION_MISSING = "RAY_SESSION_MISSING"

# Every finding code doctor can report (the runbooks test reads this): code -> title.
CODES: dict[str, str] = {
    **SIGNATURE_CODES,
    NODE_LOGS_UNAVAILABLE: "Logs of a node could not be read (unreachable node or failed scan)",
    RAY_SESSION_MISSING: "No Ray session logs on a node (Ray never started there, or another temp dir)",
}

# Preflight codes doctor leaves out: it reports unreachable nodes itself, and a failed probe is
# noise next to the logs. Every other failing or warning facts check still describes a running
# cluster (a missing interface, too small /dev/shm, versions or model files that differ, ...).
PREFLIGHT_CODES_SKIPPED: frozenset[str] = frozenset({"NODE_UNREACHABLE", "PROBE_FAILED", "HEAD_PORT_UNREACHABLE"})

_SEVERITY_RANK = {"fail": 0, "warn": 1, "info": 2}


@dataclass(frozen=True)
class NodeLogs:
    """How the collection went on one node."""

    node: str
    reachable: bool
    session_dir: str | None = None
    files_read: int = 0
    lines_scanned: int = 0
    candidate_lines: int = 0
    skipped_files: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "reachable": self.reachable,
            "session_dir": self.session_dir,
            "files_read": self.files_read,
            "lines_scanned": self.lines_scanned,
            "candidate_lines": self.candidate_lines,
            "skipped_files": self.skipped_files,
            "error": self.error,
        }


@dataclass(frozen=True)
class DoctorReport:
    cluster: str
    findings: tuple[DoctorFinding, ...]
    nodes: tuple[NodeLogs, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def failed(self) -> bool:
        return any(f.severity == "fail" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "ok": not self.failed,
            "findings": [f.to_dict() for f in self.findings],
            "nodes": [n.to_dict() for n in self.nodes],
            "notes": list(self.notes),
        }


def node_temp_dirs(manifest: Manifest, node: Any) -> list[str]:
    """Where the node's Ray session may live, most specific first.

    ``ray.temp_dir`` of the manifest; a per-node subfolder ``<temp_dir>/<node name>`` first, because
    hosts that share one filesystem (the test bed, or NFS homes) need one temp dir per node.
    """
    base = str(manifest.ray.temp_dir)
    return [posixpath.join(base, node.name), base]


def _node_spec(manifest: Manifest, name: str) -> Any:
    for node in manifest.nodes:
        if node.name == name:
            return node
    raise KeyError(name)


def _keywords() -> list[str]:
    return sorted({k for sig in SIGNATURES for k in sig.keywords})


def scan_node(
    runner: Runner,
    manifest: Manifest,
    limits: ScanLimits = ScanLimits(),
    since_s: float | None = None,
    temp_dirs: list[str] | None = None,
    timeout: float = 120.0,
) -> NodeScan:
    """Run the bounded log scan on one node (raises RemoteError subclasses)."""
    node = _node_spec(manifest, runner.node)
    argv = scan_argv(
        node.python_bin(manifest),
        temp_dirs if temp_dirs is not None else node_temp_dirs(manifest, node),
        _keywords(),
        limits=limits,
        since_s=since_s,
        groups=DEFAULT_GROUPS,
    )
    result = runner.run(argv, timeout=timeout)
    result.check(runner.node)
    try:
        return parse_scan(runner.node, result.stdout)
    except ScanParseError as exc:
        raise CommandFailedError(str(exc), node=runner.node) from exc


def collect_logs(
    runner: Runner,
    node: str,
    manifest: Manifest,
    limits: ScanLimits = ScanLimits(),
    since_s: float | None = None,
) -> list[LogLine]:
    """The candidate log lines of the node's current Ray session (bounded; see ``logscan``)."""
    if runner.node != node:
        raise ValueError(f"runner is for {runner.node!r}, not {node!r}")
    return list(scan_node(runner, manifest, limits=limits, since_s=since_s).lines)


def _unavailable(node: str, error: RemoteError) -> DoctorFinding:
    return DoctorFinding(
        code=NODE_LOGS_UNAVAILABLE,
        node=node,
        file="-",
        line_no=None,
        evidence=f"{type(error).__name__}: {error.message}",
        hint=(error.hint + "; " if error.hint else "")
        + f"reach the node over SSH, then rerun `orch doctor`; see {runbook(NODE_LOGS_UNAVAILABLE)}",
        severity="fail",
        title=CODES[NODE_LOGS_UNAVAILABLE],
        component="system",
    )


def _no_session(node: str, temp_dirs: list[str]) -> DoctorFinding:
    return DoctorFinding(
        code=RAY_SESSION_MISSING,
        node=node,
        file="-",
        line_no=None,
        evidence="no session_latest/logs under " + " or ".join(temp_dirs),
        hint=f"was `orch up` run for this manifest (same ray.temp_dir)? see {runbook(RAY_SESSION_MISSING)}",
        severity="warn",
        title=CODES[RAY_SESSION_MISSING],
        component="ray",
    )


def preflight_findings(manifest: Manifest, runners: list[Runner]) -> tuple[list[DoctorFinding], list[str]]:
    """Facts checks that still hold on a running cluster, as doctor findings."""
    # No head_address: the head-port test needs a listener arranged before Ray starts.
    outcomes = fan_out(runners, lambda r: gather_facts(r, _node_spec(manifest, r.node), manifest))
    facts = {o.node: o.value for o in outcomes if o.ok and o.value is not None}
    notes = [f"{o.node}: facts not gathered: {o.error}" for o in outcomes if not o.ok]
    if not facts:
        return [], notes
    out: list[DoctorFinding] = []
    for f in run_checks(manifest, facts):
        if f.code in PREFLIGHT_CODES_SKIPPED or f.severity not in ("fail", "warn"):
            continue
        if f.node is not None and f.node not in facts:
            continue
        out.append(
            DoctorFinding(
                code=f.code,
                node=f.node or "-",
                file="preflight",
                line_no=None,
                evidence=f.message,
                hint=f.hint or f"see {runbook(f.code)}",
                severity=f.severity,
                title=_preflight_title(f.code),
                component="system",
                source="preflight",
            )
        )
    return out, notes


def _preflight_title(code: str) -> str:

    return PREFLIGHT_CODES.get(code, code)


def diagnose(
    manifest: Manifest,
    runners: Mapping[str, Runner] | Iterable[Runner],
    limits: ScanLimits = ScanLimits(),
    since_s: float | None = None,
    with_preflight: bool = True,
) -> DoctorReport:
    """Scan every given node's logs in parallel and match the known signatures."""
    runner_list = list(runners.values()) if isinstance(runners, Mapping) else list(runners)
    outcomes: list[NodeOutcome[NodeScan]] = fan_out(
        runner_list, lambda r: scan_node(r, manifest, limits=limits, since_s=since_s)
    )
    findings: list[DoctorFinding] = []
    nodes: list[NodeLogs] = []
    lines: list[LogLine] = []
    reachable: list[Runner] = []
    by_name = {r.node: r for r in runner_list}
    for outcome in outcomes:
        if not outcome.ok:
            assert outcome.error is not None
            findings.append(_unavailable(outcome.node, outcome.error))
            nodes.append(NodeLogs(node=outcome.node, reachable=False, error=str(outcome.error)))
            continue
        scan = outcome.value
        assert scan is not None
        reachable.append(by_name[outcome.node])
        if scan.session_dir is None:
            findings.append(_no_session(outcome.node, node_temp_dirs(manifest, _node_spec(manifest, outcome.node))))
        lines.extend(scan.lines)
        nodes.append(
            NodeLogs(
                node=outcome.node,
                reachable=True,
                session_dir=scan.session_dir,
                files_read=len(scan.files),
                lines_scanned=scan.lines_scanned,
                candidate_lines=len(scan.lines),
                skipped_files=scan.skipped_files,
            )
        )
    findings.extend(match_logs(lines, SIGNATURES))
    notes: list[str] = []
    if with_preflight and reachable:
        pre, notes = preflight_findings(manifest, reachable)
        findings.extend(pre)
    findings.sort(key=lambda f: (_SEVERITY_RANK.get(f.severity, 3), f.node, f.source, f.code))
    return DoctorReport(cluster=manifest.name, findings=tuple(findings), nodes=tuple(nodes), notes=tuple(notes))
