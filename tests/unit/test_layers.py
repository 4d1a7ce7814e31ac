"""The pure core stays pure: plan/ and serve/ (its modules; its I/O is the subpackage serve/ray_io)
import no Ray, httpx, paramiko, subprocess, nor orch's state store or Ray Serve I/O, directly or through another orch
module. Checked by reading the sources (ast), every import statement (lazy ones inside functions
too), following orch's own modules and the packages Python runs first (their __init__.py)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
FORBIDDEN = ("ray", "httpx", "paramiko", "subprocess", "orchestrator.state", "orchestrator.serve.ray_io")
PURE = sorted(
    [f"orchestrator.plan.{p.stem}" for p in (PACKAGE / "plan").glob("*.py") if p.stem != "__init__"]
    + [f"orchestrator.serve.{p.stem}" for p in (PACKAGE / "serve").glob("*.py") if p.stem != "__init__"]
)


def module_file(name: str) -> Path | None:
    """The source of an orch module or package, None for anything else."""
    if name != "orchestrator" and not name.startswith("orchestrator."):
        return None
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_of(source: str, module: str, is_package: bool = False) -> list[tuple[str, int]]:
    """(module imported, line) for every import statement of ``source``: ``from X import y``
    yields X and X.y (y may be a module), relative imports resolved against ``module``."""
    out: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            out.append((base, node.lineno))
            out.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names if module_file(f"{base}.{alias.name}"))
    return out


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@cache
def direct_imports(name: str) -> tuple[tuple[str, int], ...]:
    path = module_file(name)
    if path is None:
        return ()
    return tuple(imports_of(path.read_text(), name, path.name == "__init__.py"))


def forbidden_in(name: str, forbidden: tuple[str, ...] = FORBIDDEN) -> list[str]:
    """Each forbidden import reachable from ``name``, as 'chain: line N imports X'."""
    found: list[str] = []
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(name, (name,))]
    while todo:
        current, chain = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for target, line in direct_imports(current):
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                found.append(f"{' -> '.join(chain)}: line {line} imports {target}")
                continue
            for step in [*_parents(target), target]:
                if module_file(step) is not None and step not in seen:
                    todo.append((step, (*chain, step)))
    return sorted(set(found))


@pytest.mark.parametrize("module", PURE)
def test_the_pure_core_imports_no_io(module):
    assert forbidden_in(module) == []


def test_the_walk_finds_a_direct_a_lazy_and_a_transitive_import():
    """The checker itself, on sources written here (a planted import each way)."""
    lazy = "def f():\n    import httpx\n    return httpx\n"
    assert imports_of(lazy, "orchestrator.plan.x") == [("httpx", 2)]
    relative = "from ..state import StateStore\nfrom . import location\n"
    assert imports_of(relative, "orchestrator.serve.x") == [("orchestrator.state", 1), ("orchestrator.serve", 2), ("orchestrator.serve.location", 2)]
    # a real chain: the rollout workflow reaches the Serve REST client and httpx
    chains = forbidden_in("orchestrator.workflows.rollout", ("httpx",))
    assert any("orchestrator.serve.ray_io.client: line" in c and c.endswith("imports httpx") for c in chains), chains


def test_the_i_o_modules_are_not_in_the_pure_list():
    assert "orchestrator.serve.desired" in PURE and "orchestrator.plan.model_ref" in PURE
    assert "orchestrator.serve.shapes" in PURE  # the registry of application shapes: Ray only by dotted name
    assert not any(m.startswith(("orchestrator.serve.ray_io", "orchestrator.workflows")) for m in PURE)
