"""HAProxy's files (Ray 2.60 writes an admin socket of `mode 666 level admin`) go into a 0700
folder of the cluster's temp dir that orch makes (``remote/node_programs/private_dir.py``) before `ray start`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.ray_nodes import haproxy_paths, private_dir_argv, ray_process_env
from orchestrator.manifest.load import load_manifest
from orchestrator.manifest.sections import RAY_TEMP_DIR_MAX_BYTES

NODE_ID = "4a51e475b74873aa368577d96ff6ca434bb306068e8ff1632b78d131"  # a Ray node id (56 hex)


def _manifest(temp: str, env: str = ""):
    return load_manifest(f"name: c\nnodes: [{{name: a, host: 1.2.3.4, role: head, gpus: 1}}]\nray: {{temp_dir: {temp}}}\n{env}",
                         Path("/x/c.yaml"))  # fmt: skip


def _run(m, path: str) -> subprocess.CompletedProcess:
    argv = private_dir_argv(m, m.head, path)
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_ray_env_points_haproxy_files_into_the_private_folder():
    m = _manifest("/tmp/orch-x")
    env = ray_process_env(m, m.head, None, token_path="/t", cluster_id="0123456789abcdef")
    for name in ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH", "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC",
                 "RAY_SERVE_HAPROXY_SERVER_STATE_FILE"):  # fmt: skip
        assert env[name].startswith("/tmp/orch-x/hap/"), name
    assert env["RAY_SERVE_HAPROXY_SERVER_STATE_BASE"] == "/tmp/orch-x/hap"
    off = _manifest("/tmp/orch-x", "env: {RAY_SERVE_ENABLE_HA_PROXY: '0'}\n")
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in ray_process_env(off, off.head, None, token_path="/t")


def test_socket_paths_fit_the_unix_limit_for_the_longest_temp_dir():
    """Ray appends /<node id>/<name> to each socket path; AF_UNIX allows 107 bytes."""
    longest = "/" + "t" * (RAY_TEMP_DIR_MAX_BYTES - 1)
    paths = haproxy_paths(longest)
    for name in ("RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"):
        d, f = os.path.split(paths[name])
        assert len(os.path.join(d, NODE_ID, f).encode()) <= 107


def test_private_dir_is_made_0700_and_an_existing_one_tightened(tmp_path):
    m = _manifest("/tmp/orch-x")
    target = tmp_path / "temp" / "hap"
    assert _run(m, str(target)).returncode == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    target.chmod(0o755)  # e.g. left so by an older orch
    assert _run(m, str(target)).returncode == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


def test_private_dir_refuses_a_symlink_or_someone_elses_folder(tmp_path):
    m = _manifest("/tmp/orch-x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    link = tmp_path / "hap"
    link.symlink_to(elsewhere)
    res = _run(m, str(link))
    assert res.returncode != 0 and "refusing to use it" in res.stderr
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755  # not touched through the link
    if os.getuid() != 0:
        pytest.skip("planting another user's folder needs root")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    res = _run(m, str(planted))
    assert res.returncode != 0 and "is not a directory of uid 0" in res.stderr


def test_the_longest_temp_dir_fits_every_socket_rays_dashboard_makes():
    """Ray's own names (Ray 2.60): the session folder (``ray/_private/node.py``: session_<date with
    microseconds>_<pid>, a pid of up to 7 digits under Linux's largest pid_max), the dashboard's
    subprocess modules, found the way the dashboard finds them (``get_all_modules``), each with a
    socket ``dash_<module>`` (``get_socket_path``), checked by Ray's own ``validate_socket_filepath``.
    A temp_dir of the manifest's longest length fits every one; one byte more breaks one (the
    limit is no looser than it must be). Too long, the dashboard dies at start with ``Module
    MetricsHead failed to start`` (seen with a 44-byte folder)."""
    import datetime

    from ray._private.utils import validate_socket_filepath
    from ray.dashboard.subprocesses.module import SubprocessModule
    from ray.dashboard.subprocesses.utils import get_socket_path
    from ray.dashboard.utils import get_all_modules

    modules = [cls.__name__ for cls in get_all_modules(SubprocessModule)]
    assert "MetricsHead" in modules and "TaskEventsHead" in modules, modules
    session = f"session_{datetime.datetime(2026, 12, 4, 22, 45, 57, 975135).strftime('%Y-%m-%d_%H-%M-%S_%f')}_{4194304}"

    def sockets(temp: str) -> None:
        for name in modules:
            get_socket_path(os.path.join(temp, session, "sockets"), name)  # raises OSError when too long
        validate_socket_filepath(os.path.join(temp, session, "sockets", "plasma_store"))

    sockets("/" + "t" * (RAY_TEMP_DIR_MAX_BYTES - 1))
    with pytest.raises(OSError, match="AF_UNIX path length"):
        sockets("/" + "t" * RAY_TEMP_DIR_MAX_BYTES)
