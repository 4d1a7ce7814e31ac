"""Multi-host test bed (library): N hosts on this machine, each a network namespace with its own
address, sshd, host key and stand-in nvidia-smi. See docs/remote-and-testbed.md.

``TestbedFactory().make([HostSpec("8xH100-80GB"), HostSpec("4xA100-40GB", nics=("ib0",))])``
returns a running ``Testbed``; pytest code uses the ``testbed_factory`` fixture
(tests/fixtures/testbed.py), people use ``scripts/testbed.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from tests.testbed.bed import HostSpec, Testbed, TestHost, check_capabilities
from tests.testbed.gpus import GpuProfile, parse_profile
from tests.testbed.runs import cleanup_stale, list_runs, owner_alive, teardown_run

__all__ = [
    "GpuProfile",
    "HostSpec",
    "TestHost",
    "Testbed",
    "TestbedFactory",
    "check_capabilities",
    "cleanup_stale",
    "list_runs",
    "owner_alive",
    "teardown_run",
    "parse_profile",
]


class TestbedFactory:
    """Makes test beds and tears every one of them down in ``close_all()``."""

    __test__ = False

    def __init__(self) -> None:
        self.beds: list[Testbed] = []

    def make(self, hosts: int | Sequence[HostSpec] = 3, name: str | None = None, timeout: float = 30.0) -> Testbed:
        """Start a test bed. ``hosts``: a count (that many 8xH100-80GB hosts) or HostSpecs."""
        specs = [HostSpec() for _ in range(hosts)] if isinstance(hosts, int) else list(hosts)
        bed = Testbed(specs, name=name)
        self.beds.append(bed)
        return bed.start(timeout=timeout)

    def close_all(self) -> None:
        errors = []
        for bed in reversed(self.beds):
            try:
                bed.close()
            except Exception as exc:  # keep tearing down the others
                errors.append(exc)
        self.beds.clear()
        if errors:
            raise errors[0]
