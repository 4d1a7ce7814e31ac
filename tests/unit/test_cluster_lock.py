"""The per-cluster lock (issue 12 item 6): real flock on a real file in a tmp dir; the holder that
dies by SIGKILL is a forked child."""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator import cluster_lock
from orchestrator.cluster_lock import ClusterBusy


def test_a_second_holder_is_refused_with_the_first_ones_pid_command_and_time(tmp_path):
    with cluster_lock.hold(tmp_path / "c", "c", "rollout", clock=lambda: 1_764_590_400.0) as me:
        assert me.pid == os.getpid()
        with pytest.raises(ClusterBusy) as err:
            with cluster_lock.hold(tmp_path / "c", "c", "down"):
                pass
        assert f"`orch rollout` (pid {os.getpid()}" in err.value.message and "since 2025-12-01 12:00:00 UTC" in err.value.message
        assert err.value.exit_code == 1 and "released when it exits" in err.value.hint
        held = cluster_lock.holder(tmp_path / "c")
        assert held is not None and held.command == "rollout" and held.pid == os.getpid()
        # Another cluster's lock is another file.
        with cluster_lock.hold(tmp_path / "other", "other", "up"):
            pass
    assert cluster_lock.holder(tmp_path / "c") is None
    with cluster_lock.hold(tmp_path / "c", "c", "down"):  # released at the end of the block
        pass


def test_the_lock_goes_with_a_holder_killed_by_sigkill(tmp_path):
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            with cluster_lock.hold(tmp_path / "c", "c", "rollout"):
                os.write(ready_w, b"1")
                signal.pause()
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    with pytest.raises(ClusterBusy, match=f"pid {pid}"):
        with cluster_lock.hold(tmp_path / "c", "c", "up"):
            pass
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with cluster_lock.hold(tmp_path / "c", "c", "up") as me:  # no stale lock to clean up
        assert me.command == "up"
