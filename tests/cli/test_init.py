"""`orch init` at the CLI (issue 25 item 9): the starter manifest, never overwriting, an
unreachable host (nothing written, exit 4), and `orch validate`'s hint for a missing file.
The probing of real hosts is tests/integration/test_init.py."""

from __future__ import annotations

from orchestrator.cli import main
from tests.cli.unreachable import closed_port, closing_port, http_port, orch_piped

__all__ = ["closed_port", "closing_port", "http_port"]


def test_init_writes_a_commented_manifest_that_validates(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    assert main(["init", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {path}: cluster 'lab' - 1 node (1 head), 8 GPUs (H100-80GB), ray :6379\n")
    assert f"next: read it, then `orch validate {path}` and `orch up {path}` (edit the placeholders first)" in out
    text = path.read_text()
    assert text.startswith("# cluster.yaml for orch, written by `orch init` on ")
    assert sum(1 for line in text.splitlines() if line.lstrip().startswith("#")) > 20  # commented
    assert main(["validate", str(path)]) == 0


def test_init_never_overwrites_without_force(tmp_path, capsys):
    path = tmp_path / "cluster.yaml"
    path.write_text("mine\n")
    assert main(["init", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {path} exists; orch init never overwrites a manifest",
                                                    "hint: pass --force, or name another FILE"]  # fmt: skip
    assert path.read_text() == "mine\n"
    assert main(["init", str(path), "--force", "--name", "other"]) == 0
    assert "\nname: other\n" in path.read_text()


def test_init_with_an_unreachable_host_writes_nothing_and_exits_4(tmp_path, closed_port):
    res = orch_piped(tmp_path, "init", "c.yaml", "--hosts", "127.0.0.1,127.0.0.2", "--port", str(closed_port), "--user", "orch-test")
    assert res.returncode == 4, res.stderr
    assert "error: cannot probe 127.0.0.1 (node0: cannot reach 127.0.0.1:" in res.stderr and "nothing was written" in res.stderr
    assert not (tmp_path / "c.yaml").exists()


def test_init_on_a_port_that_is_not_ssh_names_the_port_and_what_answered(tmp_path, http_port):
    # A web server on the port: paramiko logs 'Exception (client): Error reading SSH protocol
    # banner' and a traceback from its transport thread; without --debug only orch's error shows,
    # naming host:port and what it heard, and the hint names init's flags, not a manifest file.
    res = orch_piped(tmp_path, "init", "c.yaml", "--hosts", "127.0.0.1", "--port", str(http_port), "--user", "orch-test")
    assert res.returncode == 4, res.stderr
    assert res.stderr.splitlines() == [
        "- probing 1 host(s) over SSH: 127.0.0.1",
        f"error: cannot probe 127.0.0.1 (node0: 127.0.0.1:{http_port} is not an SSH server: it answered "
        "'HTTP/1.1 400 Bad Request' instead of an SSH banner); nothing was written",
        f"hint: check that 127.0.0.1 is up and that sshd listens on port {http_port} (`ssh -p {http_port} "
        "orch-test@127.0.0.1` from this machine); --port gives the SSH port, --user the login",
    ]
    assert not (tmp_path / "c.yaml").exists()


def test_init_on_a_port_that_closes_at_once_says_so_without_paramikos_traceback(tmp_path, closing_port):
    res = orch_piped(tmp_path, "init", "c.yaml", "--hosts", "127.0.0.1", "--port", str(closing_port))
    assert res.returncode == 4, res.stderr
    assert "Traceback" not in res.stderr and "Exception (client)" not in res.stderr, res.stderr
    assert (f"error: cannot probe 127.0.0.1 (node0: 127.0.0.1:{closing_port} is not an SSH server: it accepted the "
            "connection and closed it without sending an SSH banner); nothing was written") in res.stderr  # fmt: skip


def test_debug_shows_paramikos_own_log(tmp_path, closing_port):
    res = orch_piped(tmp_path, "--debug", "init", "c.yaml", "--hosts", "127.0.0.1", "--port", str(closing_port))
    assert "debug: paramiko.transport: Exception (client): Error reading SSH protocol banner" in res.stderr, res.stderr


def test_init_refuses_a_bad_host_list(tmp_path, capsys):
    assert main(["init", str(tmp_path / "c.yaml"), "--hosts", "a,a"]) == 2
    assert "error: invalid value for --hosts: a host is listed twice: a,a" in capsys.readouterr().err


def test_validate_of_a_missing_file_points_at_orch_init(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nothere.yaml")]) == 2
    err = capsys.readouterr().err
    assert "hint: `orch init FILE` writes a commented starter manifest; `orch init FILE --hosts H1,H2 --user USER` fills it in" in err
    assert main(["up", str(tmp_path / "nothere.yaml")]) == 2
    assert "hint: `orch init FILE` writes a commented starter manifest" in capsys.readouterr().err
