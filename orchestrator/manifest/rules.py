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

from pydantic import BaseModel

from orchestrator.errors import ManifestError
from orchestrator.manifest.crossfield import cross_field_problems, format_path, gpus_problem, is_written
from orchestrator.manifest.model import Manifest, validate_sections
from orchestrator.manifest.sections import HINT
from orchestrator.manifest.yaml_lines import LocatedDocument, PathKey, YamlSyntaxError, parse_yaml


@dataclass(frozen=True)
class Problem:
    line: int | None
    path: PathKey
    message: str
    suggests: str | None = None  # an unknown key's closest valid key ("did you mean")

    def render(self, label: str) -> str:
        where = label if self.line is None else f"{label}:{self.line}"
        field = format_path(self.path)
        return f"{where}: {field}: {self.message}" if field else f"{where}: {self.message}"


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
        converted = (_from_pydantic(dict(err), data, doc) for err in error.errors(include_url=False))
        problems += [p for p in converted if p.path not in lost]
    problems += [Problem(doc.line_of(path), path, msg) for path, msg in cross_field_problems(data, context)]
    problems = _one_per_mistake(problems, data)
    if problems or manifest is None:
        raise manifest_error(label, problems)
    return manifest


def _one_per_mistake(problems: list[Problem], data: dict[str, Any]) -> list[Problem]:
    """A mistyped key is one mistake: `gpu: 8` gives "unknown key 'gpu' (did you mean 'gpus'?)",
    and the key it meant is then missing; that second problem ("gpus: required") is left out."""
    meant = {p.path[:-1] + (p.suggests,) for p in problems if p.suggests}
    return [p for p in problems if not (p.path in meant and not is_written(data, p.path))]


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
        key = str(path[-1])  # an unknown key's loc ends with that key
        model = _model_at(path[:-1])
        valid = [k for k in (model.model_fields if model else {}) if k != "source_path"]
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        message = f"unknown key '{key}'" + (f" (did you mean '{close[0]}'?)" if close else f"; valid keys: {', '.join(valid)}")
        return Problem(doc.line_of(path), path, message, suggests=close[0] if close else None)
    elif kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        message = f"must be {' or '.join(repr(e) for e in expected)}{got}"
        close = difflib.get_close_matches(str(value), expected, n=1, cutoff=0.6) if isinstance(value, str) else []
        if close:
            message += f"; did you mean '{close[0]}'?"
    # every number of the models is Strict(): pydantic reports int_type/float_type, never *_parsing
    elif kind == "int_type":
        message = "must be a whole number" + got
    elif kind == "float_type":
        message = "must be a number" + got
    elif kind == "string_type":
        message = "must be a string" + got + ("; quote it" if isinstance(value, (int, float)) else "")
    elif kind == "bool_type":
        message = "must be true or false" + got
    elif kind in ("model_type", "dict_type"):
        message = "must be a mapping of keys" + got
    elif kind == "list_type":
        message = "must be a list ('- name: ...' items)" + got
    elif kind == "greater_than_equal" and len(path) == 3 and path[0] == "nodes" and path[2] == "gpus" and isinstance(value, int):
        # the bound of the cluster's accelerator, not the type's 0 (a gpu node needs at least 1)
        message = gpus_problem(data.get("accelerator", "gpu"), value) or f"must be at least 0{got}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal"):  # no field has a `lt` bound
        words = {"greater_than_equal": "at least", "greater_than": "greater than", "less_than_equal": "at most"}[kind]
        (bound,) = ctx.values()  # {"ge": 1}, {"le": 600.0}
        bound = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        message = f"must be {words} {bound}{got}"
    elif kind == "too_short":  # `nodes` is the only list with a minimum length
        message = "must list at least one node (the head)"
    elif kind == "string_too_short":
        message = "must not be empty"
    elif kind == "path_type":
        message = "must be a path" + got
    elif kind == "value_error":
        message = str(err["msg"]).removeprefix("Value error, ")
    else:
        text = str(err["msg"])
        message = text[:1].lower() + text[1:] + got
    return Problem(doc.line_of(path), path, message)

