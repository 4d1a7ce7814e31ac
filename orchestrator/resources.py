"""Data files the commands read at run time: the Serve template and the runbooks. I/O (reads files).

One source: the top-level ``cluster-templates/`` and ``runbooks/`` folders of the repository are
what users browse and what the code reads. ``setup.py`` maps them into the package when a wheel
is built (``orchestrator/_data/templates`` and ``orchestrator/_data/runbooks``), so an installed
orch reads them through ``importlib.resources``; a source checkout (run with PYTHONPATH, or an
editable install) has no ``orchestrator/_data`` and reads the folders next to the package.
Nothing is copied into the repository and nothing is linked.
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from orchestrator.errors import OrchError

# resource kind -> (folder inside the installed package, folder of a source checkout)
KINDS: dict[str, tuple[str, str]] = {
    "templates": ("_data/templates", "cluster-templates"),
    "runbooks": ("_data/runbooks", "runbooks"),
}


class ResourceMissing(OrchError):
    """orch's own data files are not where the package says they are (a broken install)."""


def _checkout_root() -> Path:
    # orchestrator/resources.py -> the repository root of a source checkout
    return Path(__file__).resolve().parent.parent


def folder(kind: str) -> Traversable:
    """The folder of ``kind`` ("templates" or "runbooks"): the installed package data when the
    package has it, else the checkout's top-level folder."""
    installed_rel, checkout_rel = KINDS[kind]
    installed = resources.files("orchestrator").joinpath(*installed_rel.split("/"))
    if installed.is_dir():
        return installed
    checkout = _checkout_root() / checkout_rel
    if checkout.is_dir() and (_checkout_root() / "setup.py").is_file():
        return checkout
    raise ResourceMissing(
        f"orch's {kind} are missing from this installation (looked in the package for {installed_rel} "
        f"and in the source checkout for {checkout_rel}/)",
        hint="reinstall orch from a wheel or sdist (`pip install --force-reinstall orch`), or run it from a full checkout",
    )


def read_text(kind: str, name: str) -> str:
    """The text of one data file, e.g. ``read_text("runbooks", "NIC_DOWN.md")``."""
    path = folder(kind).joinpath(*name.split("/"))
    if not path.is_file():
        raise FileNotFoundError(f"{kind}/{name}")
    return path.read_text(encoding="utf-8")


def names(kind: str, suffix: str, subfolder: str | None = None) -> list[str]:
    """File names of ``kind`` ending in ``suffix`` (top level of the folder, or of its
    ``subfolder``), sorted."""
    where = folder(kind)
    if subfolder is not None:
        where = where.joinpath(subfolder)
        if not where.is_dir():
            return []
    return sorted(p.name for p in where.iterdir() if p.is_file() and p.name.endswith(suffix))
