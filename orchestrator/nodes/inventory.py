"""Inventory: run the probes on every node through the Runner seam and assemble ``NodeFacts``.

I/O only through the runners it is given (no paramiko, no subprocess here) and the injected
``clock``. A probe that cannot run is recorded in ``NodeFacts.errors`` (a missing tool, exit 127,
is a fact: ``nvidia_smi=False``); only transport failures (unreachable, auth, host key) abort a
node, and ``gather_all`` returns those as the node's ``RemoteError``.

The head's Ray port is tested from each worker over TCP while a short-lived listener holds the
port on the head (Ray is not running yet during preflight, so a bare connect would only ever be
refused). If the port is already taken on the head (Ray running), the workers connect to it.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from orchestrator.errors import CommandTimeoutError, RemoteError
from orchestrator.manifest.model import Manifest
from orchestrator.nodes import probes
from orchestrator.nodes.facts import NodeFacts
from orchestrator.remote.runner import CommandResult, Runner, fan_out

PROBE_TIMEOUT_S = 60.0
# The model fingerprint hashes every file the folder's cache does not vouch for (the first probe
# of a model orch did not sync): at disk speed, in parallel threads; later probes only stat.
MODEL_PROBE_TIMEOUT_S = 900.0
# A worker keeps trying the head's port this long; a DROP rule shows as a timeout per try.
REACH_DEADLINE_S = 6.0
REACH_PER_TRY_S = 2.0


class _Probe:
    """Runs argv on one node and records why a probe produced nothing."""

    def __init__(self, runner: Runner, errors: dict[str, str]) -> None:
        self.runner = runner
        self.errors = errors

    def attempt(self, key: str, argv: list[str], timeout: float = PROBE_TIMEOUT_S) -> CommandResult | None:
        """The result whatever its exit code; None (and the reason recorded) when the command
        timed out or does not exist."""
        try:
            res = self.runner.run(argv, timeout=timeout)
        except CommandTimeoutError as exc:
            self.errors[key] = f"`{argv[0]}` timed out: {exc.message}"
            return None
        if res.exit_code == probes.COMMAND_NOT_FOUND:
            self.errors[key] = f"`{argv[0]}` not found on the node (exit 127)"
            return None
        return res

    def failed(self, key: str, argv: list[str], res: CommandResult) -> None:
        tail = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or [""]
        self.errors[key] = f"`{argv[0]}` exited {res.exit_code}: {tail[0][:300]}"

    def run(self, key: str, argv: list[str], timeout: float = PROBE_TIMEOUT_S) -> CommandResult | None:
        res = self.attempt(key, argv, timeout)
        if res is not None and res.exit_code != 0:
            self.failed(key, argv, res)
            return None
        return res

    def parse(self, key: str, fn: Callable[[str], Any], text: str) -> Any:
        try:
            return fn(text)
        except (probes.ProbeParseError, KeyError, TypeError, ValueError) as exc:
            self.errors[key] = f"unreadable output: {exc}"
            return None


def gather_facts(
    runner: Runner,
    node: Any,
    manifest: Manifest,
    head_address: str | None = None,
    clock: Callable[[], float] = time.time,
    model_path: str | None = None,
) -> NodeFacts:
    """Probe one node. ``node`` is its NodeSpec. ``model_path`` defaults to the manifest's
    model_store. With ``head_address``, a worker also tries a TCP connect to the head's Ray port
    (meaningful only when something listens there; ``gather_all`` arranges that)."""
    errors: dict[str, str] = {}
    p = _Probe(runner, errors)
    python = node.python_bin(manifest)
    out: dict[str, Any] = {"node": node.name, "host": node.host}

    if manifest.accelerator == "gpu":
        out.update(_gpu_facts(p))

    res = p.run("nics", probes.ip_addr_argv())
    out["nics"] = tuple(p.parse("nics", probes.parse_ip_addr, res.stdout) or ()) if res else ()

    res = p.run("ib", probes.ib_sysfs_argv(python))
    out["ib_devices"] = tuple(p.parse("ib", probes.parse_ib_sysfs, res.stdout) or ()) if res else ()

    res = p.run("versions", probes.versions_argv(python))
    out["versions"] = p.parse("versions", probes.parse_versions, res.stdout) if res else None

    model = model_path or (str(manifest.model_store) if manifest.model_store else None)
    disk = model or manifest.ray.temp_dir
    res = p.run("storage", probes.storage_argv(python, disk))
    if res:
        parsed = p.parse("storage", probes.parse_storage, res.stdout)
        if parsed:
            out["shm_bytes"], out["disk_free_bytes"], out["disk_path"], shm_error = parsed
            if shm_error:
                errors["shm"] = shm_error

    if model:
        res = p.run("model", probes.model_argv(python, model), timeout=MODEL_PROBE_TIMEOUT_S)
        out["model"] = p.parse("model", probes.parse_model, res.stdout) if res else None

    sent = clock()
    res = p.run("clock", probes.clock_argv(), timeout=15.0)
    received = clock()
    if res:
        remote = p.parse("clock", probes.parse_clock, res.stdout)
        if remote is not None:
            out["clock_offset_s"] = probes.clock_offset(remote, sent, received)

    if head_address is not None and node.role == "worker":
        out["head_address"] = head_address
        reach = _connect(p, python, head_address, manifest.ray.port)
        out["head_port_reachable"] = probes.reach_verdict(reach, listener=None) if reach else None

    return NodeFacts(errors=errors, **out)


def _query_gpus(p: _Probe) -> tuple[CommandResult | None, tuple[str, ...], bool]:
    """Run ``--query-gpu`` with the fields this driver knows: (result or None, the fields
    queried, whether nvidia-smi itself works).

    An older driver refuses the whole query when one field is newer than it (470 and
    ``compute_cap``: exit 2, ``Field "compute_cap" is not a valid field to query.``). Then
    ``--help-query-gpu`` says which fields it knows; if the query still names a refused field, that
    field is dropped and the query retried, one field at a time. The fields left out are noted
    (their values stay None), never a reason to call the driver missing."""
    fields = probes.GPU_FIELDS
    res = p.attempt("gpus", probes.gpu_query_argv(fields))
    if res is None:
        return None, fields, False
    if res.exit_code != 0 and probes.invalid_query_field(res.stdout + res.stderr):
        help_res = p.attempt("gpus", probes.help_query_gpu_argv())
        if help_res is not None and help_res.exit_code == 0:
            try:
                known = probes.parse_help_query_gpu(help_res.stdout)
            except probes.ProbeParseError:
                known = None
            narrowed = probes.supported_fields(fields, known) if known else ()
            if narrowed and narrowed != fields:
                fields = narrowed
                res = p.attempt("gpus", probes.gpu_query_argv(fields))
        while res is not None and res.exit_code != 0:
            refused = probes.invalid_query_field(res.stdout + res.stderr)
            if refused not in fields or len(fields) == 1:
                break
            fields = tuple(f for f in fields if f != refused)
            res = p.attempt("gpus", probes.gpu_query_argv(fields))
    if res is None:
        return None, fields, False
    if res.exit_code != 0:
        p.failed("gpus", probes.gpu_query_argv(fields), res)
        # A refused field means nvidia-smi answered: the driver works, orch's query does not.
        return None, fields, probes.invalid_query_field(res.stdout + res.stderr) is not None
    left_out = [f for f in probes.GPU_FIELDS if f not in fields]
    if left_out:
        p.errors["gpu_fields"] = f"this nvidia-smi does not know --query-gpu field(s) {', '.join(left_out)}; queried without them"
    return res, fields, True


def _gpu_facts(p: _Probe) -> dict[str, Any]:
    res, fields, works = _query_gpus(p)
    if res is None:
        return {"nvidia_smi": works}
    gpus = p.parse("gpus", lambda text: probes.parse_gpu_query(text, fields), res.stdout)
    if gpus is None:
        return {"nvidia_smi": True}
    out: dict[str, Any] = {"nvidia_smi": True, "gpus": tuple(gpus)}
    drivers = {g.driver_version for g in gpus if g.driver_version}
    out["driver_version"] = sorted(drivers)[0] if drivers else None
    banner = p.run("cuda", probes.smi_banner_argv())
    if banner:
        driver, cuda = probes.parse_smi_banner(banner.stdout)
        out["cuda_version"] = cuda
        out["driver_version"] = out["driver_version"] or driver
        if cuda is None:
            p.errors["cuda"] = (
                "the nvidia-smi banner names no CUDA version (`CUDA Version: N/A` when the CUDA user library "
                "is not visible, e.g. a container without the NVIDIA runtime)"
            )
    if len(gpus) >= 2:
        topo = p.run("topology", probes.topo_argv())
        if topo:
            out["topology"] = p.parse("topology", probes.parse_topo, topo.stdout)
    return out


def head_address(manifest: Manifest, head_facts: NodeFacts | None) -> str:
    """The address workers use for the head: the first global address (IPv4 first) of the
    head's ``interface`` when the manifest names one and the head has it, else its ``host``."""
    head = manifest.head
    if head.interface and head_facts is not None:
        addr = head_facts.address_of(head.interface)
        if addr:
            return addr
    return head.host


