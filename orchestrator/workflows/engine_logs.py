"""The start-up lines of a Serve LLM replica's engine, read on its node. Does I/O (through the
node's runner).

vLLM's EngineCore is a child of the replica actor and writes to the same stdout: the replica's
worker log ``<temp_dir>/session_latest/logs/worker-<worker_id>-*-<pid>.out``. The bounded scan of
``orchestrator.doctor.logscan`` (the doctor's) does the reading; only lines with one of
``KV_KEYWORDS`` travel. Used by `orch status` (KV capacity, predicted vs measured) and by `orch
rollout` (the calibration record, ``workflows.calibration``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.doctor.diagnose import node_temp_dirs
from orchestrator.doctor.logscan import ScanLimits, ScanParseError, parse_scan, scan_argv
from orchestrator.errors import RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.status.serving import model_of_deployment

KV_KEYWORDS = ["KV cache size", "Maximum concurrency", " blocks: ",
               # the memory figures orch records as calibration (orchestrator.plan.calibration)
               "Model loading took", "Loading model weights took", "Available KV cache memory", "Estimated CUDA graph memory",
               "Graph capturing finished", "kv cache memory in use",
               # the platform the engine ran on (orchestrator.plan.calibration.engine_platform)
               "Automatically detected platform", "cpu_worker.py", "cpu_model_runner.py", "gpu_worker.py",
               "gpu_model_runner.py", "total_gpu_memory"]  # fmt: skip
# The capacity line comes early in the log; read up to 64 MiB of it (only matching lines travel)
# and skip counting line numbers, which would read the file twice.
KV_SCAN_LIMITS = ScanLimits(max_files=4, tail_lines=10**8, max_bytes=64 * 1024 * 1024, count_prefix_bytes=0,
                            max_line_chars=1000, max_matches_per_file=200)  # fmt: skip


def engine_replicas(app: Any, model_ids: list[str] | None = None) -> list[Any]:
    """Replicas of the engine deployments (``LLMServer:<model>``), else of every deployment."""
    servers = [r for d in app.deployments if model_of_deployment(d.name) is not None for r in d.replicas]
    return servers or [r for d in app.deployments for r in d.replicas]


def read_replica_log(manifest: Manifest, runners: Mapping[str, Runner], node_name: str, rep: Any) -> tuple[list[str] | None, str | None]:
    """(lines, error): the engine lines of replica ``rep``'s worker log on manifest node ``node_name``."""
    if not rep.worker_id:
        return None, "Serve did not report the replica's worker id"
    pid = "*" if rep.pid is None else str(rep.pid)
    return _scan(manifest, runners, node_name, (f"worker-{rep.worker_id}-*-{pid}.out", f"worker-{rep.worker_id}-*-{pid}.err"))


def read_worker_log(manifest: Manifest, runners: Mapping[str, Runner], node_name: str, pid: int) -> tuple[list[str] | None, str | None]:
    """(lines, error): the engine lines of one engine worker actor (vLLM's Ray executor runs each
    rank in its own actor, whose stdout is its own worker log: ``Model loading took``,
    ``Available KV cache memory`` and the CUDA graph lines are there, not in the replica's)."""
    return _scan(manifest, runners, node_name, (f"worker-*-{pid}.out", f"worker-*-{pid}.err"))


def _scan(manifest: Manifest, runners: Mapping[str, Runner], node_name: str, patterns: tuple[str, str]) -> tuple[list[str] | None, str | None]:
    runner = runners.get(node_name)
    if runner is None:
        return None, f"no runner for {node_name}"
    node = manifest.node(node_name)
    argv = scan_argv(node.python_bin(manifest), node_temp_dirs(manifest, node), KV_KEYWORDS, limits=KV_SCAN_LIMITS, groups=(patterns,))
    try:
        result = runner.run(argv, timeout=60).check(node_name)
        scan = parse_scan(node_name, result.stdout)
    except RemoteError as exc:
        return None, f"{node_name}: {exc.message}"
    except ScanParseError as exc:
        return None, str(exc)
    if scan.session_dir is None:
        return None, f"{node_name}: no Ray session logs under {' or '.join(node_temp_dirs(manifest, node))}"
    if not scan.files:
        return None, f"{node_name}: no worker log {patterns[0]} in {scan.session_dir}/logs"
    return [ln.text for ln in sorted(scan.lines, key=lambda ln: (ln.file, ln.line_no or 0))], None


def engine_lines(manifest: Manifest, runners: Mapping[str, Runner], node_names: Mapping[str | None, str | None], replicas: list[Any],
                 workers: Mapping[str, list[Any]]) -> tuple[dict[str, list[str]], list[str]]:  # fmt: skip
    """({replica id: the lines of its log and of its engine workers' logs}, errors): what the
    calibration record is made of. ``node_names``: Ray node id -> manifest node name;
    ``workers``: replica id -> its ``status.workers.EngineWorker``s (empty on the CPU layout)."""
    logs: dict[str, list[str]] = {}
    errors: list[str] = []
    for rep in replicas:
        node = node_names.get(rep.node_id)
        if node is None:
            errors.append(f"replica {rep.replica_id} runs on node {rep.node_ip or rep.node_id or '?'}, not a manifest node")
            continue
        lines, err = read_replica_log(manifest, runners, node, rep)
        got = list(lines or [])
        if err:
            errors.append(err)
        for worker in workers.get(rep.replica_id, []):
            wnode = node_names.get(worker.node_id)
            if wnode is None or worker.pid is None:
                errors.append(f"engine worker {worker.name} has no known node or pid")
                continue
            wlines, werr = read_worker_log(manifest, runners, wnode, worker.pid)
            got.extend(wlines or [])
            if werr:
                errors.append(werr)
        if got:
            logs[rep.replica_id] = got
    return logs, errors
