"""Every finding code in the code base has a runbook with the required sections, listed in the
index; every ``runbooks/<CODE>.md`` that a module mentions exists.

Codes are collected from the registries (``orchestrator.preflight.findings.CODES`` and, when the module
exists, ``orchestrator.doctor.diagnose.CODES``) and from the source text of ``orchestrator/`` (any
``runbooks/XYZ.md`` a hint can point at).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
RUNBOOKS = REPO / "runbooks"
SECTIONS = ("## Symptom", "## How orch detects it", "## Fix", "## Verify")
REGISTRIES = ("orchestrator.preflight.findings", "orchestrator.doctor.diagnose", "orchestrator.status.serving")


def registered_codes() -> dict[str, str]:
    """code -> module that registers it."""
    out: dict[str, str] = {}
    for name in REGISTRIES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # that registry does not exist (yet)
            raise
        for code in module.CODES:
            out.setdefault(code, name)
    return out


def referenced_codes() -> dict[str, str]:
    """code -> source file, for each ``runbooks/CODE.md`` or ``runbook("CODE")`` written in
    orchestrator/."""
    out: dict[str, str] = {}
    for path in sorted((REPO / "orchestrator").rglob("*.py")):
        text = path.read_text()
        for code in re.findall(r"runbooks/([A-Z][A-Z0-9_]+)\.md", text) + re.findall(r"runbook\(['\"](\w+)['\"]\)", text):
            out.setdefault(code, str(path.relative_to(REPO)))
    return out


CODES = registered_codes()


def test_registries_are_found():
    assert "GPU_COUNT_MISMATCH" in CODES and CODES["GPU_COUNT_MISMATCH"] == "orchestrator.preflight.findings"
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]+", c) for c in CODES)


@pytest.mark.parametrize("code", sorted(CODES))
def test_runbook_exists_with_sections(code):
    path = RUNBOOKS / f"{code}.md"
    assert path.is_file(), f"{code} (from {CODES[code]}) has no runbook at runbooks/{code}.md"
    text = path.read_text()
    assert text.startswith(f"# {code}"), f"runbooks/{code}.md must start with '# {code}'"
    positions = []
    for section in SECTIONS:
        assert re.search(rf"^{re.escape(section)}\s*$", text, re.M), f"runbooks/{code}.md lacks '{section}'"
        positions.append(text.index(section))
        body = text.split(section, 1)[1].split("\n## ", 1)[0].strip()
        assert len(body) > 20, f"runbooks/{code}.md: '{section}' is empty"
    assert positions == sorted(positions), f"runbooks/{code}.md: sections out of order"


@pytest.mark.parametrize("code", sorted(CODES))
def test_runbook_is_listed_in_the_index(code):
    index = (RUNBOOKS / "README.md").read_text()
    assert re.search(rf"^\|\s*\[{code}\]\({code}\.md\)\s*\|", index, re.M), f"runbooks/README.md has no row for {code}"


def test_every_runbook_named_in_the_code_exists():
    missing = {c: src for c, src in referenced_codes().items() if not (RUNBOOKS / f"{c}.md").is_file()}
    assert not missing, f"hints point at runbooks that do not exist: {missing}"


def test_index_links_resolve():
    index = (RUNBOOKS / "README.md").read_text()
    links = re.findall(r"\]\(([A-Za-z0-9_./-]+\.md)\)", index)
    assert links
    assert [link for link in links if not (RUNBOOKS / link).is_file()] == []


def test_preflight_hints_end_with_their_runbook():
    from orchestrator.preflight import findings as preflight

    for code in preflight.CODES:
        f = preflight.finding("fail", code, "n1", "m", "do this.")
        assert f.hint == f"do this; see `orch runbook {code}` or runbooks/{code}.md"


def test_runbooks_named_through_the_helper_are_found():
    # Hints built with runbook("CODE") (constants in rollout, cluster, dashboard, serve client).
    refs = referenced_codes()
    assert refs["ROLLOUT_FAILED"] == "orchestrator/workflows/rollout.py"
    assert refs["RAY_START_FAILED"] == "orchestrator/workflows/cluster.py"
    assert refs["acceptance"] == "orchestrator/accept/report.py"
