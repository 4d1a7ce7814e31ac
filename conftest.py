"""Root conftest: registers the fixture modules shared across test folders."""

pytest_plugins = [
    "tests.fixtures.model",
    "tests.fixtures.testbed",
    "tests.fixtures.cluster",
    "tests.fixtures.serving",
]


def pytest_addoption(parser):
    # tests/integration/conftest.py: `make test` runs the two parts side by side.
    parser.addoption("--integration-part", choices=("shared", "beds"), default=None,
                     help="Integration tests: only those on the session's shared cluster (shared) or the others (beds).")  # fmt: skip
