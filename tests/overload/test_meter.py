"""The saturation meter's level, step by step on a clock of the test's
(LoadMeter.window: a closed window's busy percent, loop lag and wait of
held-back input): when each level begins and ends, the hysteresis, the
thresholds off, and a level held by DEBUG SHED-LEVEL's force."""

from __future__ import annotations

import pytest

from fastlimit._load import PRIORITIES, LoadMeter, priority_value

W = 20      # ms between windows, as the probe closes them


def levels(windows, threshold=90, lag_ms=5, normal_lag_ms=20) -> list[int]:
    """The level after each window: (busy %, lag ms, wait ms), one every W ms."""
    m = LoadMeter()
    m.configure(threshold, lag_ms, normal_lag_ms)
    out = []
    for i, (busy, lag, wait) in enumerate(windows):
        m.window(1_000 + i * W, busy, lag, wait)
        out.append(m.level)
    return out


IDLE, BUSY, LATE, QUEUED = (10, 0, 0), (95, 1, 0), (40, 8, 0), (100, 1, 30)


@pytest.mark.parametrize("windows, expected", [
    ([IDLE] * 3, [0, 0, 0]),
    # saturated by busy share, or by a late turn alone: level 1 at once
    ([IDLE, BUSY, BUSY], [0, 1, 1]),
    ([IDLE, LATE], [0, 1]),
    # ... ending only after 100 ms of calm (the fifth calm window, at 100 ms)
    ([BUSY] + [IDLE] * 7, [1, 1, 1, 1, 1, 1, 0, 0]),
    # shedding lowers the load: saturated until 10 points below the threshold
    ([BUSY] + [(85, 1, 0)] * 7, [1] * 8),
    ([BUSY] + [(79, 1, 0)] * 7, [1] * 6 + [0, 0]),
    ([(85, 1, 0)] * 3, [0, 0, 0]),
    # calm broken before the hold is over starts the hold again
    ([BUSY, IDLE, IDLE, BUSY, IDLE, IDLE, IDLE, IDLE, IDLE, IDLE],
     [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]),
    # level 2: busy and 20 ms late for 100 ms in a row (level 1 meanwhile)
    ([QUEUED] * 7, [1, 1, 1, 1, 1, 2, 2]),
    # ... one window short of it: never 2
    ([QUEUED] * 5 + [BUSY] + [QUEUED] * 3, [1] * 9),
    # ... late but not busy (the machine did not run the process): never 2
    ([(30, 25, 0)] * 8, [1] * 8),
    # ... the wait of held-back input counts as lateness
    ([(100, 0, 25)] * 6, [1, 1, 1, 1, 1, 2]),
    # level 2 ends with its signals; level 1 then holds 100 ms
    ([QUEUED] * 6 + [IDLE] * 7, [1] * 5 + [2] + [1] * 5 + [0, 0]),
])
def test_the_level_step_by_step(windows, expected):
    assert levels(windows) == expected


def test_a_threshold_of_zero_never_sheds():
    assert levels([BUSY, QUEUED, LATE] + [QUEUED] * 6, threshold=0) == [0] * 9


def test_normal_checks_are_never_shed_unless_asked():
    assert levels([QUEUED] * 8, normal_lag_ms=0) == [1] * 8


def test_the_thresholds_are_the_settings():
    assert levels([(60, 0, 0)], threshold=50) == [1]
    assert levels([(40, 3, 0)], lag_ms=2) == [1]
    assert levels([(100, 12, 0)] * 7, normal_lag_ms=10)[-1] == 2


def test_a_forced_level_holds_whatever_the_windows_say():
    m = LoadMeter()
    m.configure(90, 5, 20)
    m.force(2)
    m.window(1_000, *IDLE)
    assert (m.level, m.forced) == (2, True)
    m.force(-1)
    m.window(1_020, *IDLE)
    assert m.level == 1 and not m.forced        # measured again: down from 2 at once
    with pytest.raises(ValueError):
        m.force(3)


@pytest.mark.parametrize("priority", range(3))
@pytest.mark.parametrize("level", range(3))
def test_shed_is_every_priority_below_the_level(level, priority):
    m = LoadMeter()
    m.force(level)
    assert m.shed(priority) == (priority < level)
    assert sum(m.shed_counts()[PRIORITIES[priority]]) == (priority < level)


@pytest.mark.parametrize("name, value", [
    ("low", 0), ("normal", 1), ("critical", 2), ("LOW", 0), ("Critical", 2), (b"normal", 1),
    ("", None), ("urgent", None), ("0", None), ("lowx", None), ("critica", None),
])
def test_priority_names(name, value):
    assert priority_value(name) == value
