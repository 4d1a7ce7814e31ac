"""Code that runs on the nodes, one real module per program, and the one way it gets there.

Every module of this package runs on a node, not here: the probes of preflight and `orch init`
(``ib_sysfs``, ``versions``, ``storage``, ``head_connect``, ``head_listen``), the log scan of
`orch doctor` and `orch logs` (``log_scan``), the directory and stop programs of `orch up` and
`orch down` (``private_dir``, ``stop_ray``), the collective check (``collective_job``), the model
sync agent (``sync_agent``) and the Serve LLM hooks that Ray imports by name in each replica
(``orch_serve_hooks``). Each is a whole program: it imports nothing of orch (the node has no orch
installed), only the standard library (and, where it says so, what the node runs Ray with: torch,
psutil, Ray), does nothing on import, and runs under ``if __name__ == "__main__"``. Ruff and mypy
check them as any other module.

``source(name)`` is the module's file, whole and unchanged, and it is all that ever travels:
``python_argv`` runs it as ``python -c SOURCE ARGS`` (nothing is installed on the node), and the
hooks that Ray must import by name are written whole to a file of orch's folder on every node
(``serve/node_hooks.py``, ``workflows/node_files.py``). Reads the package's own files once (like a
template); no other I/O.
"""

from __future__ import annotations

import functools
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


@functools.cache
def source(name: str) -> str:
    """The text of ``orchestrator/remote/node_programs/<name>.py``, exactly as the file holds it."""
    path = FOLDER / f"{name}.py"
    if name.startswith("_") or not path.is_file():
        raise ValueError(f"no node program named {name!r} in {FOLDER}")
    return path.read_text(encoding="utf-8")


def python_argv(python: str, name: str, *args: str) -> list[str]:
    """``python -c SOURCE ARGS``: the program runs with ``sys.argv == ["-c", *args]``."""
    return [python, "-c", source(name), *args]
