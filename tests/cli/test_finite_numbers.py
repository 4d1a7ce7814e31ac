"""Every float option of orch refuses nan and inf with exit 2 (issue 12: `--timeout nan` waited
forever, `--gpu-memory-gib inf` gave "internal error", `--kv-cache-gib nan` printed "short by
nan GiB"). The first test walks the real command tree, so an option added later is held too."""

from __future__ import annotations

import click
import pytest

from orchestrator.cli import COMMANDS, cli, main
from orchestrator.cli.params import FiniteFloat


def _float_options() -> list[tuple[str, str]]:
    ctx = click.Context(cli)
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        for p in cmd.params:
            if isinstance(p, click.Option) and isinstance(p.type, click.types.FloatParamType):
                out.append((name, p.opts[0]))
                assert isinstance(p.type, FiniteFloat), f"orch {name} {p.opts[0]}: a float option that accepts nan/inf"
    return out


def test_every_float_option_is_finite():
    found = _float_options()
    # the ones of issue 12 are among them (and the walk found options at all)
    for cmd, opt in [("rollout", "--timeout"), ("rollback", "--timeout"), ("up", "--timeout"), ("plan", "--gpu-memory-gib"),
                     ("plan", "--kv-cache-gib"), ("bench", "--rate")]:  # fmt: skip
        assert (cmd, opt) in found


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e999"])
@pytest.mark.parametrize("cmd,opt", [("rollout", "--timeout"), ("up", "--timeout"), ("plan", "--gpu-memory-gib"),
                                     ("plan", "--kv-cache-gib"), ("status", "--interval"), ("bench", "--rate")])  # fmt: skip
def test_non_finite_values_exit_2_before_anything_runs(cmd, opt, value, capsys, tmp_path):
    rc = main(["--state-dir", str(tmp_path), cmd, f"{opt}={value}"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "is not a finite number" in err and opt in err
    assert "internal error" not in err


def test_since_of_doctor_refuses_an_infinite_duration(capsys, tmp_path):
    assert main(["--state-dir", str(tmp_path), "doctor", "--since", "9" * 400]) == 2
    assert "not a finite duration" in capsys.readouterr().err
