"""Turning manifest text into a ``Manifest`` or one ``ManifestError`` listing every problem. Pure.

Owns: the cross-field rules of cluster.yaml (exactly one head, unique names and host:port,
GPU counts against the accelerator, one local node, port collisions on a node) and the
translation of pydantic errors into ``FILE:LINE: FIELD.PATH: message`` lines (with the closest
valid key for an unknown one). The cross-field rules run on whichever sections are valid by
themselves, so a type error in one node does not hide a duplicate head in another.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.errors import ManifestError
from orchestrator.manifest.model import (
    HINT,
    RAY_CLIENT_SERVER_PORT,
    RAY_DASHBOARD_AGENT_PORT,
    RAY_WORKER_PORTS,
    Manifest,
    NodeSpec,
    RaySettings,
    ServeSettings,
    SshDefaults,
    validate_sections,
)
from orchestrator.manifest.yaml_lines import LocatedDocument, PathKey, YamlSyntaxError, parse_yaml

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Problem:
    line: int | None
    path: PathKey
    message: str

    def render(self, label: str) -> str:
        where = label if self.line is None else f"{label}:{self.line}"
        field = format_path(self.path)
        return f"{where}: {field}: {self.message}" if field else f"{where}: {self.message}"


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


def manifest_error(label: str, problems: list[Problem]) -> ManifestError:
    ordered = sorted(problems, key=lambda p: (p.line or 0, format_path(p.path)))
    lines = list(dict.fromkeys(p.render(label) for p in ordered))
    message = lines[0] if len(lines) == 1 else f"{label}: {len(lines)} problems"
    return ManifestError(message, hint=HINT, problems=lines)


def check_manifest_text(text: str, label: str, context: dict[str, Any]) -> Manifest:
    try:
        doc = parse_yaml(text)
    except YamlSyntaxError as exc:
        raise manifest_error(label, [Problem(exc.line, (), exc.message)]) from None
    problems = [Problem(p.line, p.path, p.message) for p in doc.problems]
    data = doc.data
    if data is None and not problems:
        problems.append(Problem(1, (), "the file is empty; a manifest needs at least 'name:' and 'nodes:'"))
    elif data is not None and not isinstance(data, dict):
        problems.append(Problem(doc.line_of(()), (), f"the top level must be a mapping ('name: ...', 'nodes: ...'), got {_shown(data)}"))
    if not isinstance(data, dict):
        raise manifest_error(label, problems)
    # a value YAML could not build is None in the data: its type error would only repeat that
    lost = {p.path for p in doc.problems if not p.message.startswith("duplicate key")}
    if "source_path" in data:
        problems.append(Problem(doc.line_of(("source_path",)), ("source_path",), "set by orch when it reads the file; remove it"))
        data = {k: v for k, v in data.items() if k != "source_path"}
    manifest, error = validate_sections(data, context)
    if error is not None:
        converted = (_from_pydantic(err, data, doc) for err in error.errors(include_url=False))
        problems += [p for p in converted if p.path not in lost]
    problems += [Problem(doc.line_of(path), path, msg) for path, msg in cross_field_problems(data, context)]
    if problems or manifest is None:
        raise manifest_error(label, problems)
    return manifest


# ---- pydantic errors -> problems ----


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _data_path(loc: tuple[Any, ...], data: Any, missing: bool) -> PathKey:
    """Pydantic's loc without its union/key markers: only steps that exist in the data, plus
    the final field name of a missing key."""
    out: list[str | int] = []
    current = data
    for index, part in enumerate(loc):
        if isinstance(current, dict) and isinstance(part, str) and part in current:
            out.append(part)
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            out.append(part)
            current = current[part]
        elif missing and index == len(loc) - 1 and isinstance(part, str):
            out.append(part)
    return tuple(out)


def _model_at(path: PathKey) -> type[BaseModel] | None:
    """The model class whose keys are valid at ``path`` (for 'did you mean')."""
    annotation: Any = Manifest
    for part in path:
        annotation = _unwrap(annotation, list_item=isinstance(part, int))
        if isinstance(part, str):
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return None
            field = annotation.model_fields.get(part)
            if field is None:
                return None
            annotation = field.annotation
    annotation = _unwrap(annotation, list_item=False)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrap(annotation: Any, list_item: bool) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is typing.Annotated:
            annotation = args[0]
        elif origin in (typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
        elif origin is list and list_item:
            return args[0]
        else:
            return annotation


def _from_pydantic(err: dict[str, Any], data: dict[str, Any], doc: LocatedDocument) -> Problem:
    kind = err["type"]
    path = _data_path(tuple(err["loc"]), data, missing=kind == "missing")
    value = err.get("input")
    ctx = err.get("ctx") or {}
    got = f" (got {_shown(value)})"
    if kind == "missing":
        message = "required key missing"
    elif kind == "extra_forbidden":
        key = str(path[-1]) if path else "?"
        model = _model_at(path[:-1])
        valid = [k for k in (model.model_fields if model else {}) if k != "source_path"]
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        message = f"unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else f"; valid keys: {', '.join(valid)}")
    elif kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        message = f"must be {' or '.join(repr(e) for e in expected)}{got}"
        close = difflib.get_close_matches(str(value), expected, n=1, cutoff=0.6) if isinstance(value, str) else []
        if close:
            message += f"; did you mean '{close[0]}'?"
    elif kind in ("int_type", "int_parsing", "int_from_float"):
        message = "must be a whole number" + got
    elif kind in ("float_type", "float_parsing"):
        message = "must be a number" + got
    elif kind == "string_type":
        message = "must be a string" + got + ("; quote it" if isinstance(value, (int, float)) else "")
    elif kind == "bool_type":
        message = "must be true or false" + got
    elif kind in ("model_type", "dict_type", "model_attributes_type"):
        message = "must be a mapping of keys" + got
    elif kind == "list_type":
        message = "must be a list ('- name: ...' items)" + got
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {"greater_than_equal": "at least", "greater_than": "greater than",
                 "less_than_equal": "at most", "less_than": "less than"}[kind]  # fmt: skip
        bound = next(iter(ctx.values()), "?")
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        message = f"must be {words} {bound}{got}"
    elif kind == "too_short" and path == ("nodes",):
        message = "must list at least one node (the head)"
    elif kind in ("too_short", "string_too_short"):
        message = "must not be empty"
    elif kind == "path_type":
        message = "must be a path" + got
    elif kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
    else:
        text = str(err["msg"])
        message = text[:1].lower() + text[1:] + got
    return Problem(doc.line_of(path), path, message)


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

    if accelerator in ("gpu", "cpu"):
        for i, node, bad in valid:
            given = "gpus" in raw_nodes[i]
            if "gpus" in bad:
                continue
            if accelerator == "gpu" and node.gpus < 1:
                out.append((("nodes", i, "gpus"),
                            f"must be at least 1 on a gpu cluster (got {node.gpus})" if given
                            else "required on a gpu cluster: how many GPUs this node has (e.g. 8)"))
            elif accelerator == "cpu" and node.gpus > 0:
                out.append((("nodes", i, "gpus"), f"must be 0 on a cpu cluster (got {node.gpus}); set 'accelerator: gpu' to use GPUs"))

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
        untrusted = {("ray", f) for f in ray_bad} | {("serve", f) for f in serve_bad}
        sshd = [(i, node, ssh_ports[i]) for i, node, bad in valid if i in ssh_ports and node.transport == "ssh" and "role" not in bad]
        out += _port_collisions(sshd, ray, serve, untrusted, written=lambda path: _written(data, path))
    return list(dict.fromkeys(out))


def _written(data: Any, path: PathKey) -> bool:
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
    untrusted: set[PathKey], written: typing.Callable[[PathKey], bool],
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
    written: typing.Callable[[PathKey], bool], only_first: bool = False,
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
