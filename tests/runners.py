"""Runners for tests that run the node-side commands here for real (no SSH, no test bed)."""

from __future__ import annotations

from orchestrator.remote.local import LocalRunner


class CountingRunner:
    """Runs each command here (LocalRunner) and keeps what it ran: ``calls``, one argv per run."""

    def __init__(self, node: str) -> None:
        self.node, self.calls, self._local = node, [], LocalRunner(node)
        self.files: dict = {}

    def run(self, argv, timeout=60.0, env=None):
        self.calls.append(list(argv))
        return self._local.run(argv, timeout, env)

    def put_file(self, path, content, mode=0o600):
        """Kept here, never written: the path is under this machine's real home."""
        self.files[path] = (bytes(content), mode)
