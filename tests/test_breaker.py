"""The circuit breaker (fastlimit.breaker), on a clock the test moves."""

from __future__ import annotations

from fastlimit import CircuitBreaker


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(**kwargs) -> tuple[CircuitBreaker, FakeClock]:
    clock = FakeClock()
    return CircuitBreaker(clock=clock, **kwargs), clock


def test_opens_after_n_failures_within_the_window():
    b, clock = breaker(failures=3, window_s=1.0)
    assert not b.record_failure() and not b.record_failure()
    assert b.allow()
    assert b.record_failure()
    assert b.is_open and b.opened_count == 1
    assert not b.allow()


def test_failures_spread_wider_than_the_window_do_not_open_it():
    b, clock = breaker(failures=3, window_s=1.0)
    for _ in range(10):
        b.record_failure()
        clock.now += 0.6
    assert not b.is_open


def test_one_probe_per_interval_while_open():
    b, clock = breaker(failures=1, probe_every_s=5.0)
    b.record_failure()
    clock.now += 4.9
    assert not b.allow()
    clock.now += 0.1
    assert b.allow()                         # the probe
    assert not b.allow() and not b.allow()   # everyone else waits for it
    b.record_failure()                       # the probe failed
    assert b.is_open
    clock.now += 4.9
    assert not b.allow()
    clock.now += 0.1
    assert b.allow()
    assert b.record_success()                # the probe succeeded
    assert not b.is_open and b.allow()


def test_closing_forgets_old_failures():
    b, clock = breaker(failures=2, probe_every_s=1.0)
    b.record_failure()
    b.record_failure()
    clock.now += 1
    assert b.allow() and b.record_success()
    assert not b.record_failure()            # one failure, not three
    assert not b.is_open


def test_copy_has_the_settings_and_its_own_state():
    b, clock = breaker(failures=1, window_s=2.0, probe_every_s=3.0)
    b.record_failure()
    c = b.copy()
    assert (c.failures, c.window_s, c.probe_every_s, c.clock) == (1, 2.0, 3.0, clock)
    assert b.is_open and not c.is_open
