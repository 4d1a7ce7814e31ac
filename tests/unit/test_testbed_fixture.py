"""The test bed fixture skips where it cannot run, except under CI where it fails."""

from __future__ import annotations

import pytest

from tests.fixtures import testbed as fixture


def test_skips_with_the_reason_outside_ci(monkeypatch):
    monkeypatch.setattr(fixture, "check_capabilities", lambda: "the multi-host test bed needs root")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        fixture._require_testbed()


def test_fails_under_ci(monkeypatch):
    monkeypatch.setattr(fixture, "check_capabilities", lambda: "`ip netns` does not work here")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="unavailable under CI.*ip netns"):
        fixture._require_testbed()


def test_runs_when_capable(monkeypatch):
    monkeypatch.setattr(fixture, "check_capabilities", lambda: None)
    monkeypatch.setenv("CI", "true")
    assert fixture._require_testbed() is None
