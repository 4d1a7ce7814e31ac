"""Issue 25 item 5: the words users read. Every option of every command explains itself, help
shows no internal artifacts, usage errors come in orch's `error:`/`hint:` form, bare `orch` is
the help, and no page calls a source document by its file number ("seed 000/001")."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from orchestrator.cli import cli, main

REPO = Path(__file__).resolve().parents[2]
SEED_NUMBER = re.compile(r"seed\s+00[01]", re.IGNORECASE)


def _commands() -> list[tuple[str, click.Command]]:
    """Every leaf command of the real tree, by its path (`model sync`)."""
    out: list[tuple[str, click.Command]] = []

    def walk(cmd: click.Command, path: str) -> None:
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, f"{path} {name}"
                walk(sub, f"{path} {name}".strip())
        else:
            out.append((path, cmd))

    walk(cli, "")
    return out


def test_every_option_of_every_command_has_help():
    commands = _commands()
    assert {"rollout", "rollback", "bench", "model sync", "plan"} <= {p for p, _ in commands}
    missing = [f"orch {path} {'/'.join(p.opts)}" for path, cmd in commands for p in cmd.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]  # fmt: skip
    assert missing == []


@pytest.mark.parametrize("path", [p for p, _ in _commands()])
def test_help_shows_no_internal_artifacts(path, capsys):
    assert main([*path.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert "None]" not in text and "x<=None" not in text  # click's range of an unbounded FloatRange
    assert not SEED_NUMBER.search(text)


def test_no_page_names_a_source_document_by_its_number():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "runbooks").rglob("*.md")),
             *sorted((REPO / "cluster-templates").glob("*"))]  # fmt: skip
    found = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p in pages if p.is_file() for m in SEED_NUMBER.finditer(p.read_text())]
    assert found == []


def test_bare_orch_prints_the_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("Usage: orch [OPTIONS] COMMAND [ARGS]...") and "Commands:" in out.out
    assert out.err == ""


@pytest.mark.parametrize(
    "argv, message, hint",
    [
        (["plan", "--tp", "x", "--model", "tiny"], "error: invalid value for '--tp': 'x' is not a valid integer range",
         "hint: usage: orch plan [OPTIONS]; `orch plan --help` explains every option"),
        (["plan"], "error: missing option '--model'", "hint: usage: orch plan [OPTIONS]"),
        (["up", "--bogus", "x.yaml"], "error: no such option '--bogus'", "hint: usage: orch up [OPTIONS] CLUSTER_YAML"),
        (["plna"], "error: no such command 'plna'; did you mean 'plan'?", "hint: `orch --help` lists the commands"),
        (["model", "snyc"], "error: no such command 'snyc'; did you mean 'sync'?", "hint: `orch model --help` lists the commands"),
        (["bench", "--rate", "0"], "error: invalid value for '--rate': 0.0 is not in the range x>0", "hint: usage: orch bench"),
    ],
)
def test_usage_errors_are_in_orchs_form(argv, message, hint, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == message and err[1].startswith(hint) and len(err) == 2
    assert not any(line.startswith(("Usage:", "Error:", "Try ")) for line in err)


def test_rollback_without_a_cluster_names_rollback(capsys):
    assert main(["rollback"]) != 0
    err = capsys.readouterr().err
    assert "orch rollback cluster.yaml" in err and "orch rollout" not in err
