"""The test beds on this machine, seen from any process: list them, tear one down, clean
up those whose test session died.

Does I/O: reads owner records under ``/var/tmp/orchtb``, kills host processes (checking first
that a pid is still the one the test bed started), deletes namespaces, links and files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path

from tests.testbed import network, sshd

BASE_DIR = Path(os.environ.get("ORCHTB_BASE", "/var/tmp/orchtb"))


def proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def kill_host(init_pid: int | None, unshare_pid: int | None) -> None:
    # Killing a pid namespace's init makes the kernel kill every process of that host.
    for pid in (init_pid, unshare_pid):
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def remove_network(run_id: str) -> None:
    for ns in network.list_netns(f"{network.PREFIX}-{run_id}-"):
        network.delete_netns(ns)
    for link in network.list_links(f"otb{run_id}") + network.list_links(network.bridge_name(run_id)):
        network.delete_link(link)
    network.release_subnets(run_id)


def list_runs() -> dict[str, dict]:
    """Run id -> its owner record (``{}`` when unreadable), for every test bed on this machine."""
    runs: dict[str, dict] = {}
    names = {p.name for p in BASE_DIR.iterdir() if p.is_dir()} if BASE_DIR.is_dir() else set()
    names |= {ns.split("-")[1] for ns in network.list_netns(f"{network.PREFIX}-") if ns.count("-") == 2}
    for run in sorted(names):
        try:
            runs[run] = json.loads((BASE_DIR / run / "owner.json").read_text())
        except (OSError, ValueError):
            runs[run] = {}
    return runs


def owner_alive(owner: Mapping) -> bool:
    return bool(owner) and proc_start_time(owner["pid"]) == owner.get("start")


def teardown_run(run: str, owner: Mapping | None = None) -> None:
    """Tear down one test bed from any process: its hosts' processes, network objects, files."""
    if owner is None:
        owner = list_runs().get(run, {})
    for pid in owner.get("unshare_pids", []):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if run.encode() in cmdline:  # still the process we started, not a reused pid
            for child in sshd.children(pid):
                kill_host(child, None)
            kill_host(pid, None)
    remove_network(run)
    shutil.rmtree(BASE_DIR / run, ignore_errors=True)


def cleanup_stale() -> list[str]:
    """Tear down test beds whose owning process is gone (a crashed or killed test run).
    Touches only objects named after the test bed's prefix, of runs without a live owner;
    manual beds (``scripts/testbed.py up``) stay until ``scripts/testbed.py down``.
    Returns the run ids cleaned."""
    cleaned = []
    runs = list_runs()
    for run, owner in runs.items():
        if owner_alive(owner) or owner.get("manual"):
            continue
        if not owner and _age_s(BASE_DIR / run) < 60:
            continue  # a bed being started right now by another session has no owner record yet
        teardown_run(run, owner)
        cleaned.append(run)
    if network.CLAIMS_DIR.is_dir():  # subnet claims of runs that left nothing else behind
        for claim in network.CLAIMS_DIR.iterdir():
            try:
                run = claim.read_text().strip()
                if run not in runs and _age_s(claim) > 60:
                    claim.unlink()
            except OSError:
                pass
    return cleaned


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")
