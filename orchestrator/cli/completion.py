"""`orch completion SHELL`: the shell completion script, click's own (``_ORCH_COMPLETE``). CLI only.

Prints what ``_ORCH_COMPLETE=<shell>_source orch`` prints; the shell then calls ``orch`` with
``_ORCH_COMPLETE=<shell>_complete`` on every TAB, which click answers before any command runs
(commands, subcommands, options, choices and file names).
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")
INSTALL = {
    "bash": 'eval "$(orch completion bash)"   # in ~/.bashrc',
    "zsh": 'eval "$(orch completion zsh)"    # in ~/.zshrc',
    "fish": "orch completion fish > ~/.config/fish/completions/orch.fish",
}


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script of SHELL (bash, zsh or fish).

    \b
    Install it once:
      eval "$(orch completion bash)"                          # ~/.bashrc
      eval "$(orch completion zsh)"                           # ~/.zshrc
      orch completion fish > ~/.config/fish/completions/orch.fish
    """
    from click.shell_completion import get_completion_class

    from orchestrator.cli import cli

    cls = get_completion_class(shell)
    if cls is None:  # click knows these three; a future click could drop one
        raise click.BadParameter(f"click has no completion for {shell}", param_hint="SHELL")
    click.echo(cls(cli, {}, "orch", "_ORCH_COMPLETE").source())
