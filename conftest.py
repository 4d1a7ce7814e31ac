"""Root conftest: registers the fixture modules shared across test folders."""

pytest_plugins = [
    "tests.fixtures.model",
    "tests.fixtures.testbed",
    "tests.fixtures.cluster",
    "tests.fixtures.serving",
]
