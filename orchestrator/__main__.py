"""`python -m orchestrator` runs the CLI."""

from orchestrator.cli import run

run()
