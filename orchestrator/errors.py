"""The one error tree of orch. No I/O.

Library code raises an ``OrchError`` subclass; ``orchestrator.cli`` is the only place that turns
one into ``error: ...`` / ``hint: ...`` and an exit code. Each subclass names a failure kind and
carries the documented exit code of that kind.
"""

from __future__ import annotations


class OrchError(Exception):
    """Base of every error orch reports to a person.

    ``message`` says what went wrong (naming the node, field or file), ``hint`` what to do next
    (often a runbook link).
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(OrchError):
    """Bad flags or arguments given to a command."""

    exit_code = 2


class ManifestError(OrchError):
    """cluster.yaml is missing, unreadable or invalid. ``problems`` lists every error found."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.problems = problems or [message]


class ModelSpecError(OrchError):
    """A model name or config.json that orch cannot size."""

    exit_code = 2


class PlanError(OrchError):
    """A forced or requested parallel plan that cannot work."""

    exit_code = 2


class PreflightFailed(OrchError):
    """Preflight found failures (or warnings without --force); nothing was started."""

    exit_code = 3


class RemoteError(OrchError):
    """Base for failures of running a command on a node. ``node`` names the node."""

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None, node: str | None = None) -> None:
        super().__init__(message, hint)
        self.node = node


class UnreachableError(RemoteError):
    """The node's SSH port could not be reached (refused, no route, connect timeout)."""


class AuthenticationError(RemoteError):
    """SSH authentication failed (key or agent refused)."""


class HostKeyUnknownError(RemoteError):
    """The node's host key is not in known_hosts and --accept-new-host-keys was not given."""


class HostKeyChangedError(RemoteError):
    """The node presented a host key different from the recorded one: always refused."""


class KnownHostsError(RemoteError):
    """orch's known_hosts file has a line it cannot read (named FILE:LINE). Exit 2: the input is wrong."""

    exit_code = 2


class CommandTimeoutError(RemoteError):
    """A command ran past its timeout on the node."""


class CommandFailedError(RemoteError):
    """A command exited non-zero where success was required."""


class ClusterError(OrchError):
    """Ray bring-up or cluster state went wrong (node did not join, head down, ...)."""

    exit_code = 5


class ServeError(OrchError):
    """Ray Serve / the dashboard REST API refused or failed a request."""

    exit_code = 6


class ServeConfigError(OrchError):
    """The rendered Serve config is invalid (Ray Serve LLM's own validation refused a field)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, problems: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.problems = problems or [message]


class RolloutFailed(OrchError):
    """A new revision failed its gate; ``rolled_back`` says whether the previous one is back."""

    exit_code = 6

    def __init__(self, message: str, hint: str | None = None, rolled_back: bool = False) -> None:
        super().__init__(message, hint)
        self.rolled_back = rolled_back


class RolloutInterrupted(RolloutFailed):
    """Ctrl-C (or SIGTERM) stopped a rollout; the previous revision was put back first."""

    exit_code = 130


class ModelSyncError(OrchError):
    """`orch model sync` could not copy or verify the model on a node (the final path keeps its
    previous state there; a re-run resumes)."""


class SyncRefused(PreflightFailed):
    """`orch model sync` refused before sending anything (low disk, a path orch does not own)."""


class StateError(OrchError):
    """The local state database is missing what a command needs (no cluster up, no revision)."""

    exit_code = 1


class ClusterNotUp(StateError):
    """The command needs a running cluster and there is none: no CLUSTER_YAML given and none
    recorded as up, or the named cluster is not up. Exit 5, the code of cluster state (`orch status`
    alone reports it and exits 0)."""

    exit_code = 5


class DiskFullError(StateError):
    """A local file of orch could not be written because its filesystem is full (or over quota).
    Exit 5, like other failures of the machinery under a command rather than of its input."""

    exit_code = 5


class DiagnosisFailed(OrchError):
    """``orch doctor`` found at least one known failure (listed above the error line)."""

    exit_code = 1


class AcceptanceFailed(OrchError):
    """At least one acceptance stage failed its target."""

    exit_code = 7


# Documented exit codes (README "Exit codes" lists the same table).
EXIT_CODES: dict[int, str] = {
    0: "success (or nothing to do)",
    1: "error",
    2: "invalid input: manifest, flags, model spec or plan",
    3: "preflight failed; nothing was started",
    4: "a node could not be reached (SSH: unreachable, auth, host key, timeout); every command that needs the node",
    5: "cluster bring-up or state failed, or the cluster the command needs is not up (also: the disk under orch's state is full)",
    6: "serving: Serve API error or rollout failed (rolled back when possible)",
    7: "acceptance test failed",
    130: "interrupted (Ctrl-C, SIGTERM); a rollout puts the previous revision back before it exits",
}
