"""The package's import graph: no cycles, and no orchestrator module imported inside a function
outside ``cli/`` (whose lazy command registry keeps ``orch --help`` fast). Read from the source
with ``ast``, so a cycle hidden behind a function-level import is still one."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

PKG = Path(orchestrator.__file__).parent


def _module_name(path: Path, pkg: Path = PKG) -> str:
    rel = path.relative_to(pkg.parent).with_suffix("")
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
            # `from pkg import sub` runs pkg's __init__ before it reads `sub` from it: an edge to
            # pkg as well as to the submodule (else `remote/__init__ -> ssh -> remote` hides).
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)]
        for target in targets:
            if target.startswith("orchestrator"):
                out.append((target, id(node) in in_function))
    return out


def _graph(pkg: Path = PKG) -> tuple[dict[str, set[str]], list[str]]:
    files = sorted(pkg.rglob("*.py"))
    modules = {_module_name(f, pkg) for f in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    hidden: list[str] = []
    for f in files:
        name = _module_name(f, pkg)
        for target, inside in _imports(f, modules):
            if target in modules and target != name:
                graph[name].add(target)
            # importing a.b.c runs a/__init__ and a/b/__init__ first: edges to those packages too
            parent = target.rpartition(".")[0]
            while parent.count(".") >= 1:
                if parent in modules and parent != name:
                    graph[name].add(parent)
                parent = parent.rpartition(".")[0]
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


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "orchestrator"


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """`from orchestrator.remote import known_hosts` runs remote/__init__ first; when that
    __init__ imports ssh, ssh -> remote -> ssh is a cycle (it hid in the real package once)."""
    pkg = _tree(tmp_path, {
        "orchestrator/__init__.py": "",
        "orchestrator/remote/__init__.py": "from orchestrator.remote.ssh import SshRunner\n",
        "orchestrator/remote/ssh.py": "from orchestrator.remote import known_hosts\n",
        "orchestrator/remote/known_hosts.py": "",
    })
    graph, _ = _graph(pkg)
    assert _cycle(graph) == ["orchestrator.remote", "orchestrator.remote.ssh", "orchestrator.remote"]


def test_importing_a_submodule_by_its_dotted_name_also_runs_its_package(tmp_path):
    pkg = _tree(tmp_path, {
        "orchestrator/__init__.py": "",
        "orchestrator/a/__init__.py": "import orchestrator.b.c\n",
        "orchestrator/b/__init__.py": "from orchestrator.a import x\n",
        "orchestrator/b/c.py": "",
        "orchestrator/a/x.py": "",
    })
    graph, _ = _graph(pkg)
    assert "orchestrator.b" in graph["orchestrator.a"]
    assert _cycle(graph) is not None


def test_an_init_that_imports_nothing_is_no_cycle(tmp_path):
    pkg = _tree(tmp_path, {
        "orchestrator/__init__.py": "",
        "orchestrator/remote/__init__.py": '"""docs only"""\n',
        "orchestrator/remote/connect.py": "from orchestrator.remote.ssh import SshRunner\n",
        "orchestrator/remote/ssh.py": "from orchestrator.remote import known_hosts\n",
        "orchestrator/remote/known_hosts.py": "",
    })
    graph, _ = _graph(pkg)
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# The layers of docs/architecture.md, bottom first: each may import its own layer and those below.
BASE = {"errors", "resources", "local_disk", "state_files", "state", "polling", "engine_metrics", "remote", "runbooks",
        "cluster_lock", "orchestrator"}  # fmt: skip
LAYERS = [BASE, {"manifest"}, {"plan", "nodes", "sync", "cluster", "preflight", "collective", "doctor", "bench", "accept",
                               "serve", "status"}, {"workflows"}, {"cli", "__main__"}]  # fmt: skip


def _layer(top: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def _layer_violations(graph: dict[str, set[str]]) -> list[str]:
    def top(m: str) -> str:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 else "orchestrator"

    return sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if _layer(top(b)) > _layer(top(a)))


def test_every_top_level_module_has_a_layer():
    tops = [p.stem for p in PKG.glob("*.py") if p.stem != "__init__"] + [p.parent.name for p in PKG.glob("*/__init__.py")]
    missing = [t for t in tops if not any(t in layer for layer in LAYERS)]
    assert missing == []


def test_the_layers_point_down():
    graph, _ = _graph()
    assert _layer_violations(graph) == []


def test_the_layer_rule_finds_an_upward_import():
    assert _layer_violations({"orchestrator.plan.memory": {"orchestrator.workflows.plan"}}) == [
        "orchestrator.plan.memory -> orchestrator.workflows.plan"
    ]
    assert _layer_violations({"orchestrator.errors": {"orchestrator.manifest.model"}}) != []
    assert _layer_violations({"orchestrator.serve.config": {"orchestrator.plan.layout", "orchestrator.errors"}}) == []


def test_the_readme_layout_names_every_top_level_module():
    """README's Layout is where a newcomer looks for a module: every folder and top-level file."""
    readme = (PKG.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[: layout.index("```", layout.index("```") + 3)]
    names = [p.name for p in PKG.glob("*.py") if p.name != "__init__.py"] + [p.parent.name + "/" for p in PKG.glob("*/__init__.py")]
    assert [n for n in sorted(names) if n not in layout] == []
