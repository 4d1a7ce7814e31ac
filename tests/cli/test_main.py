"""The CLI boundary: help is instant and lists commands; errors never show a traceback."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.cli import main
from orchestrator.errors import ManifestError


def test_help_lists_commands_without_importing_heavy_modules():
    code = (
        "import sys; from orchestrator.cli import main; rc = main(['--help']);"
        "heavy = [m for m in ('ray', 'vllm', 'paramiko', 'httpx', 'torch') if m in sys.modules];"
        "print('HEAVY', heavy); sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    assert "Exit codes" in out.stdout


def test_orch_error_becomes_error_and_hint(capsys, monkeypatch):
    import orchestrator.cli as cli_mod

    def boom(*a, **k):
        raise ManifestError("cluster.yaml:3: nodes[0].gpus: must be positive", hint="see the template")

    monkeypatch.setattr(cli_mod.cli, "main", boom)
    rc = main(["validate", "x"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines()[0] == "error: cluster.yaml:3: nodes[0].gpus: must be positive"
    assert "hint: see the template" in err
    assert "Traceback" not in err


def test_unexpected_exception_is_one_line_without_debug(capsys, monkeypatch):
    import orchestrator.cli as cli_mod

    def boom(*a, **k):
        raise ZeroDivisionError("x")

    monkeypatch.setattr(cli_mod.cli, "main", boom)
    assert main(["plan"]) == 1
    err = capsys.readouterr().err
    assert "internal error: ZeroDivisionError" in err and "Traceback" not in err


def test_ctx_exit_code_of_a_command_is_returned(monkeypatch):
    import click

    import orchestrator.cli as cli_mod

    @click.command()
    @click.pass_context
    def failing(ctx):
        ctx.exit(3)

    monkeypatch.setitem(cli_mod.COMMANDS, "failing-x", ("tests.cli.test_main", "_failing_cmd", "x"))
    monkeypatch.setattr(__import__("tests.cli.test_main", fromlist=["x"]), "_failing_cmd", failing, raising=False)
    assert main(["failing-x"]) == 3
