"""Rules that relate several manifest fields (one head, unique names and addresses, GPU counts
against the accelerator, port collisions), run on the sections that are valid by themselves. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.manifest.sections import (
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_PORT,
    RAY_WORKER_PORTS,
    NodeSpec,
    RaySettings,
    ServeSettings,
    SshDefaults,
)
from orchestrator.manifest.yaml_lines import PathKey

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def format_path(path: PathKey) -> str:
    """``('nodes', 2, 'gpus')`` -> ``nodes[2].gpus``; odd keys are quoted: ``env['A B']``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += ("." if out else "") + part
        else:
            out += f"[{part!r}]"
    return out


# ---- cross-field rules ----


def _salvage(model: type[BaseModel], raw: Any, context: dict[str, Any]) -> tuple[Any, frozenset[str]]:
    """The section validated on its own; if some keys are invalid, validated again without them
    (they take their defaults) and named in the returned set, so that rules skip them."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        return None, frozenset()
    try:
        return model.model_validate(raw, context=context), frozenset()
    except ValidationError as exc:
        bad = frozenset(str(e["loc"][0]) for e in exc.errors() if e["loc"])
    try:
        return model.model_validate({k: v for k, v in raw.items() if k not in bad}, context=context), bad
    except ValidationError:
        return None, bad


def gpus_problem(accelerator: Any, gpus: int, given: bool = True) -> str | None:
    """What is wrong with a node's GPU count on this accelerator, with the bound that applies
    (a gpu cluster needs at least 1: saying "at least 0" first sent users round twice)."""
    if accelerator == "gpu" and gpus < 1:
        return f"must be at least 1 on a gpu cluster (got {gpus})" if given else "required on a gpu cluster: how many GPUs this node has (e.g. 8)"
    if accelerator == "cpu" and gpus != 0:
        return f"must be 0 on a cpu cluster (got {gpus})" + ("; set 'accelerator: gpu' to use GPUs" if gpus > 0 else "")
    return None


def cross_field_problems(data: dict[str, Any], context: dict[str, Any]) -> list[tuple[PathKey, str]]:
    """Rules that relate fields. Each runs on the values that are valid by themselves; a value
    that is invalid (already reported) is left out of the rules that involve it."""
    out: list[tuple[PathKey, str]] = []
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list):
        return out
    accelerator = data.get("accelerator", "gpu")
    ssh, ssh_bad = _salvage(SshDefaults, data.get("ssh"), context)
    ray, ray_bad = _salvage(RaySettings, data.get("ray"), context)
    serve, serve_bad = _salvage(ServeSettings, data.get("serve"), context)
    valid: list[tuple[int, NodeSpec, frozenset[str]]] = []
    for i, raw in enumerate(raw_nodes):
        node, bad = _salvage(NodeSpec, raw, context)
        if node is not None:
            valid.append((i, node, bad))

    # exactly one head, judged on the raw roles so that a broken node still counts
    roles = [(i, raw.get("role", "worker")) for i, raw in enumerate(raw_nodes) if isinstance(raw, dict)]
    heads = [i for i, role in roles if role == "head"]
    if not heads and len(roles) == len(raw_nodes) and all(r in ("head", "worker") for _, r in roles) and roles:
        out.append((("nodes",), "no node has 'role: head'; exactly one node must be the head (it runs the Ray GCS, dashboard and Serve controller)"))
    for i in heads[1:]:
        out.append((("nodes", i, "role"), f"a second head; nodes[{heads[0]}] is already the head and a cluster has exactly one"))

    names: dict[str, int] = {}
    for i, raw in enumerate(raw_nodes):
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in names:
                out.append((("nodes", i, "name"), f"duplicate node name '{name}' (also nodes[{names[name]}])"))
            else:
                names[name] = i

    locals_ = [i for i, n, _ in valid if n.transport == "local"]
    for i in locals_[1:]:
        out.append((("nodes", i, "transport"), f"only one node can be the machine orch runs on; nodes[{locals_[0]}] already has 'transport: local'"))

    for i, node, bad in valid:
        if "gpus" not in bad:  # a negative count is pydantic's, worded by gpus_problem too
            problem = gpus_problem(accelerator, node.gpus, given="gpus" in raw_nodes[i])
            if problem is not None:
                out.append((("nodes", i, "gpus"), problem))

    # each node's effective SSH port, where it is known
    ssh_ports: dict[int, tuple[int, PathKey]] = {}
    for i, node, bad in valid:
        if {"port", "transport"} & bad:
            continue
        if node.port is not None:
            ssh_ports[i] = (node.port, ("nodes", i, "port"))
        elif ssh is not None and "port" not in ssh_bad:
            ssh_ports[i] = (ssh.port, ("ssh", "port"))

    seen: dict[tuple[str, int], int] = {}
    for i, node, bad in valid:
        if "host" in bad or i not in ssh_ports:
            continue
        key = (node.host.lower().rstrip("."), ssh_ports[i][0])
        if key in seen:
            out.append((("nodes", i, "host"), f"'{node.host}' port {key[1]} is already nodes[{seen[key]}]; each node needs its own host or SSH port"))
        else:
            seen[key] = i

    if ray is not None:
        for field, port in (("port", ray.port), ("dashboard_port", ray.dashboard_port)):
            if port in RAY_WORKER_PORTS:
                out.append((("ray", field), f"{port} is inside Ray's worker port range 10002-19999; `ray start` refuses it"))
    if serve is not None and serve.http_port in RAY_WORKER_PORTS:
        out.append((("serve", "http_port"), f"{serve.http_port} is inside Ray's worker port range 10002-19999 (used on every node); pick another, e.g. 8000"))
    if ray is not None and serve is not None:
        untrusted: set[PathKey] = {("ray", f) for f in ray_bad} | {("serve", f) for f in serve_bad}
        sshd = [(i, node, ssh_ports[i]) for i, node, bad in valid if i in ssh_ports and node.transport == "ssh" and "role" not in bad]
        out += _port_collisions(sshd, ray, serve, untrusted, written=lambda path: is_written(data, path))
    return list(dict.fromkeys(out))


def is_written(data: Any, path: PathKey) -> bool:
    """Whether ``path`` is given in the file (rather than left to its default)."""
    for part in path:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            return False
    return True


def _port_collisions(
    sshd_nodes: list[tuple[int, NodeSpec, tuple[int, PathKey]]], ray: RaySettings, serve: ServeSettings,
    untrusted: set[PathKey], written: Callable[[PathKey], bool],
) -> list[tuple[PathKey, str]]:
    """Ports one node would bind twice. A port's path is None when Ray fixes it (not settable in
    the manifest); a clash is reported once, at a settable field involved, preferably one that
    the file sets (a default has no line of its own). ``untrusted`` fields (invalid, already
    reported) take part in no clash."""
    everywhere: list[tuple[int, PathKey | None, str]] = [
        (RAY_DASHBOARD_AGENT_PORT, None, "the Ray dashboard agent (every node)"),
        (serve.http_port, ("serve", "http_port"), "serve.http_port (Ray Serve HTTP proxy, every node)"),
    ]
    on_head: list[tuple[int, PathKey | None, str]] = [
        (ray.port, ("ray", "port"), "ray.port (Ray GCS)"),
        (ray.dashboard_port, ("ray", "dashboard_port"), "ray.dashboard_port (Ray dashboard)"),
        (RAY_CLIENT_SERVER_PORT, None, "the Ray client server"),
    ] + everywhere
    on_head = [entry for entry in on_head if entry[1] not in untrusted]
    everywhere = [entry for entry in everywhere if entry[1] not in untrusted]
    out: list[tuple[PathKey, str]] = []
    _clashes(on_head, "on the head node", out, written)
    for _, node, (port, path) in sshd_nodes:
        sshd: list[tuple[int, PathKey | None, str]] = [(port, path, f"sshd on node '{node.name}'")]
        _clashes(sshd + (on_head if node.role == "head" else everywhere), f"on node '{node.name}'", out, written, only_first=True)
    return out


def _clashes(
    bound: list[tuple[int, PathKey | None, str]], where: str, out: list[tuple[PathKey, str]],
    written: Callable[[PathKey], bool], only_first: bool = False,
) -> None:
    """Append a problem for each pair of equal ports in ``bound`` (with ``only_first``: each
    entry against the first one only)."""
    for later in range(1, len(bound)):
        for earlier in range(1 if only_first else later):
            port, path_a, what_a = bound[earlier]
            port_b, path_b, what_b = bound[later]
            if port != port_b or (path_a is None and path_b is None):
                continue
            sides = [(p, w) for p, w in ((path_b, what_a), (path_a, what_b)) if p is not None]
            at, other = next(((p, w) for p, w in sides if written(p)), sides[0])
            problem = (at, f"port {port} is also used by {other}" + ("" if "node '" in other else f" {where}"))
            if problem not in out:
                out.append(problem)
