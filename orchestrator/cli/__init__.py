"""Command-line interface: the only place that prints, parses flags and picks exit codes.

Each command lives in its own module of this package and is imported only when it runs, so
``orch --help`` stays instant (no ray, vllm or paramiko import). ``main`` is the error boundary:
an ``OrchError`` becomes ``error: ...`` and ``hint: ...`` with its documented exit code; anything
else becomes a one-line internal error (the traceback only with ``--debug``).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

import click

from orchestrator.errors import EXIT_CODES, OrchError

# command name -> (module, attribute, one-line help). The help is repeated here so that
# `orch --help` lists commands without importing their modules.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "init": ("orchestrator.cli.init", "init", "Write a commented starter manifest; --hosts fills it in by probing the hosts over SSH."),
    "validate": ("orchestrator.cli.validate", "validate", "Check cluster manifests (no I/O beyond reading them)."),
    "up": ("orchestrator.cli.cluster", "up", "Preflight every node over SSH, then start Ray and wait for all nodes."),
    "down": ("orchestrator.cli.cluster", "down", "Stop Ray (and leftover vLLM) on every node."),
    "status": ("orchestrator.cli.status", "status", "Nodes, GPUs, the Serve application, revision, KV cache, latency."),
    "plan": ("orchestrator.cli.plan", "plan", "Memory math and TP/PP choice for a model on a cluster shape."),
    "rollout": ("orchestrator.cli.rollout", "rollout", "Deploy a model as a Ray Serve LLM application, gated by a real completion."),
    "model": ("orchestrator.cli.model", "model", "Model files on the nodes: `orch model sync` copies a model to every node, verified."),
    "rollback": ("orchestrator.cli.rollout", "rollback", "Return to an earlier revision."),
    "remove": ("orchestrator.cli.rollout", "remove", "Stop serving a model and free its capacity; Ray stays up."),
    "bench": ("orchestrator.cli.bench", "bench", "Measure TTFT, TPOT and throughput against an OpenAI-compatible endpoint."),
    "accept": ("orchestrator.cli.accept", "accept", "Run the staged production acceptance test."),
    "logs": ("orchestrator.cli.logs", "logs", "Show a replica's log, an engine worker's (by rank) or a node's raylet; --follow."),
    "doctor": ("orchestrator.cli.doctor", "doctor", "Collect logs from every node and match known failure signatures."),
    "dashboard": ("orchestrator.cli.dashboard", "dashboard", "Open an SSH tunnel to the Ray dashboard and print its local URL (until Ctrl-C)."),
    "runbook": ("orchestrator.cli.runbook", "runbook", "Print the runbook of a finding code (every hint names one)."),
    "clusters": ("orchestrator.cli.clusters", "clusters", "List the clusters orch knows, their state and what they serve."),
    "completion": ("orchestrator.cli.completion", "completion", "Print the shell completion script (bash, zsh, fish)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module = importlib.import_module(entry[0])
        return getattr(module, entry[1])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def default_state_dir() -> Path:
    return Path(os.environ.get("ORCH_STATE_DIR") or Path.home() / ".orch")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where orch keeps its state database and secrets [env ORCH_STATE_DIR; default ~/.orch].",
)
@click.version_option(package_name="orch", prog_name="orch")
@click.pass_context
def cli(ctx: click.Context, debug: bool, state_dir: Path | None) -> None:
    """orch deploys vLLM on a cluster of GPU machines through Ray."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    library_logging(debug)
    ctx.obj["state_dir"] = state_dir or default_state_dir()


cli.help = (cli.help or "") + "\n\n\b\nExit codes:\n" + "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())


def library_logging(debug: bool) -> None:
    """paramiko's own log (a traceback per failed handshake, from its transport threads) goes to
    stderr with --debug only; without it orch's typed error says what happened, once."""
    log = logging.getLogger("paramiko")
    if not debug:
        log.setLevel(logging.CRITICAL + 1)
        return
    log.setLevel(logging.DEBUG)
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("debug: %(name)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `orch` console script: the error boundary."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # standalone_mode=False hands a command's ctx.exit(n) back as the return value.
        rc = cli.main(args=args, prog_name="orch", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except OrchError as exc:
        from orchestrator.cli.output import print_error

        print_error(exc)
        if debug:
            raise
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2; 8.1 prints the help itself
            # bare `orch` (or `orch model`): the help, on stdout, and success
            click.echo(exc.ctx.get_help())  # type: ignore[attr-defined]
            return 0
        from orchestrator.cli.output import print_usage_error

        print_usage_error(*usage_error_text(exc))
        return 2 if isinstance(exc, click.UsageError) else exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except Exception as exc:  # the boundary: never a traceback unless --debug
        if debug:
            raise
        click.echo(f"error: internal error: {type(exc).__name__}: {exc}", err=True)
        click.echo("hint: rerun with --debug for the traceback, and report it", err=True)
        return 1


def usage_error_text(exc: click.ClickException) -> tuple[str, str]:
    """A flag or argument click refused, as orch's (message, hint): the message says what was
    wrong, the hint where the right usage is written."""
    text = " ".join(exc.format_message().split()).rstrip(".")
    message = text[:1].lower() + text[1:]
    ctx = getattr(exc, "ctx", None)
    name = getattr(exc, "command_name", None)  # click >= 8.4's NoSuchCommand
    if name is None and message.startswith("no such command "):
        name = message.removeprefix("no such command ").strip("'")
    if name is not None and ctx is not None and isinstance(ctx.command, click.Group):
        import difflib

        close = difflib.get_close_matches(name, ctx.command.list_commands(ctx), n=3, cutoff=0.6)
        message = f"no such command '{name}'" + (f"; did you mean {', '.join(repr(c) for c in close)}?" if close else "")
        return message, f"`{ctx.command_path} --help` lists the commands"
    if ctx is None:
        return message, "`orch --help` lists the commands"
    usage = " ".join(ctx.get_usage().split()).removeprefix("Usage: ")
    return message, f"usage: {usage}; `{ctx.command_path} --help` explains every option"


def run() -> None:
    sys.exit(main())
