"""Issue 25 item 2: one exit code per situation, whatever the command, checked against the
README's table as written there. Each filled cell runs the real command in a subprocess (pipes, a
private state dir and HOME): an unreachable node is real SSH to loopback ports that refuse
(tests/cli/unreachable.py); "no cluster is up" is an empty state dir."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.unreachable import REPO, closed_port, orch_piped, unreachable_manifest

__all__ = ["closed_port"]

# What each command is given besides the situation (the table's column names are the commands).
EXTRA_ARGS = {"model sync": ["--model", "tiny"], "rollout": ["--model", "tiny"]}
SITUATIONS = {
    "a node cannot be reached (CLUSTER_YAML given)": "unreachable",
    "no cluster is up and no CLUSTER_YAML given": "nothing up",
}


def readme_table() -> list[tuple[str, str, int]]:
    """(situation, command, code) for every filled cell of the README's table."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Exit codes") :]
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines() if ln.startswith("| situation |")
            or any(ln.startswith(f"| {s} |") for s in SITUATIONS)]  # fmt: skip
    header, *body = rows
    assert header[0] == "situation" and len(body) == len(SITUATIONS), "README: the exit-code table by situation is missing"
    cells = []
    for row in body:
        assert len(row) == len(header), row
        cells += [(row[0], command, int(code)) for command, code in zip(header[1:], row[1:]) if code]
    return cells


CELLS = readme_table()


def test_the_table_covers_the_commands_that_reach_nodes():
    unreachable = {c for s, c, _ in CELLS if SITUATIONS[s] == "unreachable"}
    assert {"up", "down", "status", "doctor", "model sync", "logs"} <= unreachable
    assert all(re.fullmatch(r"[a-z ]+", c) for _, c, _ in CELLS)


@pytest.mark.parametrize("situation, command, code", CELLS, ids=[f"{SITUATIONS[s]}-{c}" for s, c, _ in CELLS])
def test_each_command_exits_as_the_readme_says(tmp_path: Path, closed_port, situation, command, code):
    argv = command.split()
    if SITUATIONS[situation] == "unreachable":
        manifest = unreachable_manifest(tmp_path, closed_port)
        store = tmp_path / "store"
        (store / "tiny").mkdir(parents=True)
        (store / "tiny" / "config.json").write_text("{}")
        manifest.write_text(manifest.read_text().replace("accelerator: cpu\n", f"accelerator: cpu\nmodel_store: {store}\n"))
        argv.append(str(manifest))
    res = orch_piped(tmp_path, *argv, *EXTRA_ARGS.get(command, []))
    assert res.returncode == code, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    if code:
        assert any(ln.startswith("error: ") for ln in res.stderr.splitlines()), res.stderr