def _bind_all(address: str) -> str:
    try:
        return "::" if ipaddress.ip_address(address).version == 6 else "0.0.0.0"
    except ValueError:  # a host name: IPv4 wildcard
        return "0.0.0.0"


def _connect(p: _Probe, python: str, host: str, port: int) -> tuple[bool, str | None] | None:
    """Run the connect script; (connected, error) or None when it could not run."""
    argv = probes.connect_argv(python, host, port, REACH_DEADLINE_S, REACH_PER_TRY_S)
    res = p.run("head_port", argv, timeout=REACH_DEADLINE_S + REACH_PER_TRY_S + 30)
    if res is None:
        return None
    parsed = p.parse("head_port", probes.parse_connect, res.stdout)
    if parsed is not None and not parsed[0]:
        p.errors["head_port"] = f"TCP connect to {host}:{port} failed: {parsed[1]}"
    return parsed


def check_head_port(
    head_runner: Runner,
    worker_runners: list[Runner],
    manifest: Manifest,
    address: str,
) -> tuple[dict[str, bool | None], dict[str, str], dict | None]:
    """Listen on the head's Ray port while each worker connects to ``address``.

    Returns (reachable per worker, error per worker, the listener's report)."""
    port = manifest.ray.port
    head = manifest.head
    listen_argv = probes.listen_argv(
        head.python_bin(manifest), _bind_all(address), port, seconds=REACH_DEADLINE_S + 3, expect=len(worker_runners)
    )
    listener: dict[str, Any] = {}

    def action(r: Runner) -> tuple[tuple[bool, str | None] | None, dict[str, str]]:
        errors: dict[str, str] = {}
        p = _Probe(r, errors)
        if r.node == head.name:
            res = p.run("listen", listen_argv, timeout=REACH_DEADLINE_S + 30)
            if res is not None:
                listener.update(p.parse("listen", probes.parse_listen, res.stdout) or {})
            return None, errors
        node = manifest.node(r.node)
        # The connect script retries "refused" until its deadline, so it does not matter which
        # of the listener and the connects starts first.
        return _connect(p, node.python_bin(manifest), address, port), errors

    outcomes = fan_out([head_runner, *worker_runners], action)
    reach: dict[str, bool | None] = {}
    errs: dict[str, str] = {}
    for o in outcomes:
        if o.node == head.name:
            continue
        if not o.ok:
            reach[o.node], errs[o.node] = None, f"{type(o.error).__name__}: {o.error}"
            continue
        result, e = o.value
        reach[o.node] = probes.reach_verdict(result, listener) if result else None
        if "head_port" in e:
            errs[o.node] = e["head_port"]
    return reach, errs, (listener or None)


