"""The integration tests' own hooks (tests/integration/conftest.py): the session's bare vLLM
server stops after the last test that uses it, never before."""

from __future__ import annotations

from types import SimpleNamespace

from tests.fixtures import vllm_server
from tests.integration import conftest


def _items(*uses: bool):
    session = SimpleNamespace(items=[])
    session.items += [SimpleNamespace(nodeid=f"t{i}", fixturenames=["vllm_server"] if u else ["tmp_path"], session=session)
                      for i, u in enumerate(uses)]
    return session.items


def test_the_bare_server_stops_after_its_last_user_only(monkeypatch):
    stops = []
    monkeypatch.setattr(conftest, "stop_after_last_user", lambda: stops.append(True))
    items = _items(True, False, True, False)
    for index, item in enumerate(items):
        conftest.pytest_runtest_teardown(item, items[index + 1] if index + 1 < len(items) else None)
        assert stops == ([True] if index >= 2 else []), index


def test_stopping_twice_sends_no_signal_the_second_time(monkeypatch):
    killed = []
    monkeypatch.setattr(vllm_server.os, "killpg", lambda pid, sig: killed.append((pid, sig)) or (_ for _ in ()).throw(ProcessLookupError()))
    proc = SimpleNamespace(pid=12345, wait=lambda timeout: 0)
    monkeypatch.setattr(vllm_server, "_RUNNING", [proc])
    vllm_server.stop_after_last_user()
    vllm_server._stop(proc)  # the fixture's own teardown at the session's end
    assert killed == [(12345, vllm_server.signal.SIGTERM)]
