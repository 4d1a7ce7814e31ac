"""The start-up lines of a Serve LLM replica's engine, read on its node. Does I/O (through the
node's runner).

vLLM's EngineCore is a child of the replica actor and writes to the same stdout: the replica's
worker log ``<temp_dir>/session_latest/logs/worker-<worker_id>-*-<pid>.out``. The bounded scan of
``orchestrator.doctor.logscan`` (the doctor's) does the reading; only lines with one of
``KV_KEYWORDS`` travel. Used by `orch status` (KV capacity, predicted vs measured) and by `orch
rollout` (the calibration record, ``workflows.calibration``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.doctor.diagnose import node_temp_dirs
from orchestrator.doctor.logscan import NodeScan, ScanLimits, ScanParseError, parse_scan, scan_argv
from orchestrator.doctor.matching import LogLine
from orchestrator.errors import RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.status.engine_stats import DP_RANK_KEYWORDS
from orchestrator.status.serving import model_of_deployment

KV_KEYWORDS = ["KV cache size", "Maximum concurrency", " blocks: ",
               # the memory figures orch records as calibration (orchestrator.plan.calibration)
               "Model loading took", "Loading model weights took", "Available KV cache memory", "Estimated CUDA graph memory",
               "Graph capturing finished", "kv cache memory in use",
               # the platform the engine ran on (orchestrator.plan.calibration.engine_platform)
               "Automatically detected platform", "cpu_worker.py", "cpu_model_runner.py", "gpu_worker.py",
               "gpu_model_runner.py", "total_gpu_memory",
               # which data-parallel rank a DPServer replica is (orchestrator.status.engine_stats.parse_dp_rank)
               *DP_RANK_KEYWORDS]  # fmt: skip
# The capacity line comes early in the log; read up to 64 MiB of it (only matching lines travel)
# and skip counting line numbers, which would read the file twice.
KV_SCAN_LIMITS = ScanLimits(max_files=4, tail_lines=10**8, max_bytes=64 * 1024 * 1024, count_prefix_bytes=0,
                            max_line_chars=1000, max_matches_per_file=200)  # fmt: skip


def engine_replicas(app: Any, model_ids: list[str] | None = None) -> list[Any]:
    """Replicas of the engine deployments (``LLMServer:<model>``, ``DPServer:<model>``: one per DP
    rank), else of every deployment."""
    servers = [r for d in app.deployments if model_of_deployment(d.name) is not None for r in d.replicas]
    return servers or [r for d in app.deployments for r in d.replicas]


@dataclass(frozen=True)
class LogTarget:
    """One process's worker log on one manifest node: the file name patterns of its stdout and
    stderr (``fnmatch``, relative to ``<session>/logs``)."""

    node: str
    patterns: tuple[str, str]


def replica_target(node_name: str, rep: Any) -> LogTarget | None:
    """The worker log of Serve replica ``rep`` (None when Serve did not report its worker id)."""
    if not rep.worker_id:
        return None
    pid = "*" if rep.pid is None else str(rep.pid)
    return LogTarget(node_name, (f"worker-{rep.worker_id}-*-{pid}.out", f"worker-{rep.worker_id}-*-{pid}.err"))


def worker_target(node_name: str, pid: int) -> LogTarget:
    """The worker log of one engine worker actor (vLLM's Ray executor runs each rank in its own
    actor, whose stdout is its own worker log: ``Model loading took``, ``Available KV cache
    memory`` and the CUDA graph lines are there, not in the replica's)."""
    return LogTarget(node_name, (f"worker-*-{pid}.out", f"worker-*-{pid}.err"))


NO_WORKER_ID = "Serve did not report the replica's worker id"


def worker_targets(workers: Sequence[Any], node_of: Mapping[str | None, str | None]) -> tuple[list[LogTarget], list[str]]:
    """(targets, errors): the logs of a replica's engine workers (``status.workers.EngineWorker``)
    on their manifest nodes (``node_of``: Ray node id -> node name); a worker without either is
    said, not read."""
    targets, errors = [], []
    for worker in workers:
        node = node_of.get(worker.node_id)
        if node is None or worker.pid is None:
            errors.append(f"engine worker {worker.name} has no known node or pid")
        else:
            targets.append(worker_target(node, worker.pid))
    return targets, errors


def read_logs(manifest: Manifest, runners: Mapping[str, Runner], targets: Sequence[LogTarget]) -> list[tuple[list[str] | None, str | None]]:
    """(lines, error) of each target, in the order given: the engine's start-up lines
    (``KV_KEYWORDS``) of ``read_log_lines``."""
    return [(None if lines is None else [ln.text for ln in lines], err) for lines, err in read_log_lines(manifest, runners, targets)]


def read_log_lines(manifest: Manifest, runners: Mapping[str, Runner], targets: Sequence[LogTarget],
                   keywords: Sequence[str] = KV_KEYWORDS,
                   limits: ScanLimits = KV_SCAN_LIMITS) -> list[tuple[list[LogLine] | None, str | None]]:  # fmt: skip
    """(lines holding one of ``keywords``, error) of each target, in the order given: one scan per
    node, whatever the number of targets on it (a TP=8 PP=2 replica has 17 logs on 2 nodes). Each
    target is one of the scan's ``groups``; a file belongs to the first group it matched, as the
    scan reports. ``limits`` bound what one target's scan would read."""
    out: list[tuple[list[LogLine] | None, str | None]] = [(None, None)] * len(targets)
    by_node: dict[str, list[int]] = {}
    for i, target in enumerate(targets):
        by_node.setdefault(target.node, []).append(i)
    for node_name, indexes in by_node.items():
        patterns = [targets[i].patterns for i in indexes]
        scan = _scan_node(manifest, runners, node_name, patterns, keywords, limits)
        if isinstance(scan, str):
            for i in indexes:
                out[i] = (None, scan)
            continue
        group_of = {f.path: f.group for f in scan.files}
        for k, i in enumerate(indexes):
            if k not in group_of.values():
                out[i] = (None, f"{node_name}: no worker log {patterns[k][0]} in {scan.session_dir}/logs")
                continue
            mine = sorted((ln for ln in scan.lines if group_of.get(ln.file) == k), key=lambda ln: (ln.file, ln.line_no or 0))
            out[i] = (mine, None)
    return out


def _scan_node(manifest: Manifest, runners: Mapping[str, Runner], node_name: str, patterns: Sequence[tuple[str, ...]],
               keywords: Sequence[str], limits: ScanLimits) -> NodeScan | str:  # fmt: skip
    """The scan of the node's session logs for these groups of patterns, or why it failed."""
    runner = runners.get(node_name)
    if runner is None:
        return f"no runner for {node_name}"
    node = manifest.node(node_name)
    # As many files per process as one scan of it alone would read, in the order of the targets.
    limits = replace(limits, max_files=limits.max_files * len(patterns))
    argv = scan_argv(node.python_bin(manifest), node_temp_dirs(manifest, node), list(keywords), limits=limits, groups=tuple(patterns))
    try:
        result = runner.run(argv, timeout=60).check(node_name)
        scan = parse_scan(node_name, result.stdout)
    except RemoteError as exc:
        return f"{node_name}: {exc.message}"
    except ScanParseError as exc:
        return str(exc)
    if scan.session_dir is None:
        return f"{node_name}: no Ray session logs under {' or '.join(node_temp_dirs(manifest, node))}"
    return scan


@dataclass(frozen=True)
class LogTail:
    """The last lines of one log file of a target (``orch logs``): ``path`` is absolute on the node."""

    node: str
    path: str
    lines: tuple[str, ...]


def read_tails(manifest: Manifest, runners: Mapping[str, Runner], targets: Sequence[LogTarget],
               lines: int) -> list[tuple[list[LogTail], str | None]]:  # fmt: skip
    """([the last ``lines`` lines of each file of the target], error) per target, in the order
    given: the same one scan per node as ``read_logs``, every line kept (an empty keyword)."""
    limits = ScanLimits(max_files=2, tail_lines=max(lines, 1), max_bytes=16 * 1024 * 1024, count_prefix_bytes=0,
                        max_line_chars=4000, max_matches_per_file=max(lines, 1))  # fmt: skip
    out: list[tuple[list[LogTail], str | None]] = [([], None)] * len(targets)
    by_node: dict[str, list[int]] = {}
    for i, target in enumerate(targets):
        by_node.setdefault(target.node, []).append(i)
    for node_name, indexes in by_node.items():
        patterns = [targets[i].patterns for i in indexes]
        scan = _scan_node(manifest, runners, node_name, patterns, keywords=[""], limits=limits)
        if isinstance(scan, str):
            for i in indexes:
                out[i] = ([], scan)
            continue
        for k, i in enumerate(indexes):
            files = [f for f in scan.files if f.group == k]
            if not files:
                out[i] = ([], f"{node_name}: no log {' or '.join(patterns[k])} in {scan.session_dir}/logs")
                continue
            tails = []
            for f in sorted(files, key=lambda f: f.path):
                mine = sorted((ln for ln in scan.lines if ln.file == f.path), key=lambda ln: ln.line_no or 0)
                text = [ln.text for ln in mine] if f.size else []  # an empty file: the scan reports one empty line
                tails.append(LogTail(node_name, f"{scan.session_dir}/{f.path}", tuple(text[-lines:] if lines else ())))
            out[i] = (tails, None)
    return out


def engine_lines(manifest: Manifest, runners: Mapping[str, Runner], node_names: Mapping[str | None, str | None], replicas: list[Any],
                 workers: Mapping[str, list[Any]]) -> tuple[dict[str, list[str]], list[str]]:  # fmt: skip
    """({replica id: the lines of its log and of its engine workers' logs}, errors): what the
    calibration record is made of. ``node_names``: Ray node id -> manifest node name;
    ``workers``: replica id -> its ``status.workers.EngineWorker``s (empty on the CPU layout).
    Every log is read in one scan per node."""
    errors: list[str] = []
    targets: list[LogTarget] = []
    owners: list[str] = []
    for rep in replicas:
        node = node_names.get(rep.node_id)
        if node is None:
            errors.append(f"replica {rep.replica_id} runs on node {rep.node_ip or rep.node_id or '?'}, not a manifest node")
            continue
        target = replica_target(node, rep)
        if target is None:
            errors.append(NO_WORKER_ID)
        else:
            targets.append(target)
            owners.append(rep.replica_id)
        found, unknown = worker_targets(workers.get(rep.replica_id, []), node_names)
        targets += found
        owners += [rep.replica_id] * len(found)
        errors += unknown
    logs: dict[str, list[str]] = {}
    for owner, (lines, err) in zip(owners, read_logs(manifest, runners, targets)):
        if lines:
            logs.setdefault(owner, []).extend(lines)
        if err and err not in errors:
            errors.append(err)
    return logs, errors
