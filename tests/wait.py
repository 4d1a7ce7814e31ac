"""Waiting for an event in a test: poll a predicate under one generous deadline.

Tests never sleep a fixed time and never assert how long something took: they wait for the
event they need (a process gone, a port open, a metric count reached) and fail, naming it, only
when the deadline passes. The deadline is generous on purpose (CI shares 2 cores); the poll
interval only bounds how late the event is noticed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, what: str, timeout: float = 60.0, interval: float = 0.1) -> T:
    """Return the first truthy value of ``predicate()``; fail the test naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
