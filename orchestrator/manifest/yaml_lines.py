"""Line-tracking YAML reading for cluster.yaml. Pure: text in, plain data + a line map out.

PyYAML's ``safe_load`` forgets where each value came from. Here the text is composed into
YAML nodes (which carry their position) and then built into plain dicts, lists and scalars by
hand, recording for every key and list item the 1-based line it starts on. The manifest loader
uses that map to print ``cluster.yaml:12: nodes[2].gpus: ...``.

Things YAML allows but a manifest should not hide are reported as problems instead of being
silently resolved: a key given twice (PyYAML keeps the last one), a key that is a list or a
mapping, an alias that refers to itself. Mapping keys are kept as the text written in the file
(``on:`` stays ``"on"``, not ``True``), so that key names are always strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

PathKey = tuple[str | int, ...]
MAX_DEPTH = 20  # the deepest manifest field is 4 levels down (nodes[0].env.NAME)
# Values built in all, aliases counted each time they are used: aliases re-expand their anchor,
# so 9 anchors of 9 aliases each (~500 bytes) mean 9^9 values (an "alias bomb": 1.2 GB, minutes).
# A 1,000-node manifest with an env per node is ~20,000 values.
MAX_VALUES = 100_000


@dataclass(frozen=True)
class YamlProblem:
    """Something wrong found while reading the YAML itself: where, and what."""

    line: int
    path: PathKey
    message: str


class YamlSyntaxError(Exception):
    """The text is not a single well-formed YAML document."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


@dataclass
class LocatedDocument:
    """Plain data built from a YAML document, with the line of every key and list item."""

    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)
    problems: list[YamlProblem] = field(default_factory=list)

    def line_of(self, path: PathKey) -> int:
        """The line of ``path``, or of its nearest ancestor that is in the file (for defaults)."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return 1


def _mark_line(exc: yaml.MarkedYAMLError) -> int:
    mark = exc.problem_mark or exc.context_mark
    return mark.line + 1 if mark is not None else 1


def _describe_marked(exc: yaml.MarkedYAMLError) -> str:
    parts = [p for p in (exc.context, exc.problem) if p]
    text = ", ".join(parts) if parts else type(exc).__name__
    mark = exc.problem_mark or exc.context_mark
    if mark is not None:
        text += f" (column {mark.column + 1})"
    if "'\\t'" in text:
        text += "; YAML indents with spaces, not tabs"
    return text


def parse_yaml(text: str) -> LocatedDocument:
    """Parse one YAML document. Raises ``YamlSyntaxError`` (with a line) if it is not YAML."""
    loader = None
    try:
        try:
            loader = yaml.SafeLoader(text)  # the reader already rejects control characters here
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise YamlSyntaxError(_mark_line(exc), f"invalid YAML: {_describe_marked(exc)}") from None
        except yaml.reader.ReaderError as exc:
            line = text[: exc.position].count("\n") + 1 if isinstance(exc.position, int) else 1
            char = exc.character
            shown = f"#x{char:04x}" if isinstance(char, int) else repr(char)
            raise YamlSyntaxError(line, f"invalid YAML: unacceptable character {shown}: {exc.reason}") from None
        except yaml.YAMLError as exc:  # any other reader/scanner failure without a mark
            raise YamlSyntaxError(1, f"invalid YAML: {exc}") from None
        except RecursionError:  # PyYAML composes recursively: [[[[...]]]] thousands deep
            raise YamlSyntaxError(1, "invalid YAML: nested too deeply to be a manifest") from None
        doc = LocatedDocument(data=None)
        if root is None:
            return doc
        doc.lines[()] = root.start_mark.line + 1
        try:
            doc.data = _Builder(loader, doc).build(root, (), frozenset())
        except _TooManyValues as exc:
            raise YamlSyntaxError(
                exc.line,
                f"expands to more than {MAX_VALUES:,} values (aliases re-use their anchors each time); "
                "no cluster manifest is that large",
            ) from None
        return doc
    finally:
        if loader is not None:
            loader.dispose()


class _TooManyValues(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _Builder:
    """Builds plain Python data from composed YAML nodes, filling ``doc.lines``/``doc.problems``.
    Stops (``_TooManyValues``) after ``MAX_VALUES`` values."""

    def __init__(self, loader: yaml.SafeLoader, doc: LocatedDocument) -> None:
        self.loader = loader
        self.doc = doc
        self.built = 0

    def problem(self, line: int, path: PathKey, message: str) -> None:
        self.doc.problems.append(YamlProblem(line, path, message))

    def build(self, node: yaml.Node, path: PathKey, ancestors: frozenset[int]) -> Any:
        line = node.start_mark.line + 1
        self.built += 1
        if self.built > MAX_VALUES:
            raise _TooManyValues(line)
        if len(path) > MAX_DEPTH:
            if len(path) == MAX_DEPTH + 1:
                self.problem(line, path, f"nested deeper than {MAX_DEPTH} levels; no manifest field is")
            return None
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)) and id(node) in ancestors:
            self.problem(line, path, "an alias refers to a mapping or list that contains it")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, ancestors | {id(node)})
        if isinstance(node, yaml.SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.doc.lines.setdefault(path + (index,), item.start_mark.line + 1)
                items.append(self.build(item, path + (index,), ancestors | {id(node)}))
            return items
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            self.problem(_mark_line(exc), path, _describe_marked(exc))
            return None

    def _mapping(self, node: yaml.MappingNode, path: PathKey, ancestors: frozenset[int]) -> dict[str, Any]:
        # Duplicates are looked for before merge keys (<<) are flattened: a key given explicitly
        # next to a merged one is a legitimate override, a key written twice is a mistake.
        first_seen: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key, line = key_node.value, key_node.start_mark.line + 1
                if key in first_seen:
                    self.problem(line, path + (key,), f"duplicate key '{key}' (first given at line {first_seen[key]})")
                else:
                    first_seen[key] = line
        try:
            self.loader.flatten_mapping(node)
        except yaml.MarkedYAMLError as exc:
            self.problem(_mark_line(exc), path, _describe_marked(exc))
            return {}
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                self.problem(line, path, "a key must be a plain name, not a list or a mapping")
                continue
            key = key_node.value
            child = path + (key,)
            # later pairs win, as in YAML: an explicit key overrides a merged (<<) one
            self.doc.lines[child] = line
            out[key] = self.build(value_node, child, ancestors)
        return out
