"""RuleEngine.throttle, the engine side of CL.THROTTLE, against redis-cell's
documented replies.

redis-cell (github.com/brandur/redis-cell): `CL.THROTTLE <key> <max_burst>
<count per period> <period> [<quantity>]` replies [limited, limit,
remaining, retry_after_s (-1 when allowed), reset_after_s].  The tables
below are its README example and its own test table (rate_limiter's
it_rate_limits), played with the manual clock.  Documented differences,
each a fix of something redis-cell's users reported:

* retry_after and reset_after are rounded UP to whole seconds (redis-cell
  truncates, so a limited reply could say "retry in 0 s");
* a zero count or period is refused with ValueError (redis-cell crashes
  or errors at the first call).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from fastlimit._core import Clock
from fastlimit._rules import RuleEngine

SEED = bytes(range(16))


@pytest.fixture
def clock():
    return Clock(manual=True)


@pytest.fixture
def engine(clock):
    return RuleEngine(clock=clock, shards=16, seed=SEED)


def play(engine, clock, calls):
    """calls: [(time_ms, key, burst, count, period_s, quantity)] -> replies."""
    out = []
    for now, key, burst, count, period, quantity in calls:
        clock.set(now)
        out.append(engine.throttle(key, burst, count, period, quantity))
    return out


class RedisCellModel:
    """redis-cell's rate_limiter in exact time (ms as Fractions): the
    emission interval T = period/count, the delay variation tolerance
    dvt = T * (max_burst + 1), and per key the theoretical arrival time
    tat, kept as an absolute time so that a call may bring other
    parameters.  tat defaults to now; new_tat = max(tat, now) + T * q;
    allow_at = new_tat - dvt; diff = now - allow_at; limited when diff < 0
    (retry_after = -diff unless T * q > dvt, then -1; ttl = tat - now),
    else tat = new_tat and ttl = new_tat - now; remaining = (dvt - ttl) / T
    truncated, 0 when negative; reset_after = ttl.  The key is stored with
    a TTL of ttl, so it is gone once the time passes tat.  Seconds rounded
    up."""

    def __init__(self):
        self.tat = {}

    def throttle(self, key, burst, count, period_s, quantity, now):
        T = Fraction(period_s * 1000, count)
        dvt = T * (burst + 1)
        inc = T * quantity
        if key in self.tat and self.tat[key] <= now:
            del self.tat[key]                      # Redis expired the key at tat
        tat = self.tat.get(key, Fraction(now))
        new_tat = max(tat, now) + inc
        diff = now - (new_tat - dvt)
        if diff < 0:
            limited = 1
            retry = math.ceil(-diff / 1000) if inc <= dvt else -1
            ttl = tat - now
        else:
            limited, retry = 0, -1
            tat = new_tat
            ttl = tat - now
            if tat > now:
                self.tat[key] = tat
            else:
                self.tat.pop(key, None)            # nothing owed: as no key
        ttl = max(ttl, 0)
        nxt = dvt - ttl
        remaining = math.floor(nxt / T) if nxt > 0 else 0
        return (limited, burst + 1, remaining, retry, math.ceil(ttl / 1000))


def test_readme_example(engine, clock):
    clock.set(1_700_000_000_000)
    assert engine.throttle(b"user123", 15, 30, 60, 1) == (0, 16, 15, -1, 2)
    assert engine.throttle(b"user124", 15, 30, 60) == (0, 16, 15, -1, 2)   # quantity 1


def test_readme_example_played_out(engine, clock):
    """30 per 60 s with a burst of 15: one per 2 s, 16 at once."""
    clock.set(0)
    replies = [engine.throttle(b"user123", 15, 30, 60, 1) for _ in range(16)]
    assert replies == [(0, 16, 15 - i, -1, 2 * (i + 1)) for i in range(16)]
    assert engine.throttle(b"user123", 15, 30, 60, 1) == (1, 16, 0, 2, 32)
    assert engine.throttle(b"user123", 15, 30, 60, 1) == (1, 16, 0, 2, 32)
    assert play(engine, clock, [
        (1000, b"user123", 15, 30, 60, 1),      # half an interval later: 1 s to go
        (1999, b"user123", 15, 30, 60, 1),      # 1 ms to go: rounded up, never 0
        (2000, b"user123", 15, 30, 60, 1),      # one interval: one more
        (2000, b"user123", 15, 30, 60, 1),
        (2000, b"user123", 15, 30, 60, 0),      # quantity 0 looks without spending
        (9000, b"user123", 15, 30, 60, 1),      # 7 s: 3 intervals and a half
        (9000, b"user123", 15, 30, 60, 3),
        (9000, b"user123", 15, 30, 60, 1),
        (9000, b"user123", 15, 30, 60, 17),     # more than the limit: never
        (100000, b"user123", 15, 30, 60, 0),    # long idle: full again
        (100000, b"user123", 15, 30, 60, 16),   # the whole burst at once
        (100000, b"user123", 15, 30, 60, 1),
    ]) == [
        (1, 16, 0, 1, 31),
        (1, 16, 0, 1, 31),
        (0, 16, 0, -1, 32),
        (1, 16, 0, 2, 32),
        (0, 16, 0, -1, 32),
        (0, 16, 2, -1, 27),
        (1, 16, 2, 1, 27),
        (0, 16, 1, -1, 29),
        (1, 16, 1, -1, 29),
        (0, 16, 16, -1, 0),
        (0, 16, 0, -1, 32),
        (1, 16, 0, 2, 32),
    ]


def test_redis_cell_test_table(engine, clock):
    """redis-cell's it_rate_limits: max_burst 4, 1 per second, key "foo";
    durations in its table are given here in seconds rounded up (case 8's
    reset of 3.9 s is 4)."""
    start = 1_600_000_000_000
    cases = [
        # (ms after start, quantity, limited, remaining, retry_after_s, reset_after_s)
        (0, 6, 1, 5, -1, 0),            # never more than the maximum
        (0, 1, 0, 4, -1, 1),
        (0, 1, 0, 3, -1, 2),
        (0, 1, 0, 2, -1, 3),
        (0, 1, 0, 1, -1, 4),
        (0, 1, 0, 0, -1, 5),
        (0, 1, 1, 0, 1, 5),
        (3000, 1, 0, 2, -1, 3),
        (3100, 1, 0, 1, -1, 4),         # redis-cell: 3900 ms
        (4000, 1, 0, 1, -1, 4),
        (8000, 1, 0, 4, -1, 1),
        (9500, 1, 0, 4, -1, 1),
        (9500, 0, 0, 4, -1, 1),         # zero quantity peeks
        (9500, 2, 0, 2, -1, 3),
        (9500, 5, 1, 2, 3, 3),          # large requests cannot exceed limits
    ]
    for i, (at, quantity, limited, remaining, retry, reset) in enumerate(cases):
        clock.set(start + at)
        assert engine.throttle(b"foo", 4, 1, 1, quantity) == \
            (limited, 5, remaining, retry, reset), f"case {i}"


def test_times_are_rounded_up_to_seconds(engine, clock):
    clock.set(0)
    # 3 per second: an interval of 333.3 ms
    assert engine.throttle(b"k", 0, 3, 1) == (0, 1, 0, -1, 1)
    assert engine.throttle(b"k", 0, 3, 1) == (1, 1, 0, 1, 1)      # redis-cell says 0 and 0
    clock.set(333)
    assert engine.throttle(b"k", 0, 3, 1) == (1, 1, 0, 1, 1)      # 0.3 ms to go
    clock.set(334)
    assert engine.throttle(b"k", 0, 3, 1) == (0, 1, 0, -1, 1)
    # whole seconds stay whole
    clock.set(10_000)
    assert engine.throttle(b"s", 1, 1, 2) == (0, 2, 1, -1, 2)
    assert engine.throttle(b"s", 1, 1, 2) == (0, 2, 0, -1, 4)
    assert engine.throttle(b"s", 1, 1, 2) == (1, 2, 0, 2, 4)


@pytest.mark.parametrize("burst,count,period,quantity", [
    (15, 0, 60, 1),           # redis-cell: "Zero rates are not supported" / a crash
    (15, 30, 0, 1),
    (15, 0, 0, 1),
    (-1, 30, 60, 1),
    (15, -30, 60, 1),
    (15, 30, -60, 1),
    (15, 30, 60, -1),
    (15, 10 ** 7, 60, 1),
    (10 ** 10, 30, 60, 1),
    (10 ** 9, 1, 10 ** 9, 1),  # period * (burst + 1) too long
])
def test_unusable_numbers_are_refused(engine, burst, count, period, quantity):
    with pytest.raises(ValueError):
        engine.throttle(b"k", burst, count, period, quantity, now_ms=0)
    assert len(engine) == 0


def test_extreme_accepted_numbers(engine):
    assert engine.throttle(b"k", 0, 1, 1, 0, now_ms=0) == (0, 1, 1, -1, 0)
    assert engine.throttle(b"k", 10 ** 9, 10 ** 6, 1, 10 ** 15, now_ms=0)[:2] == (1, 10 ** 9 + 1)
    assert engine.throttle(b"k", 0, 1, 4294967, 1, now_ms=0) == (0, 1, 0, -1, 4294967)


def test_quantity_zero_spends_nothing(engine, clock):
    clock.set(5000)
    engine.throttle(b"k", 9, 10, 1, 4)
    first = engine.throttle(b"k", 9, 10, 1, 0)
    assert first == (0, 10, 6, -1, 1)
    for _ in range(20):
        assert engine.throttle(b"k", 9, 10, 1, 0) == first
    assert engine.throttle(b"fresh", 9, 10, 1, 0) == (0, 10, 10, -1, 0)
    assert len(engine) == 1                     # a peek at a fresh key stores nothing


def test_more_than_the_limit_is_never_allowed(engine, clock):
    clock.set(0)
    assert engine.throttle(b"k", 4, 1, 1, 6) == (1, 5, 5, -1, 0)
    assert engine.throttle(b"k", 4, 1, 1, 5) == (0, 5, 0, -1, 5)
    assert engine.throttle(b"k", 4, 1, 1, 6) == (1, 5, 0, -1, 5)
    clock.set(10 ** 6)
    assert engine.throttle(b"k", 4, 1, 1, 10 ** 12) == (1, 5, 5, -1, 0)


def test_keys_are_independent_and_binary(engine, clock):
    clock.set(0)
    keys = [b"", b"\x00", b"\x00\x00\x00\x00", b"user123", b"user123\x00", b"\xff" * 300]
    for k in keys:
        assert engine.throttle(k, 0, 1, 60) == (0, 1, 0, -1, 60)
    for k in keys:
        assert engine.throttle(k, 0, 1, 60) == (1, 1, 0, 60, 60)
    assert engine.throttle(b"other", 0, 1, 60) == (0, 1, 0, -1, 60)
    with pytest.raises(ValueError):
        engine.throttle(b"x" * 70000, 0, 1, 60)


def test_throttle_keys_never_meet_rule_buckets(engine, clock):
    """A GCRA rule's bucket key is <u32 rule number><client>; a throttle key
    spelled the same is still another bucket."""
    engine.define(0, {"algorithm": "gcra", "burst": 0, "count": 1, "period_ms": 60000})
    clock.set(0)
    assert engine.apply([0], b"abc")[0] == 1
    assert engine.throttle(b"\x00\x00\x00\x00abc", 0, 1, 60) == (0, 1, 0, -1, 60)
    assert engine.throttle(b"abc", 0, 1, 60) == (0, 1, 0, -1, 60)
    assert engine.apply([0], b"abc")[0] == 0
    assert engine.apply([0], b"\x00\x00\x00\x00abc")[0] == 1


def test_uses_the_engine_clock_or_now_ms(engine, clock):
    clock.set(50_000)
    assert engine.throttle(b"k", 0, 1, 10) == (0, 1, 0, -1, 10)
    assert engine.throttle(b"k", 0, 1, 10, now_ms=55_000) == (1, 1, 0, 5, 5)
    assert engine.throttle(b"k", 0, 1, 10, now_ms=60_000) == (0, 1, 0, -1, 10)


def test_clock_going_back_never_frees_capacity(engine, clock):
    clock.set(100_000)
    for _ in range(3):
        engine.throttle(b"k", 2, 1, 1)
    clock.set(90_000)
    assert engine.throttle(b"k", 2, 1, 1) == (1, 3, 0, 11, 13)
    clock.set(103_000)
    assert engine.throttle(b"k", 2, 1, 1) == (0, 3, 2, -1, 1)


def test_sweep_drops_throttle_keys(engine, clock):
    clock.set(0)
    for i in range(500):
        engine.throttle(b"k%d" % i, 4, 1, 1, 3)
    assert len(engine) == 500
    engine.sweep(now_ms=2999, budget_ms=1000.0)
    assert len(engine) == 500
    assert engine.throttle(b"k7", 4, 1, 1, 0, now_ms=2000) == (0, 5, 4, -1, 1)
    engine.sweep(now_ms=3000, budget_ms=1000.0)
    assert len(engine) == 0


@pytest.mark.parametrize("seed", range(5))
def test_random_sequences_match_redis_cell(seed):
    """Long random sequences, parameters fixed per key (several keys with
    different parameters), quantities from 0 to above the limit, time steps
    of zero, small, large and backwards."""
    rng = random.Random(seed)
    clock = Clock(manual=True)
    eng = RuleEngine(clock=clock, shards=4, seed=SEED)
    model = RedisCellModel()
    params = {}
    for k in (b"a", b"b", b"c\x00", b"d" * 50):
        params[k] = (rng.choice([0, 1, 4, 15, 99]), rng.choice([1, 2, 3, 7, 30, 1000]),
                     rng.choice([1, 2, 60, 3600]))
    now = rng.randint(0, 10 ** 9)
    for step in range(2000):
        key = rng.choice(list(params))
        burst, count, period = params[key]
        interval = max(1, period * 1000 // count)
        r = rng.random()
        if r < 0.3:
            dt = 0
        elif r < 0.7:
            dt = rng.randint(1, interval * 2)
        elif r < 0.9:
            dt = rng.randint(0, interval * (burst + 3))
        else:
            dt = -rng.randint(1, interval * 2)
        now = max(0, now + dt)
        q = rng.random()
        quantity = (0 if q < 0.15 else 1 if q < 0.6 else rng.randint(1, burst + 1)
                    if q < 0.93 else burst + 1 + rng.randint(1, 5))
        clock.set(now)
        expected = model.throttle(key, burst, count, period, quantity, now)
        got = eng.throttle(key, burst, count, period, quantity)
        assert got == expected, (seed, step, key, params[key], quantity, now)


@pytest.mark.parametrize("count,period", [(2, 2), (60, 60), (1000, 1000), (3, 3)])
def test_changing_the_numbers_on_the_fly_keeps_the_schedule(engine, clock, count, period):
    """redis-cell keeps the arrival time as an absolute time, so a key may be
    throttled with other numbers at any call ("parameters are provided with
    every invocation so that limits can easily be reconfigured on the
    fly").  The same rate spelt otherwise must find the five spent."""
    clock.set(0)
    for _ in range(5):
        engine.throttle(b"k", 4, 1, 1)
    assert engine.throttle(b"k", 4, 1, 1) == (1, 5, 0, 1, 5)
    assert engine.throttle(b"k", 4, count, period, 0) == (0, 5, 0, -1, 5)
    assert engine.throttle(b"k", 4, count, period) == (1, 5, 0, 1, 5)


def test_changing_the_numbers_on_the_fly_matches_redis_cell(engine, clock):
    rng = random.Random(7)
    model = RedisCellModel()
    now = 0
    for step in range(600):
        count = rng.choice([1, 2, 4, 5, 10])
        period = count * rng.choice([1, 2])          # 1 or 1/2 per second, exactly in ms
        burst = rng.choice([2, 3, 5])
        quantity = rng.choice([0, 1, 1, 2])
        now += rng.choice([0, 0, 100, 500, 1000, 3000])
        clock.set(now)
        assert engine.throttle(b"k", burst, count, period, quantity) == \
            model.throttle(b"k", burst, count, period, quantity, now), (step, now)


# ---- overflow: a count change rescales the stored arrival time ---------------------

MAX_NOW = 4 * 10**12
MAX_PERIOD_S = 4294967
MAX_BURST_AT_MAX_PERIOD = 10**18 // (MAX_PERIOD_S * 1000) - 1    # tolerance <= 10^18 ms


def test_a_count_change_after_a_long_limit_never_frees_the_burst(engine, clock):
    """Rescaling a 292-year arrival time to a count of 10^6 used to be
    stored truncated to 64 bits by a denied call, after which the key had
    its full burst at once.  A denied call stores nothing now, and the
    rescaled time is kept exactly (128 bits) for the answer."""
    clock.set(1_000_000)
    assert engine.throttle(b"g", 2147, 1, 4294967, 2148)[:3] == (0, 2148, 0)
    assert engine.throttle(b"g", 2147, 1, 4294967, 1)[0] == 1
    model = RedisCellModel()
    model.throttle(b"g", 2147, 1, 4294967, 2148, 1_000_000)
    for _ in range(3):
        got = engine.throttle(b"g", 2147, 1000000, 4294967, 1)
        assert got == model.throttle(b"g", 2147, 1000000, 4294967, 1, 1_000_000)
        assert got[0] == 1 and got[3] > 9 * 10**9       # limited for ~292 years
    assert engine.throttle(b"g", 2147, 1000000, 4294967, 2148)[0] == 1


@pytest.mark.parametrize("now", [0, MAX_NOW])
@pytest.mark.parametrize("first,then", [(1, 10**6), (10**6, 1), (1, 1), (10**6, 10**6)])
def test_count_changes_at_the_bounds_match_redis_cell(engine, now, first, then):
    """The largest tolerance (period 4294967 s, the largest burst it
    allows), drained at the clock's ends, then read with the smallest and
    largest counts: every reply matches the exact model and stays in
    range (the bounds are in gcra_check's docstring)."""
    burst, model = MAX_BURST_AT_MAX_PERIOD, RedisCellModel()
    for quantity in (burst + 1, 1, 0):
        for count in (first, then):
            got = engine.throttle(b"edge", burst, count, MAX_PERIOD_S, quantity, now_ms=now)
            expected = model.throttle(b"edge", burst, count, MAX_PERIOD_S, quantity, now)
            # a rescaled time is rounded up to a tick of the new count (never
            # earlier): at most one second more, once rounded to seconds
            assert got[:3] == expected[:3], (quantity, count)
            assert all(0 <= g - e <= 1 for g, e in zip(got[3:], expected[3:])), (got, expected)
            assert all(-1 <= v < 2**62 for v in got)
