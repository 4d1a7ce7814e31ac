"""Integration tests (real sshd test hosts, real Ray): ordering around the shared cluster, and
the two parts `make test` runs side by side.

Order: first every test on the session's shared cluster (tests/fixtures/cluster.py, the served
model), then those marked ``disrupts_serving`` (orch accept kills an engine and redeploys), then
those marked ``ends_cluster``, which take the shared Ray cluster down: the cluster is started once,
not again after each of them (``ray_testbed_cluster`` would bring it back, at ~1 minute a time).
The modules with their own beds run last, with the shared cluster already down, so its idle Ray
processes and engine do not take CPU from their engines.

``--integration-part`` selects a part. ``shared``: every test that uses the session's shared
cluster (``_ray_testbed_session``: the served model, the cluster tests); ``beds``: every other test
(each module builds its own bed). They share no fixture, so they can run as two pytest sessions
(on two machines, or one after the other to bisect a failure); at once on this 2-core, 24 GiB
machine they were slower than one session (their engines start side by side). ``light``: the
tests of the beds part that start no Ray cluster and no vLLM engine (no ``ray`` or ``vllm``
mark: SSH, model sync, preflight, the collective check); ``heavy``: every other test. `make
test` runs light beside heavy: the light tests mostly wait on networks and timeouts, so they take
the second core while an engine starts on the first. (pytest-xdist's ``--dist loadgroup`` split
even explicitly marked groups over both workers with pytest 9.2 and xdist 3.8: measured.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

# The session's bare vLLM server, registered here once: a session fixture imported into several
# test modules is defined once per module, and each definition starts its own server.
from tests.fixtures.vllm_server import stop_after_last_user, vllm_server  # noqa: F401

SHARED_CLUSTER_FIXTURE = "_ray_testbed_session"
VLLM_SERVER_FIXTURE = "vllm_server"
MEASURED = pytest.StashKey[list[str]]()


def pytest_configure(config):
    config.addinivalue_line("markers", "ends_cluster: takes the shared test-bed Ray cluster down (runs last)")
    config.addinivalue_line(
        "markers", "disrupts_serving: kills or redeploys the shared served app (runs after the tests that read it)"
    )


def part_of(item) -> str:
    """The part an integration test belongs to: the shared cluster's, else the beds'."""
    return "shared" if SHARED_CLUSTER_FIXTURE in getattr(item, "fixturenames", ()) else "beds"


def weight_of(item) -> str:
    """``light`` for a test of the beds part that starts no Ray and no vLLM, else ``heavy``."""
    starts = item.get_closest_marker("ray") or item.get_closest_marker("vllm")
    return "light" if part_of(item) == "beds" and not starts else "heavy"


def in_part(item, part: str) -> bool:
    return (weight_of(item) if part in ("light", "heavy") else part_of(item)) == part


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        if item.get_closest_marker("ends_cluster"):
            return 2
        if item.get_closest_marker("disrupts_serving"):
            return 1
        return 0 if part_of(item) == "shared" else 3

    items.sort(key=rank)  # stable: the order inside each group is kept
    part = config.getoption("--integration-part", default=None)  # registered by the root conftest.py
    if part is None:
        return
    keep = [i for i in items if not i.nodeid.startswith("tests/integration/") or in_part(i, part)]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_runtest_teardown(item, nextitem):
    """The session's bare vLLM server (tests/fixtures/vllm_server.py) stops after the last test
    that uses it, not at the session's end: its idle engine would take CPU from every later one."""
    if VLLM_SERVER_FIXTURE not in getattr(item, "fixturenames", ()):
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if item in items else []
    if not any(VLLM_SERVER_FIXTURE in getattr(i, "fixturenames", ()) for i in later):
        stop_after_last_user()


@pytest.fixture
def measured(request) -> Callable[[str], None]:
    """Record a figure a test measured (a time to failure, a restart); every figure is printed at
    the end of the run, so CI's log keeps them beside the durations table. Never asserted on."""
    figures = request.config.stash.setdefault(MEASURED, [])
    return lambda text: figures.append(f"{request.node.nodeid.split('::')[-1]}: {text}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    figures = config.stash.get(MEASURED, [])
    if figures:
        terminalreporter.section("figures measured by the integration tests")
        for line in figures:
            terminalreporter.write_line(line)
