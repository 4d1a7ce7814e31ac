"""Build configuration that setup.cfg cannot express: the data folders the commands read.

The top-level ``runbooks/`` and ``cluster-templates/`` folders are the one source of the runbooks
and the Serve template (users browse them; every finding code adds its runbook there). They are
mapped into the package as ``orchestrator/_data/runbooks`` and ``orchestrator/_data/templates``
so that a wheel carries them; ``orchestrator.resources`` reads them from there when installed and
from the folders themselves in a source checkout. Everything else is declared in setup.cfg.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {
    "orchestrator._data.runbooks": "runbooks",
    "orchestrator._data.runbooks.patterns": "runbooks/patterns",
    "orchestrator._data.templates": "cluster-templates",
}

setup(
    packages=find_packages(include=["orchestrator", "orchestrator.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    package_data={
        "orchestrator": ["py.typed"],
        "orchestrator._data.runbooks": ["*.md"],
        "orchestrator._data.runbooks.patterns": ["*.md"],
        "orchestrator._data.templates": ["*.j2", "*.yaml"],
    },
)
