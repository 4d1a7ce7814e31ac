"""The engine argument names Ray Serve LLM accepts, read from the installed sources without
importing them. Reads files (no import of ray or vllm).

Ray Serve LLM 2.60 splits ``engine_kwargs`` into vLLM's frontend and engine arguments and refuses
any other key ("Unknown engine argument: KEY", ``ray/llm/_internal/serve/engines/vllm/
vllm_models.py: VLLMEngineConfig.from_llm_config``): the names are the fields of the two
dataclasses that file imports (``FrontendArgs`` and ``AsyncEngineArgs`` with their bases). orch
used to learn of a mistyped ``--engine-arg`` only from that check, after importing ray.serve.llm
and vLLM (13 s of a 19 s dry run, issue 25 item 8). The same names are read here from the source
text with ``ast``, so a wrong name is refused at once with the closest right one. Where the
sources are missing or laid out otherwise (no ray/vllm on the machine orch runs on), nothing is
known and nothing is refused here: the full validation (or the nodes) still checks.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from functools import cache
from pathlib import Path

from orchestrator.errors import ServeConfigError

# The module of Ray Serve LLM that decides which engine_kwargs are accepted, and the classes it reads.
RAY_RULE_MODULE = "ray.llm._internal.serve.engines.vllm.vllm_models"
RAY_RULE_CLASSES = ("FrontendArgs", "AsyncEngineArgs")


def _source(module: str) -> Path | None:
    """The file of ``module`` under its installed top-level package, found without importing it."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: finds, does not import
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base, *rest.split(".")) if rest else Path(base)
        for candidate in (path.with_suffix(".py"), path / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _tree(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _imported_from(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and any(a.name == name for a in node.names):
            return node.module
    return None


def _fields(module: str, class_name: str, depth: int = 0) -> set[str] | None:
    """The dataclass fields of ``module.class_name`` and of its bases (followed through the
    module's own classes and its ``from X import Base`` lines); None when anything is not found."""
    path = _source(module)
    tree = _tree(path) if path is not None else None
    if tree is None or depth > 8:
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        origin = _imported_from(tree, class_name)  # re-exported from another module
        return _fields(origin, class_name, depth + 1) if origin else None
    names = {
        stmt.target.id
        for stmt in cls.body
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and "ClassVar" not in ast.unparse(stmt.annotation)
    }
    for base in cls.bases:
        if not isinstance(base, ast.Name) or base.id == "object":
            return None  # a base orch cannot follow: say nothing rather than something wrong
        where = module if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body) else _imported_from(tree, base.id)
        inherited = _fields(where, base.id, depth + 1) if where else None
        if inherited is None:
            return None
        names |= inherited
    return names


@cache
def accepted_engine_args() -> frozenset[str] | None:
    """Every key Ray Serve LLM takes in ``engine_kwargs`` here, or None when it cannot be read."""
    path = _source(RAY_RULE_MODULE)
    tree = _tree(path) if path is not None else None
    if tree is None:
        return None
    names: set[str] = set()
    for class_name in RAY_RULE_CLASSES:
        module = _imported_from(tree, class_name)
        fields = _fields(module, class_name) if module else None
        if not fields:
            return None
        names |= fields
    return frozenset(names)


def check_engine_arg_names(keys: list[str] | tuple[str, ...], accepted: frozenset[str] | None = None) -> None:
    """Refuse ``--engine-arg`` names Ray Serve LLM would refuse, naming the closest accepted one."""
    known = accepted if accepted is not None else accepted_engine_args()
    if known is None:
        return
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
            raise ServeConfigError(
                f"--engine-arg {key}: not an engine argument of the installed vLLM"
                + (f"; did you mean '{close[0]}'?" if close else ""),
                hint="the names are vLLM's flags without the dashes (--max-num-seqs -> max_num_seqs); `vllm serve --help` lists them",
            )
