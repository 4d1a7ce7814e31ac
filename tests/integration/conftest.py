"""Integration tests (real sshd test hosts, real Ray): ordering around the shared cluster.

Tests marked ``ends_cluster`` take the shared Ray cluster of tests/fixtures/cluster.py down;
they run after every other test of the session so that the cluster is started once, not again
after each of them (``ray_testbed_cluster`` would bring it back, at ~1 minute a time). Tests
marked ``disrupts_serving`` (orch accept kills an engine and redeploys) run just before them.
"""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "ends_cluster: takes the shared test-bed Ray cluster down (runs last)")
    config.addinivalue_line(
        "markers", "disrupts_serving: kills or redeploys the shared served app (runs after the tests that read it)"
    )


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        if item.get_closest_marker("ends_cluster"):
            return 2
        return 1 if item.get_closest_marker("disrupts_serving") else 0

    items.sort(key=rank)  # stable: the order inside each group is kept
