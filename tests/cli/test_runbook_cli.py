"""`orch runbook CODE`: prints the runbook shipped with orch; every hint names the command."""

from __future__ import annotations

import json
import re
from pathlib import Path

from orchestrator import resources
from orchestrator.cli import main
from orchestrator.preflight import findings

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = REPO / "runbooks"


def test_prints_the_runbook_file_verbatim(capsys):
    assert main(["runbook", "NO_NVLINK"]) == 0
    assert capsys.readouterr().out == (RUNBOOKS / "NO_NVLINK.md").read_text()


def test_code_is_case_insensitive_and_topic_runbooks_work(capsys):
    assert main(["runbook", "nic_down"]) == 0
    assert capsys.readouterr().out.startswith("# NIC_DOWN: the manifest's interface is down\n")
    assert main(["runbook", "acceptance"]) == 0
    assert capsys.readouterr().out == (RUNBOOKS / "acceptance.md").read_text()


def test_unknown_code_is_a_usage_error_with_the_closest_codes(capsys):
    assert main(["runbook", "NIC_DWN"]) == 2
    err = capsys.readouterr().err
    assert "error: no runbook for 'NIC_DWN'; did you mean NIC_DOWN" in err
    assert "hint: `orch runbook` lists every code" in err


def test_without_code_lists_every_runbook_with_its_title(capsys):
    assert main(["runbook"]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected = sorted(p.stem for p in RUNBOOKS.glob("*.md") if p.name != "README.md")
    patterns = sorted(p.stem for p in (RUNBOOKS / "patterns").glob("*.md"))
    assert len(patterns) >= 5 and "one-gpu-oom" in patterns
    assert [ln.split()[0] for ln in lines] == expected + patterns  # the codes, then the patterns
    row = next(ln for ln in lines if ln.startswith("one-gpu-oom "))
    assert row.split(None, 1)[1] == "Pattern: one GPU runs out of memory while the others have room"
    row = next(ln for ln in lines if ln.startswith("MIG_ENABLED "))
    assert row.split(None, 1)[1] == "MIG mode is enabled on a GPU"  # first heading of runbooks/MIG_ENABLED.md


def test_a_pattern_prints_its_file_and_names_it(capsys):
    assert main(["runbook", "one-gpu-oom"]) == 0
    assert capsys.readouterr().out == (RUNBOOKS / "patterns" / "one-gpu-oom.md").read_text()
    assert main(["runbook", "one-gpu-oom", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["file"] == "runbooks/patterns/one-gpu-oom.md" and data["kind"] == "pattern"
    assert main(["runbook", "one-gpu"]) == 2
    assert "did you mean one-gpu-oom?" in capsys.readouterr().err


def test_every_runbook_a_page_sends_a_reader_to_exists(capsys):
    """A runbook that says `orch runbook NAME` names one that prints (a pattern or a code)."""
    named = {m for p in RUNBOOKS.rglob("*.md") for m in re.findall(r"`orch runbook ([\w-]+)`", p.read_text())}
    assert {"one-gpu-oom", "multi-node-start-hangs"} <= named
    for name in sorted(named):
        assert main(["runbook", name]) == 0, name
    capsys.readouterr()


def test_json(capsys):
    assert main(["runbook", "PROBE_FAILED", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["code"] == "PROBE_FAILED" and data["file"] == "runbooks/PROBE_FAILED.md"
    assert data["text"] == (RUNBOOKS / "PROBE_FAILED.md").read_text()


def test_a_finding_hint_names_a_command_that_prints_its_runbook(capsys):
    f = findings.finding("warn", findings.NO_NVLINK, "n1", "m", "keep TP inside NVLink islands.")
    command = re.search(r"`orch (runbook \w+)`", f.hint)
    assert command and f.hint.endswith("runbooks/NO_NVLINK.md")
    assert main(command.group(1).split()) == 0
    assert capsys.readouterr().out.startswith("# NO_NVLINK")


def test_a_source_checkout_reads_the_top_level_folders():
    # No orchestrator/_data in a checkout: the folders users browse are the ones read.
    assert resources.folder("runbooks") == RUNBOOKS
    assert resources.folder("templates") == REPO / "cluster-templates"
    assert resources.read_text("templates", "serve-app.yaml.j2") == (REPO / "cluster-templates" / "serve-app.yaml.j2").read_text()
