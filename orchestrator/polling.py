"""One way to wait: ``poll_until`` calls an attempt until its result is done or a deadline passes,
sleeping between tries with an injected clock and sleep (house rule 8: tests never sleep). Pure
apart from the callables it is given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Polled(Generic[T]):
    """The last attempt's value and whether it was done (False: the deadline passed first)."""

    value: T
    done: bool


def poll_until(
    attempt: Callable[[], T],
    done: Callable[[T], bool],
    *,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    interval: float,
) -> Polled[T]:
    """Call ``attempt`` until ``done(value)``; the attempt runs at least once, and again after each
    sleep of ``interval`` (never past ``deadline``) until the clock reaches ``deadline``. An
    exception from ``attempt`` ends the wait (only the caller knows which errors are transient)."""
    while True:
        value = attempt()
        if done(value):
            return Polled(value, True)
        now = clock()
        if now >= deadline:
            return Polled(value, False)
        sleep(min(interval, deadline - now))
