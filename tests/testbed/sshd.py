"""One sshd per test host: keys, config, start/stop inside the host's namespaces.

Does I/O: runs ``ssh-keygen`` and ``nsenter ... sshd -D -e``; writes files under the host's dir.
Stack notes: sshd must run in the foreground (``-D``) inside a network namespace, and inside the
host's own pid namespace so that ``ray stop`` on one host stops only that host's processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def keygen(path: Path, comment: str) -> Path:
    """An ed25519 key pair at ``path`` / ``path.pub`` (replaced if present)."""
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def render_config(
    *,
    host_dir: Path,
    port: int,
    host_key: Path,
    authorized_keys: Path,
    bin_dir: Path,
    pythonpath: list[str],
) -> str:
    env = [f"PATH={bin_dir}:{BASE_PATH}"]
    if pythonpath:
        env.append("PYTHONPATH=" + ":".join(pythonpath))
    lines = [
        f"Port {port}",
        "ListenAddress 0.0.0.0",
        f"HostKey {host_key}",
        f"PidFile {host_dir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "AcceptEnv *",
        # SetEnv wins over the default PATH: the host's stand-in nvidia-smi comes first.
        "SetEnv " + " ".join(env),
        "Subsystem sftp internal-sftp",
        "PrintMotd no",
        "PrintLastLog no",
        "UseDNS no",
        "MaxStartups 200",
        "MaxSessions 200",
        "LogLevel INFO",
    ]
    return "\n".join(lines) + "\n"


def start(init_pid: int, config: Path, log: Path) -> subprocess.Popen:
    """Start sshd in the namespaces of the host whose init is ``init_pid``."""
    logf = open(log, "ab")
    try:
        return subprocess.Popen(
            ["nsenter", "-t", str(init_pid), "-n", "-m", "-p", "--", SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=logf,
            start_new_session=True,
        )
    finally:
        logf.close()


def children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def stop(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Stop an sshd started by ``start`` (the nsenter parent and the sshd it forked)."""
    if proc is None or proc.poll() is not None:
        return
    for child in children(proc.pid):
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        for child in children(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait(timeout)


def wait_port(address: str, port: int, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Wait until ``address:port`` accepts TCP connections (sshd is listening)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            detail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"sshd for {address}:{port} exited with {proc.returncode}: {detail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"sshd on {address}:{port} did not listen within {timeout:.0f}s")
        time.sleep(0.02)
