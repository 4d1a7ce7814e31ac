"""poll_until over a fake clock: tries, sleeps and the deadline."""

from orchestrator.polling import poll_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_returns_the_first_done_value_without_sleeping_after_it():
    clock, values = Clock(), iter([1, 2, 3, 4])
    out = poll_until(lambda: next(values), lambda v: v == 3, deadline=200.0, clock=clock, sleep=clock.sleep, interval=2.0)
    assert (out.value, out.done) == (3, True)
    assert clock.sleeps == [2.0, 2.0]


def test_gives_up_at_the_deadline_with_the_last_value_and_never_sleeps_past_it():
    clock, calls = Clock(), []
    out = poll_until(lambda: calls.append(clock.now) or len(calls), lambda v: False, deadline=105.0, clock=clock,
                     sleep=clock.sleep, interval=2.0)  # fmt: skip
    assert (out.value, out.done) == (4, False)
    assert calls == [100.0, 102.0, 104.0, 105.0]
    assert clock.sleeps == [2.0, 2.0, 1.0]


def test_an_attempt_that_is_done_at_once_runs_once_even_past_the_deadline():
    clock = Clock()
    out = poll_until(lambda: "x", lambda v: True, deadline=0.0, clock=clock, sleep=clock.sleep, interval=1.0)
    assert (out.value, out.done, clock.sleeps) == ("x", True, [])
