"""Integration tests (real sshd test hosts, real Ray): ordering around the shared cluster, and
the groups that let two pytest-xdist workers run them side by side.

Tests marked ``ends_cluster`` take the shared Ray cluster of tests/fixtures/cluster.py down;
they run after every other test of the session so that the cluster is started once, not again
after each of them (``ray_testbed_cluster`` would bring it back, at ~1 minute a time). Tests
marked ``disrupts_serving`` (orch accept kills an engine and redeploys) run just before them.

Under ``pytest -n 2 --dist loadgroup`` (``make test``) each test gets an ``xdist_group``: every
test that uses the session's shared cluster (``_ray_testbed_session``: the served model, the
cluster tests) is one group, so that cluster is started once and in the order above; every other
module is its own group, so its module-scoped bed is built once. A group runs whole on one worker;
the two workers take groups as they free up (largest first), so the GPU-path module's bed and the
shared cluster run at the same time instead of one after the other.
"""

from __future__ import annotations

import pytest

SHARED_CLUSTER_GROUP = "shared-cluster"
SHARED_CLUSTER_FIXTURE = "_ray_testbed_session"


def pytest_configure(config):
    config.addinivalue_line("markers", "ends_cluster: takes the shared test-bed Ray cluster down (runs last)")
    config.addinivalue_line(
        "markers", "disrupts_serving: kills or redeploys the shared served app (runs after the tests that read it)"
    )


def group_of(item) -> str:
    """The xdist group of an integration test: the shared cluster's, else its module's."""
    if SHARED_CLUSTER_FIXTURE in getattr(item, "fixturenames", ()):
        return SHARED_CLUSTER_GROUP
    return item.nodeid.split("::", 1)[0]


# tryfirst: the groups must be marked before xdist's own hook reads them into the test ids.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        if item.get_closest_marker("ends_cluster"):
            return 2
        return 1 if item.get_closest_marker("disrupts_serving") else 0

    items.sort(key=rank)  # stable: the order inside each group is kept
    for item in items:
        if item.nodeid.startswith("tests/integration/") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group_of(item)))
