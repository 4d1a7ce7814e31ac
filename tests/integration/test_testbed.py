"""The test bed itself: teardown leaves nothing behind, crashed runs are cleaned without
touching live ones, and hosts are separate machines as far as processes go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.remote.ssh import SshRunner
from tests.testbed import HostSpec, cleanup_stale, list_runs, network
from tests.wait import wait_until

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def leftovers(run: str) -> dict:
    return {
        "netns": network.list_netns(f"orchtb-{run}-"),
        "links": network.list_links(f"otb{run}") + network.list_links(network.bridge_name(run)),
        "dir": (Path("/var/tmp/orchtb") / run).exists(),
    }


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ssh(bed, host) -> SshRunner:
    return SshRunner(host.name, host.address, port=host.ssh_port, known_hosts=bed.known_hosts,
                     identity_file=bed.identity_file, allow_agent=False)


def test_close_removes_hosts_processes_and_network(make_testbed):
    bed = make_testbed([HostSpec("none", name="a", nics=("ib0",)), HostSpec("mig", name="b")], name="close")
    assert leftovers(bed.run_id)["netns"] and leftovers(bed.run_id)["dir"]
    with ssh(bed, bed.host("a")) as r:  # a process started on the host dies with it
        r.run(["sh", "-c", "setsid sleep 3131 </dev/null >/dev/null 2>&1 &"])
    inits = [h.init_pid for h in bed.hosts]
    bed.close()
    bed.close()  # idempotent
    assert leftovers(bed.run_id) == {"netns": [], "links": [], "dir": False}
    assert not any(alive(pid) for pid in inits)
    assert subprocess.run(["pgrep", "-f", "sleep 3131"], capture_output=True).returncode == 1


def test_processes_of_one_host_are_invisible_to_another(make_testbed):
    bed = make_testbed([HostSpec("none", name="x"), HostSpec("none", name="y")], name="pidns")
    with ssh(bed, bed.host("x")) as rx, ssh(bed, bed.host("y")) as ry:
        rx.run(["sh", "-c", "setsid sleep 2727 </dev/null >/dev/null 2>&1 &"])
        # "slee[p]": the pattern must not match the command line of the pkill call itself.
        assert ry.run(["pkill", "-f", "slee[p] 2727"]).exit_code == 1  # y sees no such process
        assert rx.run(["pgrep", "-f", "slee[p] 2727"]).exit_code == 0  # still running on x
        assert rx.run(["ps", "-e", "--no-headers"]).stdout.count("\n") < 20  # only x's own processes


def test_stale_bed_of_a_killed_session_is_cleaned_and_live_beds_are_kept(make_testbed):
    live = make_testbed([HostSpec("none", name="keep")], name="live")
    script = textwrap.dedent("""
        import sys, time
        sys.path.insert(0, sys.argv[1])
        from tests.testbed import TestbedFactory, HostSpec
        bed = TestbedFactory().make([HostSpec("none", name="doomed")], name="doomed")
        print(bed.run_id, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, str(REPO)], stdout=subprocess.PIPE, text=True)
    run = proc.stdout.readline().strip()
    try:
        assert leftovers(run)["netns"], "the doomed bed did not start"
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # no teardown, no atexit: like a crashed test run
        proc.wait()
    init = list_runs()[run]["hosts"][0]["init_pid"]
    assert alive(init) and leftovers(run)["netns"]
    cleaned = cleanup_stale()
    assert run in cleaned and live.run_id not in cleaned
    assert leftovers(run) == {"netns": [], "links": [], "dir": False}
    wait_until(lambda: not alive(init), what=f"the stale bed's host init (pid {init}) to exit", timeout=30)
    with ssh(live, live.host("keep")) as r:
        assert r.run(["true"]).exit_code == 0
