"""Root conftest: registers the fixture modules shared across test folders."""

pytest_plugins = [
    "tests.fixtures.model",
    "tests.fixtures.testbed",
    "tests.fixtures.cluster",
    "tests.fixtures.serving",
]


def pytest_addoption(parser):
    # tests/integration/conftest.py: the parts of the integration tests (`make test` runs light beside the rest).
    parser.addoption("--integration-part", choices=("shared", "beds", "light", "heavy"), default=None,
                     help="Integration tests: those on the session's shared cluster (shared) or the others (beds); "
                          "those that start no Ray and no vLLM (light) or the others (heavy).")  # fmt: skip