def gather_all(
    runners: Mapping[str, Runner] | Iterable[Runner],
    manifest: Manifest,
    clock: Callable[[], float] = time.time,
    model_path: str | None = None,
) -> dict[str, NodeFacts | RemoteError]:
    """Probe every node in parallel, then test the head's Ray port from every reachable worker.
    A node whose probing failed at the transport level maps to its RemoteError."""
    rs = list(runners.values()) if isinstance(runners, Mapping) else list(runners)
    by_name = {r.node: r for r in rs}

    def probe(r: Runner) -> NodeFacts:
        return gather_facts(r, manifest.node(r.node), manifest, clock=clock, model_path=model_path)

    result: dict[str, NodeFacts | RemoteError] = {}
    for o in fan_out(rs, probe):
        result[o.node] = o.value if o.ok else o.error

    head = manifest.head
    head_facts = result.get(head.name)
    workers = [r for r in rs if r.node != head.name and isinstance(result.get(r.node), NodeFacts)]
    if isinstance(head_facts, NodeFacts) and workers and head.name in by_name:
        address = head_address(manifest, head_facts)
        reach, errs, listener = check_head_port(by_name[head.name], workers, manifest, address)
        for r in workers:
            facts = result[r.node]
            assert isinstance(facts, NodeFacts)
            errors = dict(facts.errors)
            if r.node in errs:
                errors["head_port"] = errs[r.node]
            result[r.node] = dataclasses.replace(
                facts, head_address=address, head_port_reachable=reach.get(r.node), errors=errors
            )
        if listener and listener.get("error") and not listener.get("in_use"):
            errors = dict(head_facts.errors)
            errors["head_port"] = f"could not listen on {address}:{manifest.ray.port}: {listener['error']}"
            result[head.name] = dataclasses.replace(head_facts, head_address=address, errors=errors)
        else:
            result[head.name] = dataclasses.replace(head_facts, head_address=address)
    # Keep the manifest's node order.
    return {n.name: result[n.name] for n in manifest.nodes if n.name in result}
