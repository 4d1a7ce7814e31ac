"""`orch validate FILE...`: check cluster manifests. Reads the files, touches nothing else.

Every file is checked, even after a bad one; each problem is printed as
``error: FILE:LINE: FIELD.PATH: what was wrong`` and the exit code is 2 if any file failed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from orchestrator.cli.output import colour_enabled, error_label, ok_label, print_json
from orchestrator.errors import ManifestError
from orchestrator.manifest.load import load_manifest_file
from orchestrator.manifest.sections import HINT, MISSING_HINT


@click.command("validate")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path, dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {file, valid, summary|problems}.")
def validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Check cluster manifests (FILE... are cluster.yaml files).

    \b
    Exit 0 when every file is valid (one `ok` line each), 2 when any is not;
    every problem names the file, the line and the field, e.g.
      error: cluster.yaml:12: nodes[2].gpus: must be at least 1 on a gpu cluster (got 0)
    """
    reports: list[dict[str, Any]] = []
    for path in files:
        try:
            manifest = load_manifest_file(path)
        except ManifestError as exc:
            reports.append({"file": str(path), "valid": False, "problems": list(exc.problems)})
        else:
            reports.append(
                {
                    "file": str(path),
                    "valid": True,
                    "summary": manifest.summary(),
                    "fingerprint": manifest.fingerprint(),
                }
            )
    failed = [r for r in reports if not r["valid"]]
    if as_json:
        print_json(reports)
    else:
        for report in reports:
            if report["valid"]:
                click.echo(f"{ok_label()}  {report['file']}: {report['summary']}", color=colour_enabled(sys.stdout))
            else:
                for problem in report["problems"]:
                    click.echo(f"{error_label()} {problem}", err=True, color=colour_enabled(sys.stderr))
    if failed:
        # Raised rather than ctx.exit(2): the CLI boundary turns it into the last `error:` line,
        # the hint and exit code 2.
        if len(reports) == 1:
            count = len(failed[0]["problems"])
            summary = f"{failed[0]['file']} is not a valid manifest ({count} problem{'s' if count != 1 else ''})"
        else:
            summary = f"{len(failed)} of {len(reports)} manifests are not valid: {', '.join(r['file'] for r in failed)}"
        missing = all(p.endswith(": no such file") for r in failed for p in r["problems"])
        raise ManifestError(summary, hint=MISSING_HINT if missing else HINT)
