"""Workflows: the I/O edges of orch's commands (up, down, status, rollout, ...).

Each workflow takes its dependencies injected (a runner opener, the state store, clock, sleep,
a progress callback), decides with the pure core (``cluster.up_plan``, ``preflight``, ...) and
carries the decision out through runners. The CLI builds the real dependencies; tests pass
FakeRunners and fake dashboards.
"""
