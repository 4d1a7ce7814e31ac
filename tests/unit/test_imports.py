"""The package's import graph: no cycles, and no orchestrator module imported inside a function
outside ``cli/`` (whose lazy command registry keeps ``orch --help`` fast). Read from the source
with ``ast``, so a cycle hidden behind a function-level import is still one."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

PKG = Path(orchestrator.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for n in ast.walk(node))
    return out


def _imports(path: Path, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported orchestrator module, inside a function?) for each import in ``path``."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_function.update(id(n) for n in ast.walk(node) if n is not node)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                       for a in node.names]
        for target in targets:
            if target.startswith("orchestrator"):
                out.append((target, id(node) in in_function))
    return out


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    files = sorted(PKG.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    hidden: list[str] = []
    for f in files:
        name = _module_name(f)
        for target, inside in _imports(f, modules):
            if target in modules and target != name:
                graph[name].add(target)
            if inside and not name.startswith("orchestrator.cli"):
                hidden.append(f"{name} imports {target} inside a function")
    return graph, hidden


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # importing a package runs its __init__ only; a package is not a cycle with its children
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle():
    graph, _ = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_orchestrator_module_is_imported_inside_a_function_outside_the_cli():
    _, hidden = _graph()
    assert hidden == []


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
