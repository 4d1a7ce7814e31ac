"""Issue 25 item 5: the README's examples match what the commands print. Every `$ orch ...` line
of the README's code blocks that needs no cluster, no network and no file of the user's own runs
here as a script runs it (pipes, a private state dir and HOME, the repository's templates beside
it), and every line the README shows under it must be a line of what it printed; an example that
shows an ``error:`` must fail, any other must succeed. The examples that need a running cluster
(`orch up`, `status`, `doctor`, ...) show captures from the test bed; their lines are what the
integration tests assert on."""

from __future__ import annotations

import glob
import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.cli.unreachable import REPO, orch_piped

# Subcommands that answer from the command line and the repository's own files alone.
OFFLINE = {"validate", "plan", "runbook"}
# The README's `orch validate broken.yaml` is a manifest with `gpu:` for `gpus:` on its line 9,
# in its second node: written here as a user would have it.
BROKEN = """name: demo
nodes:
  - name: head
    host: 10.0.0.1
    role: head
    gpus: 8
  - name: w1
    host: 10.0.0.2
    gpu: 8
"""


def readme_examples() -> list[tuple[str, list[str]]]:
    """(command line, the lines the README shows under it) for every `$ orch` line."""
    text = (REPO / "README.md").read_text()
    examples = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ orch "):
                continue
            shown = []
            for later in lines[i + 1 :]:
                if later.startswith("$ "):
                    break
                shown.append(later)
            examples.append((line[2:].split("  #")[0].strip(), shown))
    return examples


def runnable(command: str) -> bool:
    """Needs no cluster, network or user file: an offline subcommand, no placeholders or pipes,
    models named from the catalog, files from the repository (or the README's broken.yaml)."""
    if any(c in command for c in "[]|<>") or "..." in command:
        return False
    argv = shlex.split(command)[1:]
    if not argv or argv[0] not in OFFLINE:
        return False
    if "--model" in argv and re.search(r"[/.]", argv[argv.index("--model") + 1]):
        return False  # a path or a Hugging Face repo id: the user's files or the network
    files = [a for a in argv[1:] if a.endswith((".yaml", ".yml", ".json"))]
    return all(f == "broken.yaml" or glob.glob(str(REPO / f)) for f in files)


EXAMPLES = [(c, shown) for c, shown in readme_examples() if runnable(c)]


def test_the_readme_has_runnable_examples_with_output():
    # What this file checks is there: a change to the README that drops them shows here.
    assert sum(1 for _, shown in EXAMPLES if shown) >= 3, EXAMPLES
    assert {shlex.split(c)[1] for c, _ in EXAMPLES} >= {"validate", "plan", "runbook"}


@pytest.mark.parametrize("command, shown", EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_a_readme_example_prints_what_the_readme_shows(tmp_path: Path, command: str, shown: list[str]):
    shutil.copytree(REPO / "cluster-templates", tmp_path / "cluster-templates")
    (tmp_path / "broken.yaml").write_text(BROKEN)
    argv = []
    for arg in shlex.split(command)[1:]:  # the shell's glob, sorted as bash does in the C locale
        matches = sorted(glob.glob(arg, root_dir=tmp_path)) if any(c in arg for c in "*?") else [arg]
        argv += matches or [arg]
    res = orch_piped(tmp_path, *argv)
    printed = {" ".join(ln.split()) for ln in (res.stdout + res.stderr).splitlines()}
    missing = [ln for ln in shown if " ".join(ln.split()) not in printed]
    assert not missing, (missing, res.stdout, res.stderr)
    fails = any(ln.startswith("error:") for ln in shown)
    assert (res.returncode != 0) == fails, (res.returncode, res.stdout, res.stderr)
