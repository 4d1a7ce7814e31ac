"""Integration tests (real sshd test hosts, real Ray): ordering around the shared cluster.

Tests marked ``ends_cluster`` take the shared Ray cluster of tests/fixtures/cluster.py down;
they run after every other test of the session so that the cluster is started once, not again
after each of them (``ray_testbed_cluster`` would bring it back, at ~1 minute a time).
"""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "ends_cluster: takes the shared test-bed Ray cluster down (runs last)")


def pytest_collection_modifyitems(session, config, items):
    last = [item for item in items if item.get_closest_marker("ends_cluster")]
    if last:
        rest = [item for item in items if not item.get_closest_marker("ends_cluster")]
        items[:] = rest + last
