"""The docs' links resolve: every relative link of README.md, docs/*.md and benchmarks' and
scripts' markdown names a file of the repository, and a `#anchor` names a heading of its target
(GitHub's slugs); every place that cites a doc section by its title (`docs/rollout.md, "Request
routing"` in code, `[planner.md](planner.md), "Calibration"` in the docs) names a heading of that doc;
every repository path the docs name in text (a test, a module, a benchmark) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "scripts").glob("*.md")])
CODE = sorted(p for d in ("orchestrator", "tests", "scripts", "benchmarks") for p in (REPO / d).rglob("*.py"))

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# A doc named, then a section title in quotes: `docs/rollout.md, "Request routing"`,
# `[bench.md](bench.md), "Goodput"`, `docs/testing.md's "Where ..."`.
CITATION = re.compile(r"(?:docs/)?([a-z][a-z-]*\.md)\)?(?:'s)?,? (?:section )?[\"']([^\"'\n]{3,80}?)[\"']")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, blanks to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(path: Path) -> list[str]:
    lines, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            lines.append(line.lstrip("#").strip())
    return lines


def titles(path: Path) -> list[str]:
    """What a citation may name: the headings, and the bold lead-ins of paragraphs and bullets."""
    bold = re.findall(r"^(?:- |\d+\. )?\*\*([^*]+)\*\*", path.read_text(), re.M)
    return [t.lower().replace("`", "") for t in [*headings(path), *bold]]


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_every_relative_link_resolves(doc: Path):
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in {slug(h) for h in headings(dest)}:
            broken.append(target)
    assert broken == [], f"{doc.relative_to(REPO)}: broken links {broken}"


def citations(text: str) -> list[tuple[str, str]]:
    text = re.sub(r"\n\s*(?:#|//)?\s*", " ", text)  # a title may wrap across comment lines
    return CITATION.findall(text)


def test_every_cited_section_title_is_a_heading():
    docs = {p.name: p for p in (REPO / "docs").glob("*.md")}
    bad = []
    for path in [*DOCS, *CODE]:
        if path.name == "test_doc_links.py":
            continue
        for name, title in citations(path.read_text()):
            if name not in docs:
                continue
            if not any(title.lower().replace("`", "") in t for t in titles(docs[name])):
                bad.append(f"{path.relative_to(REPO)}: {name}, {title!r}")
    assert bad == []


def test_the_checks_find_what_they_look_for():
    # The parsers against known text, so an empty result above means nothing is broken.
    assert slug("Serving overhead and orch's Serve settings") == "serving-overhead-and-orchs-serve-settings"
    assert slug("`orch status`: the serving section") == "orch-status-the-serving-section"
    assert citations('see docs/rollout.md, "Request\n# routing") and') == [("rollout.md", "Request routing")]
    assert citations("[bench.md](bench.md), \"Goodput\"") == [("bench.md", "Goodput")]
    assert "docs/planner.md" in links(REPO / "README.md")


# A repository path the docs name in text: `tests/unit/test_x.py`, orchestrator/serve/config.py.
# Not one inside another project's path (vllm/benchmarks/..., ray/scripts/...).
REPO_PATH = re.compile(r"(?<![\w/.-])((?:orchestrator|tests|benchmarks|scripts|cluster-templates|runbooks)/[\w./<>*-]*[\w>*])")


def test_every_repository_path_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for path in REPO_PATH.findall(doc.read_text()):
            if "*" in path or "<" in path:
                continue
            if not (REPO / path).exists():
                missing.append(f"{doc.relative_to(REPO)}: {path}")
    assert missing == []
