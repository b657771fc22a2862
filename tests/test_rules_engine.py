"""fastlimit._rules.RuleEngine on its own (no server, no registry): the
algorithms against plain Python models of them on long random sequences
with the manual clock, the fixed-window boundary burst and the sliding
window counter that does not allow it, all-or-nothing evaluation of
several rules, binding-rule selection, shadow rules, scopes, rule
changes, matcher caching, the concurrency limiter and the sweep.

The models are written from the algorithms' descriptions (the brief, the
issue and redis-cell's rate_limiter), in exact rational arithmetic
(fractions.Fraction), never from the Cython code.  Two modelling rules
are shared by every model:

* a denied request stores nothing (the issue: "when it is denied no
  rule's bucket is consumed"); an allowed one, cost 0 included, stores
  the state as computed at that time;
* a state that means "nothing used" (a full token bucket, an empty
  window, a GCRA arrival time not in the future) is forgotten: the
  brief's "a full bucket is indistinguishable from no bucket".
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from fastlimit._core import Clock
from fastlimit._rules import MAX_RULE_NUMBER, RuleEngine

SEED = bytes(range(16))
NO_RULE = (1, -1, -1, 0, 0)


def ceil(x) -> int:
    return math.ceil(Fraction(x))


def floor(x) -> int:
    return math.floor(Fraction(x))


@pytest.fixture
def clock():
    return Clock(manual=True)


@pytest.fixture
def engine(clock):
    return RuleEngine(clock=clock, shards=16, seed=SEED)


def tb(capacity, refill, period_ms=1000, **extra):
    return {"algorithm": "token_bucket", "capacity": capacity, "refill": refill,
            "period_ms": period_ms, **extra}


def fw(limit, window_ms, **extra):
    return {"algorithm": "fixed_window", "limit": limit, "window_ms": window_ms, **extra}


def sw(limit, window_ms, **extra):
    return {"algorithm": "sliding_window", "limit": limit, "window_ms": window_ms, **extra}


def gcra(burst, count, period_ms, **extra):
    return {"algorithm": "gcra", "burst": burst, "count": count, "period_ms": period_ms,
            **extra}


def conc(limit, lease_ms, **extra):
    return {"algorithm": "concurrency", "limit": limit, "lease_ms": lease_ms, **extra}


class Matcher:
    """A matcher answering from a dict {(resource, tier): [(num, glob)]},
    with None as a wildcard for the tier; counts its calls."""

    def __init__(self, table=None):
        self.table = dict(table or {})
        self.calls = []

    def __call__(self, resource, tier):
        self.calls.append((resource, tier))
        found = list(self.table.get((resource, tier), []))
        if tier is not None:
            found += self.table.get((resource, "*"), [])
        return found


def peek(engine, num, client=b"c", resource=b"", now=0):
    """A rule's state for a client without spending (cost 0)."""
    return engine.apply([num], client, cost=0, resource=resource, now_ms=now)


# ---- models -------------------------------------------------------------------

def as_peek(five, cost):
    """A check with cost 0 is never denied (README): the state shows in
    remaining and reset_after."""
    return (1, five[1], five[2], 0, five[4]) if cost == 0 else five


class TokenBucketModel:
    """The brief's reference token bucket, in exact rational tokens:
    capacity tokens, `refill` tokens per `period_ms`; a new bucket is full;
    elapsed = max(0, now - last); tokens = min(capacity, tokens + refill);
    allow and subtract when tokens >= cost.  Times are rounded up."""

    def __init__(self, capacity, refill, period_ms=1000):
        self.cap = capacity
        self.rate = Fraction(refill, period_ms)       # tokens per ms
        self.state = {}                               # key -> (tokens, last)

    def limit(self):
        return self.cap

    def check(self, key, cost, now, commit=True):
        tokens, last = self.state.get(key, (Fraction(self.cap), now))
        tokens = min(Fraction(self.cap), tokens + max(0, now - last) * self.rate)
        if cost > self.cap:
            allowed, retry = 0, -1
        elif tokens >= cost:
            allowed, retry = 1, 0
            if commit:
                tokens -= cost
        else:
            allowed, retry = 0, ceil((cost - tokens) / self.rate)
        five = (allowed, self.cap, floor(tokens), retry, ceil((self.cap - tokens) / self.rate))
        if commit and allowed and cost > 0:     # a peek never writes
            if tokens == self.cap:
                self.state.pop(key, None)
            else:
                self.state[key] = (tokens, now)
        return as_peek(five, cost)


class FixedWindowModel:
    """INCR + EXPIRE on windows [k*W, (k+1)*W) counted from clock zero.  One
    counter per key holds the latest window it counted in; a clock that went
    back stays in that window (never a fresh count); an empty counter is
    forgotten."""

    def __init__(self, limit, window_ms):
        self.L, self.W = limit, window_ms
        self.state = {}                               # key -> (window index, count)

    def limit(self):
        return self.L

    def check(self, key, cost, now, commit=True):
        index, count = now // self.W, 0
        if key in self.state and self.state[key][0] >= index:
            index, count = self.state[key]
        end = (index + 1) * self.W
        if cost > self.L:
            allowed, retry = 0, -1
        elif count + cost <= self.L:
            allowed, retry = 1, 0
            if commit:
                count += cost
        else:
            allowed, retry = 0, end - now
        five = (allowed, self.L, max(0, self.L - count), retry, end - now if count else 0)
        if commit and allowed and cost > 0:     # a peek never writes
            if count:
                self.state[key] = (index, count)
            else:
                self.state.pop(key, None)
        return as_peek(five, cost)


class SlidingWindowModel:
    """The sliding window counter: counts for the current and the previous
    window of W ms (aligned to clock zero); the estimate over the last W ms
    is previous * (1 - elapsed/W) + current, elapsed being the time since
    the current window began.  A request passes when estimate + cost <=
    limit.  retry_after and reset_after are found by searching the future
    (with no further requests) for the first millisecond at which the
    request would pass, or at which the estimate reaches zero."""

    def __init__(self, limit, window_ms):
        self.L, self.W = limit, window_ms
        self.state = {}                               # key -> (index, previous, current)

    def limit(self):
        return self.L

    def counters(self, key, t):
        """(window index, previous, current) in force at time t."""
        index = t // self.W
        if key not in self.state:
            return index, 0, 0
        k, prev, curr = self.state[key]
        if k >= index:                 # this window, or a later one the clock left
            return k, prev, curr
        if k == index - 1:
            return index, curr, 0
        return index, 0, 0

    def estimate(self, key, t):
        index, prev, curr = self.counters(key, t)
        elapsed = max(0, t - index * self.W)
        return prev * (1 - Fraction(elapsed, self.W)) + curr

    def first_time(self, now, predicate):
        """The first ms t >= now where predicate(t) holds; the estimate
        never grows without requests, so the predicate stays true once it
        is."""
        lo, hi = now, now + 3 * self.W
        while not predicate(hi):
            hi += 3 * self.W
        while lo < hi:
            mid = (lo + hi) // 2
            if predicate(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def check(self, key, cost, now, commit=True):
        index, prev, curr = self.counters(key, now)
        est = self.estimate(key, now)
        if cost > self.L:
            allowed, retry = 0, -1
        elif est + cost <= self.L:
            allowed, retry = 1, 0
        else:
            allowed = 0
            retry = self.first_time(now, lambda t: self.estimate(key, t) + cost <= self.L) - now
        if commit and allowed and cost > 0:     # a peek never writes
            curr += cost
            if prev or curr:
                self.state[key] = (index, prev, curr)
            else:
                self.state.pop(key, None)
            est = self.estimate(key, now)
        reset = self.first_time(now, lambda t: self.estimate(key, t) == 0) - now
        return as_peek((allowed, self.L, max(0, floor(self.L - est)), retry, reset), cost)


class GcraModel:
    """redis-cell's rate_limiter: emission interval T = period/count, delay
    variation tolerance dvt = T * (burst + 1); tat defaults to now;
    new_tat = max(tat, now) + T * quantity; allow_at = new_tat - dvt;
    diff = now - allow_at; limited when diff < 0, with retry_after = -diff
    (or -1 when T * quantity > dvt) and ttl = tat - now; else tat = new_tat
    and ttl = new_tat - now.  remaining = (dvt - ttl) / T truncated (0 when
    negative), reset_after = ttl.  Exact times in ms, rounded up."""

    def __init__(self, burst, count, period_ms):
        self.burst = burst
        self.T = Fraction(period_ms, count)
        self.dvt = self.T * (burst + 1)
        self.state = {}                               # key -> tat (ms, exact)

    def limit(self):
        return self.burst + 1

    def check(self, key, cost, now, commit=True):
        tat = self.state.get(key, Fraction(now))
        inc = self.T * cost
        new_tat = max(tat, now) + inc
        diff = now - (new_tat - self.dvt)
        if diff < 0:
            allowed = 0
            retry = ceil(-diff) if inc <= self.dvt else -1
            ttl = tat - now
        else:
            allowed, retry = 1, 0
            if commit:
                tat = new_tat
            ttl = tat - now
        ttl = max(ttl, 0)
        nxt = self.dvt - ttl
        remaining = floor(nxt / self.T) if nxt > 0 else 0
        if commit and allowed and cost > 0:     # a peek never writes
            if tat > now:
                self.state[key] = tat
            else:
                self.state.pop(key, None)
        return as_peek((allowed, self.burst + 1, remaining, retry, ceil(ttl)), cost)


# ---- random sequences against the models ---------------------------------------------

KEYS = (b"alice", b"bob", b"\x00\x01", b"user:" + b"x" * 40)


def random_params(rng, algorithm):
    if algorithm == "token_bucket":
        cap = rng.choice([1, 2, 5, 10, 37])
        refill = rng.choice([1, 2, 3, 7, 10])
        period = rng.choice([1, 7, 100, 1000, 60000])
        return tb(cap, refill, period), TokenBucketModel(cap, refill, period), \
            max(1, period * cap // refill)
    if algorithm == "fixed_window":
        limit, w = rng.choice([1, 3, 10, 25]), rng.choice([1, 3, 50, 1000, 7919])
        return fw(limit, w), FixedWindowModel(limit, w), w
    if algorithm == "sliding_window":
        limit, w = rng.choice([1, 3, 10, 25]), rng.choice([1, 2, 7, 60, 1000, 6007])
        return sw(limit, w), SlidingWindowModel(limit, w), w
    burst, count = rng.choice([0, 1, 4, 15]), rng.choice([1, 2, 3, 7, 30, 1000])
    period = rng.choice([1, 10, 999, 1000, 60000])
    return gcra(burst, count, period), GcraModel(burst, count, period), \
        max(1, period * (burst + 1) // count)


def random_cost(rng, limit):
    r = rng.random()
    if r < 0.15:
        return 0
    if r < 0.6:
        return 1
    if r < 0.9:
        return rng.randint(1, limit)
    if r < 0.97:
        return limit + rng.randint(1, 3)
    return rng.choice([limit * 10, 10 ** 12])


def random_step(rng, scale):
    r = rng.random()
    if r < 0.3:
        return 0
    if r < 0.65:
        return rng.randint(1, max(1, scale // 8))
    if r < 0.85:
        return rng.randint(scale // 2, scale * 2 + 1)
    if r < 0.92:
        return rng.randint(scale * 3, scale * 10 + 5)
    return -rng.randint(1, scale * 2 + 1)          # the clock goes back


def run_sequence(algorithm, seed, steps):
    rng = random.Random(f"{algorithm}-{seed}")
    spec, model, scale = random_params(rng, algorithm)
    clock = Clock(manual=True)
    eng = RuleEngine(clock=clock, shards=4, seed=SEED)
    eng.define(7, spec)
    eng.set_matcher(lambda resource, tier: [(7, None)])
    keys = KEYS[:rng.randint(1, len(KEYS))]
    now = rng.randint(0, 10 * scale)
    swept_at = 0
    for i in range(steps):
        # a sweep drops what has expired by its time, as Redis's own expiry
        # would: the clock is not sent back before the last sweep
        now = max(swept_at, now + random_step(rng, scale))
        key = rng.choice(keys)
        cost = random_cost(rng, model.limit())
        expected = model.check(key, cost, now)
        how = rng.random()
        if how < 0.4:
            got = eng.apply([7], key, cost=cost, now_ms=now)
        elif how < 0.7:
            got = eng.limit(key, b"GET /", cost=cost, now_ms=now)
        else:
            clock.set(now)
            got = eng.limit(key, b"GET /", b"tier", cost=cost)
        assert got == expected, (
            f"{algorithm} seed {seed} step {i}: {spec} key={key!r} cost={cost} now={now}: "
            f"engine {got} != model {expected}")
        if rng.random() < 0.02:
            eng.sweep(now_ms=now, budget_ms=50.0)     # dropping expired records changes nothing
            swept_at = now
    return eng


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("algorithm", ["token_bucket", "fixed_window", "sliding_window", "gcra"])
def test_random_sequences_match_the_model(algorithm, seed):
    run_sequence(algorithm, seed, 1500)


def test_models_against_hand_worked_examples():
    """The models themselves, on cases worked out by hand."""
    m = TokenBucketModel(5, 2)                        # the brief's worked example
    got = [m.check(b"k", 1, t)[0] for t in (0, 0, 0, 0, 0, 0, 500, 500, 1500, 1500, 1500)]
    assert got == [1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0]
    s = SlidingWindowModel(10, 1000)
    for _ in range(10):
        assert s.check(b"k", 1, 990)[0] == 1
    # at 1000: previous 10, elapsed 0; one more needs 10 * (1 - e/1000) <= 9: e >= 100
    assert s.check(b"k", 1, 1000) == (0, 10, 0, 100, 1000)
    g = GcraModel(4, 1, 1000)                         # redis-cell's own test table
    assert g.check(b"k", 6, 0) == (0, 5, 5, -1, 0)
    assert [g.check(b"k", 1, 0)[2] for _ in range(5)] == [4, 3, 2, 1, 0]
    assert g.check(b"k", 1, 0) == (0, 5, 0, 1000, 5000)
    assert g.check(b"k", 1, 3000) == (1, 5, 2, 0, 3000)
    assert g.check(b"k", 1, 3100) == (1, 5, 1, 0, 3900)


# ---- several rules at once against the models -----------------------------------------

def test_random_multi_rule_requests_match_the_composed_models():
    """Four enforcing rules (one per algorithm) and one shadow rule on every
    request: the request passes only if every enforcing rule allows it;
    only then is anything spent (a shadow rule that would deny spends
    nothing); the five integers are the binding rule's."""
    rng = random.Random(2024)
    eng = RuleEngine(clock=Clock(manual=True), shards=8, seed=SEED)
    rules = {
        1: (tb(6, 3), TokenBucketModel(6, 3), False),
        2: (fw(4, 700), FixedWindowModel(4, 700), False),
        3: (sw(5, 900), SlidingWindowModel(5, 900), False),
        4: (gcra(3, 2, 1000), GcraModel(3, 2, 1000), False),
        5: (tb(2, 1, shadow=True), TokenBucketModel(2, 1), True),
    }
    for num, (spec, _, _) in rules.items():
        eng.define(num, spec)
    nums = list(rules)
    now = 0
    for step in range(2500):
        now = max(0, now + random_step(rng, 400))
        key = rng.choice(KEYS[:3])
        cost = rng.choice([0, 1, 1, 1, 2, 3, 7])
        dry = {n: m.check(key, cost, now, commit=False) for n, (_, m, _) in rules.items()}
        passed = all(dry[n][0] for n, (_, _, shadow) in rules.items() if not shadow)
        results = dict(dry)
        if passed:
            for n, (_, m, shadow) in rules.items():
                if not (shadow and not dry[n][0]):
                    results[n] = m.check(key, cost, now, commit=True)
        enforcing = [n for n in nums if not rules[n][2]]
        if passed:
            binding = min(enforcing, key=lambda n: (results[n][2], nums.index(n)))
        else:
            denying = [n for n in enforcing if not results[n][0]]
            binding = max(denying, key=lambda n: (results[n][3] == -1, results[n][3],
                                                  -nums.index(n)))
        expected_five = (int(passed),) + results[binding][1:]
        expected_detail = [(n, rules[n][2], results[n][0]) + results[n][2:] for n in nums]
        five, detail = eng.apply(nums, key, cost=cost, now_ms=now, detail=True)
        assert (five, detail) == (expected_five, expected_detail), (step, key, cost, now)


# ---- fixed window ---------------------------------------------------------------------

def test_fixed_window_counts_per_window_aligned_to_clock_zero(engine):
    engine.define(1, fw(3, 1000))
    assert engine.apply([1], b"c", now_ms=1500) == (1, 3, 2, 0, 500)   # window [1000, 2000)
    assert engine.apply([1], b"c", now_ms=1600) == (1, 3, 1, 0, 400)
    assert engine.apply([1], b"c", cost=0, now_ms=1600) == (1, 3, 1, 0, 400)
    assert engine.apply([1], b"c", now_ms=1700) == (1, 3, 0, 0, 300)
    assert engine.apply([1], b"c", now_ms=1700) == (0, 3, 0, 300, 300)
    assert engine.apply([1], b"c", now_ms=1999) == (0, 3, 0, 1, 1)
    assert engine.apply([1], b"c", now_ms=2000) == (1, 3, 2, 0, 1000)  # a new window
    assert engine.apply([1], b"c", cost=4, now_ms=2000) == (0, 3, 2, -1, 1000)
    assert engine.apply([1], b"c", cost=3, now_ms=2000) == (0, 3, 2, 1000, 1000)
    assert engine.apply([1], b"c", cost=2, now_ms=2000) == (1, 3, 0, 0, 1000)
    assert engine.apply([1], b"c", cost=0, now_ms=5000) == (1, 3, 3, 0, 0)


def test_fixed_window_allows_twice_the_limit_across_a_boundary(engine):
    engine.define(1, fw(10, 1000))
    first = [engine.apply([1], b"c", now_ms=990) for _ in range(10)]
    assert all(r[0] for r in first)
    assert engine.apply([1], b"c", now_ms=990) == (0, 10, 0, 10, 10)
    second = [engine.apply([1], b"c", now_ms=1000) for _ in range(10)]
    assert all(r[0] for r in second)              # 20 requests within 11 ms: the algorithm
    assert second[-1] == (1, 10, 0, 0, 1000)
    assert engine.stats(1) == {"allowed": 20, "denied": 1, "shadow_denied": 0}


def test_fixed_window_clock_going_back_stays_in_the_later_window(engine):
    engine.define(1, fw(2, 1000))
    engine.apply([1], b"c", now_ms=5100)
    engine.apply([1], b"c", now_ms=5200)
    # back into an earlier window: not a fresh count
    assert engine.apply([1], b"c", now_ms=4500) == (0, 2, 0, 1500, 1500)
    assert engine.apply([1], b"c", now_ms=6000)[:3] == (1, 2, 1)


# ---- sliding window counter --------------------------------------------------------------

def test_sliding_window_does_not_allow_the_boundary_burst(engine):
    engine.define(1, sw(10, 1000))
    model = SlidingWindowModel(10, 1000)
    for _ in range(10):
        assert engine.apply([1], b"c", now_ms=990) == model.check(b"c", 1, 990)
    second = [engine.apply([1], b"c", now_ms=1000) for _ in range(10)]
    assert second == [model.check(b"c", 1, 1000) for _ in range(10)]
    assert sum(r[0] for r in second) == 0         # the fixed window let all 10 through
    assert second[0] == (0, 10, 0, 100, 1000)     # 10 * (1 - 100/1000) + 1 <= 10
    # a batch of 10 at 1100: only one fits; at 1500 five more
    third = [engine.apply([1], b"c", now_ms=1100) for _ in range(10)]
    assert [r[0] for r in third] == [1] + [0] * 9
    fourth = [engine.apply([1], b"c", now_ms=1500) for _ in range(10)]
    assert sum(r[0] for r in fourth) == 4         # 10 * 0.5 + 1 + 4 = 10
    assert fourth[-1] == model_replay(sw(10, 1000), [(990, 1)] * 10 + [(1000, 1)] * 10 +
                                      [(1100, 1)] * 10 + [(1500, 1)] * 10)


def model_replay(spec, calls):
    model = SlidingWindowModel(spec["limit"], spec["window_ms"])
    for now, cost in calls:
        last = model.check(b"c", cost, now)
    return last


@pytest.mark.parametrize("limit,window,calls", [
    (10, 1000, [(990, 10), (1000, 1)]),
    (10, 1000, [(500, 7), (1200, 3), (1200, 2)]),
    (10, 1000, [(500, 7), (1200, 4), (1250, 1)]),
    (3, 7, [(6, 3), (7, 1), (8, 1), (13, 2)]),
    (5, 1000, [(0, 5), (1000, 5), (1001, 1)]),          # only the window after next
    (5, 1000, [(0, 2), (1000, 5), (1999, 1)]),
    (7, 333, [(100, 6), (340, 3), (400, 1), (665, 1), (700, 7)]),
    (10, 1000, [(2500, 4), (3000, 6), (3000, 1), (1000, 1)]),   # clock went back
])
def test_sliding_window_retry_after_matches_the_rational_model(engine, limit, window, calls):
    engine.define(1, sw(limit, window))
    model = SlidingWindowModel(limit, window)
    for now, cost in calls:
        got = engine.apply([1], b"c", cost=cost, now_ms=now)
        assert got == model.check(b"c", cost, now), (now, cost)
        if not got[0] and got[3] > 0:
            # nothing earlier would pass, and at retry_after it passes
            later = now + got[3]
            assert model.estimate(b"c", later) + cost <= limit
            assert model.estimate(b"c", later - 1) + cost > limit


# ---- token bucket and GCRA specifics -----------------------------------------------------

def test_token_bucket_worked_example_of_the_brief(engine):
    engine.define(3, tb(5, 2))
    got = [engine.apply([3], b"k", now_ms=t)[0]
           for t in (0, 0, 0, 0, 0, 0, 500, 500, 1500, 1500, 1500)]
    assert got == [1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0]


def test_token_bucket_slow_rate_with_a_period(engine):
    engine.define(3, tb(1000, 1000, 3600000))           # 1,000 per hour
    assert engine.apply([3], b"k", cost=1000, now_ms=0) == (1, 1000, 0, 0, 3600000)
    assert engine.apply([3], b"k", now_ms=0) == (0, 1000, 0, 3600, 3600000)
    assert engine.apply([3], b"k", now_ms=3600) == (1, 1000, 0, 0, 3600000)


def test_gcra_rule_follows_redis_cell(engine):
    engine.define(4, gcra(4, 1, 1000))
    assert engine.apply([4], b"k", cost=6, now_ms=0) == (0, 5, 5, -1, 0)
    assert [engine.apply([4], b"k", now_ms=0)[2] for _ in range(5)] == [4, 3, 2, 1, 0]
    assert engine.apply([4], b"k", now_ms=0) == (0, 5, 0, 1000, 5000)
    assert engine.apply([4], b"k", now_ms=3000) == (1, 5, 2, 0, 3000)
    assert engine.apply([4], b"k", now_ms=3100) == (1, 5, 1, 0, 3900)


# ---- all or nothing -----------------------------------------------------------------------

ALGORITHM_SPECS = {
    "token_bucket": tb(10, 1),
    "fixed_window": fw(10, 60000),
    "sliding_window": sw(10, 60000),
    "gcra": gcra(9, 1, 1000),
}


@pytest.mark.parametrize("algorithm", list(ALGORITHM_SPECS))
def test_a_denial_by_one_rule_spends_nothing_from_the_others(engine, algorithm):
    engine.define(1, ALGORITHM_SPECS[algorithm])
    engine.define(2, fw(2, 60000))                       # the strict one
    engine.define(3, tb(100, 1))
    assert engine.apply([1, 2, 3], b"c", cost=3, now_ms=10)[0] == 0   # 3 > 2 remaining
    engine.apply([1, 2, 3], b"c", cost=2, now_ms=10)
    before = [peek(engine, n, now=20) for n in (1, 3)]
    five, detail = engine.apply([1, 2, 3], b"c", cost=1, now_ms=20, detail=True)
    assert five[0] == 0 and five[1] == 2
    assert [d[2] for d in detail] == [1, 0, 1]
    assert [d[3] for d in detail] == [before[0][2], 0, before[1][2]]
    assert [peek(engine, n, now=20) for n in (1, 3)] == before
    for cost in (1, 5, 8):                                # many denials later: still untouched
        engine.apply([3, 2, 1], b"c", cost=cost, now_ms=20)
    assert [peek(engine, n, now=20) for n in (1, 3)] == before
    assert peek(engine, 1, now=20)[2] == 8
    assert engine.stats(1)["denied"] == 0
    assert engine.stats(2) == {"allowed": 1, "denied": 5, "shadow_denied": 0}


def test_cost_zero_reports_without_consuming(engine):
    for num, spec in enumerate(ALGORITHM_SPECS.values()):
        engine.define(num, spec)
    nums = list(range(len(ALGORITHM_SPECS)))
    engine.apply(nums, b"c", cost=4, now_ms=100)
    first = engine.apply(nums, b"c", cost=0, now_ms=100, detail=True)
    for _ in range(50):
        assert engine.apply(nums, b"c", cost=0, now_ms=100, detail=True) == first
    assert [d[3] for d in first[1]] == [6, 6, 6, 6]


def test_binding_rule_when_denied_is_the_longest_retry(engine):
    engine.define(1, tb(1, 1, 500))         # retry 500
    engine.define(2, tb(1, 1, 2000))        # retry 2000
    engine.define(3, tb(100, 1))            # allows
    engine.define(4, tb(3, 1))              # cost 4 > capacity: never (-1)
    assert engine.apply([1, 2, 3], b"c", now_ms=0)[0] == 1
    assert engine.apply([1, 2, 3], b"c", now_ms=0) == (0, 1, 0, 2000, 2000)
    assert engine.apply([2, 1, 3], b"c", now_ms=0) == (0, 1, 0, 2000, 2000)
    # binding limit describes rule 2 whichever the order
    five, detail = engine.apply([3, 1, 2], b"c", now_ms=0, detail=True)
    assert five == (0, 1, 0, 2000, 2000)
    assert [d[:3] for d in detail] == [(3, False, 1), (1, False, 0), (2, False, 0)]
    engine.define(5, tb(2, 1))
    assert engine.apply([5, 1, 2], b"c", cost=2, now_ms=0)[:4] == (0, 1, 0, -1)
    engine.define(7, tb(10, 1, 60000))
    engine.apply([7], b"c", cost=10, now_ms=0)
    assert engine.apply([7], b"c", cost=4, now_ms=0) == (0, 10, 0, 240000, 600000)
    assert engine.apply([7, 4], b"c", cost=4, now_ms=0) == (0, 3, 3, -1, 0)
    assert engine.apply([4, 7], b"c", cost=4, now_ms=0) == (0, 3, 3, -1, 0)


def test_binding_rule_when_allowed_is_the_fewest_remaining(engine):
    engine.define(1, tb(10, 1))
    engine.define(2, tb(5, 1))
    engine.define(3, tb(1, 1, shadow=True))   # fewer, but shadow never binds
    engine.define(4, fw(8, 1000))
    assert engine.apply([1, 2, 3, 4], b"c", now_ms=0) == (1, 5, 4, 0, 1000)
    assert engine.apply([1, 2, 3, 4], b"c", cost=3, now_ms=0) == (1, 5, 1, 0, 4000)
    assert engine.apply([4, 1], b"c", cost=3, now_ms=0) == (1, 8, 1, 0, 1000)


def test_no_matching_rule(engine):
    assert engine.limit(b"c", b"GET /") == NO_RULE
    engine.set_matcher(Matcher())
    assert engine.limit(b"c", b"GET /", b"free", cost=10 ** 9) == NO_RULE
    assert engine.limit(b"c", b"GET /", detail=True) == (NO_RULE, [])
    assert engine.apply([], b"c") == NO_RULE
    engine.define(1, tb(1, 1, shadow=True))   # only a shadow rule: nothing limits
    engine.set_matcher(Matcher({(b"GET /", None): [(1, None)]}))
    assert engine.limit(b"c", b"GET /", now_ms=0) == NO_RULE
    assert engine.limit(b"c", b"GET /", now_ms=0) == NO_RULE
    assert engine.stats(1) == {"allowed": 1, "denied": 0, "shadow_denied": 1}


def test_shadow_rules_never_deny_but_count_and_sample(engine):
    engine.define(1, tb(2, 1, shadow=True))
    engine.define(2, tb(10, 1))
    engine.set_matcher(Matcher({(b"GET /", None): [(1, None), (2, None)]}))
    results = [engine.limit(b"u1", b"GET /", now_ms=t, detail=True) for t in (5, 6, 7, 8)]
    assert [r[0][0] for r in results] == [1, 1, 1, 1]
    assert [r[0][2] for r in results] == [9, 8, 7, 6]               # rule 2 binds
    assert [r[1][0][1:3] for r in results] == [(True, 1), (True, 1), (True, 0), (True, 0)]
    assert engine.stats(1)["shadow_denied"] == 2
    assert engine.stats(1)["denied"] == 0
    assert engine.stats(2) == {"allowed": 4, "denied": 0, "shadow_denied": 0}
    assert engine.denials() == [(7, 1, b"u1", 1), (8, 1, b"u1", 1)]
    # a shadow rule that would deny spends nothing: at 1000 ms one token came back
    assert results[-1][1][0][3] == 0
    assert engine.limit(b"u1", b"GET /", cost=0, now_ms=1008, detail=True)[1][0][3] == 1


def test_denials_sample_is_bounded_and_recent(engine):
    engine.define(1, fw(1, 10 ** 6))
    for t in range(300):
        engine.apply([1], b"k%d" % (t % 3), cost=2, now_ms=t)
    sample = engine.denials()
    assert 0 < len(sample) <= 128
    assert sample[-1] == (299, 1, b"k2", 2)
    assert [d[0] for d in sample] == sorted(d[0] for d in sample)


def test_scope_client_and_resource_separates_buckets(engine):
    engine.define(1, tb(1, 1, scope="client+resource"))
    engine.define(2, tb(1, 1))
    assert engine.apply([1], b"c", resource=b"GET /a", now_ms=0)[0] == 1
    assert engine.apply([1], b"c", resource=b"GET /b", now_ms=0)[0] == 1
    assert engine.apply([1], b"c", resource=b"GET /a", now_ms=0)[0] == 0
    assert engine.apply([1], b"d", resource=b"GET /a", now_ms=0)[0] == 1
    assert engine.apply([1], b"c", resource=b"", now_ms=0)[0] == 1
    # a client-scoped rule shares one bucket across resources
    assert engine.apply([2], b"c", resource=b"GET /a", now_ms=0)[0] == 1
    assert engine.apply([2], b"c", resource=b"GET /b", now_ms=0)[0] == 0
    engine.set_matcher(Matcher({(b"GET /a", None): [(1, None)], (b"GET /b", None): [(1, None)]}))
    assert engine.limit(b"e", b"GET /a", now_ms=0)[0] == 1
    assert engine.limit(b"e", b"GET /b", now_ms=0)[0] == 1
    assert engine.limit(b"e", b"GET /a", now_ms=0)[0] == 0


@pytest.mark.parametrize("algorithm", list(ALGORITHM_SPECS))
def test_buckets_of_different_rules_never_collide(engine, algorithm):
    """Rules sharing an algorithm share a table; clients that spell another
    rule's key prefix must still get buckets of their own."""
    nums = [0, 1, 2, 255, 256, 65536, MAX_RULE_NUMBER]
    spec = dict(ALGORITHM_SPECS[algorithm], scope="client+resource")
    for n in nums:
        engine.define(n, spec)
    clients = [b"", b"\x00", b"\x01\x00\x00\x00", b"\x00\x00\x00\x00x", b"x",
               b"\x00\x01\x00\x00", b"x\x00y", (1).to_bytes(4, "little") + b"x",
               (1).to_bytes(4, "big") + b"x"]
    for n in nums:                          # rule n spends n % 7 + 1 for every client
        for c in clients:
            assert engine.apply([n], c, cost=n % 7 + 1, resource=b"r", now_ms=0)[0] == 1
    for n in nums:
        for c in clients:
            assert peek(engine, n, c, b"r")[2] == 10 - (n % 7 + 1), (n, c)


def test_rule_numbers_stop_below_the_split_epoch_byte(engine):
    """A bucket key's u32 holds the rule number in 24 bits and a split's
    epoch in the high byte: a number past them is refused, not folded."""
    with pytest.raises(ValueError, match="past 16777215"):
        engine.define(MAX_RULE_NUMBER + 1, tb(3, 1))


def test_forget_makes_buckets_unreachable(engine):
    engine.define(1, tb(3, 1))
    engine.set_matcher(Matcher({(b"GET /", None): [(1, None)]}))
    for _ in range(3):
        engine.limit(b"c", b"GET /", now_ms=0)
    assert engine.limit(b"c", b"GET /", now_ms=0)[0] == 0
    engine.forget(1)
    # the cached matcher answer still names rule 1; a forgotten rule is skipped
    assert engine.limit(b"c", b"GET /", now_ms=0) == NO_RULE
    with pytest.raises(KeyError):
        engine.apply([1], b"c", now_ms=0)
    engine.define(2, tb(3, 1))              # the registry's next number: a full bucket
    assert engine.apply([2], b"c", now_ms=0) == (1, 3, 2, 0, 1000)
    engine.forget(2)
    assert len(engine) == 2                 # unreachable, reclaimed as they expire
    engine.sweep(now_ms=10_000, budget_ms=100.0)
    assert len(engine) == 0
    engine.forget(2)                        # twice is harmless
    engine.forget(10 ** 6)                  # unknown is harmless
    assert engine.stats(10 ** 6) == {"allowed": 0, "denied": 0, "shadow_denied": 0}


def test_redefining_a_token_bucket_keeps_its_state_capped(engine):
    engine.define(1, tb(10, 1))
    engine.apply([1], b"c", cost=8, now_ms=0)
    assert peek(engine, 1)[:3] == (1, 10, 2)
    engine.define(1, tb(20, 1))
    assert peek(engine, 1)[:3] == (1, 20, 2)
    engine.define(1, tb(1, 1))
    assert peek(engine, 1)[:3] == (1, 1, 1)
    assert engine.apply([1], b"c", now_ms=0)[:3] == (1, 1, 0)
    engine.define(1, tb(1, 1, shadow=True))              # the mode alone: same bucket
    assert peek(engine, 1) == NO_RULE                     # shadow: nothing binds
    assert engine.apply([1], b"c", cost=0, now_ms=0, detail=True)[1] == [
        (1, True, 1, 0, 0, 1000)]


@pytest.mark.parametrize("make", [fw, sw])
def test_redefining_a_window_rule_keeps_its_count_capped(engine, make):
    engine.define(1, make(10, 60000))
    engine.apply([1], b"c", cost=8, now_ms=0)
    assert peek(engine, 1)[:3] == (1, 10, 2)
    engine.define(1, make(20, 60000))
    assert peek(engine, 1)[:3] == (1, 20, 12)             # more room: the 8 stay counted
    engine.define(1, make(5, 60000))                      # less room: capped, none left
    got = engine.apply([1], b"c", cost=1, now_ms=0)
    assert got[0] == 0 and got[1] == 5
    assert got[2] == 0, f"remaining must not go negative after lowering the limit: {got}"
    assert got[3] > 0
    assert peek(engine, 1)[2] == 0


def test_redefining_gcra_burst_keeps_its_schedule(engine):
    engine.define(1, gcra(4, 1, 1000))
    for _ in range(5):
        engine.apply([1], b"c", now_ms=0)
    engine.define(1, gcra(9, 1, 1000))                    # 5 more of burst
    assert engine.apply([1], b"c", cost=0, now_ms=0) == (1, 10, 5, 0, 5000)
    engine.define(1, gcra(1, 1, 1000))                    # capped: nothing left
    assert engine.apply([1], b"c", now_ms=0)[:3] == (0, 2, 0)


@pytest.mark.parametrize("count,period_ms", [(2, 2000), (1000, 1000000), (3, 3000)])
def test_redefining_gcra_with_the_same_rate_keeps_its_schedule(engine, count, period_ms):
    """count/period in another spelling (1 per second as 2 per 2 s, or 1000
    per 1000 s) is the same rule: five spent at one per second stay spent."""
    engine.define(1, gcra(4, 1, 1000))
    for _ in range(5):
        engine.apply([1], b"c", now_ms=0)
    assert engine.apply([1], b"c", cost=0, now_ms=0) == (1, 5, 0, 0, 5000)
    engine.define(1, gcra(4, count, period_ms))
    assert engine.apply([1], b"c", cost=0, now_ms=0) == (1, 5, 0, 0, 5000)
    assert engine.apply([1], b"c", now_ms=0) == (0, 5, 0, 1000, 5000)
    assert engine.apply([1], b"c", now_ms=1000)[:3] == (1, 5, 0)


def test_redefining_gcra_from_a_fine_rate_to_a_coarse_one(engine):
    engine.define(1, gcra(4, 1000, 1000000))              # 1 per second
    for _ in range(5):
        engine.apply([1], b"c", now_ms=0)
    engine.define(1, gcra(4, 1, 1000))                    # 1 per second
    assert engine.apply([1], b"c", cost=0, now_ms=0) == (1, 5, 0, 0, 5000)
    assert engine.apply([1], b"c", now_ms=5000) == (1, 5, 4, 0, 1000)


def test_a_new_algorithm_for_a_rule_starts_afresh(engine):
    engine.define(1, tb(2, 1))
    engine.apply([1], b"c", cost=2, now_ms=0)
    engine.define(1, fw(3, 1000))
    assert engine.apply([1], b"c", now_ms=0)[:3] == (1, 3, 2)
    assert engine.stats(1) == {"allowed": 1, "denied": 0, "shadow_denied": 0}


def test_matcher_answers_are_cached_until_invalidate(engine):
    engine.define(1, tb(5, 1))
    engine.define(2, tb(2, 1))
    m = Matcher({(b"GET /", None): [(1, None)], (b"GET /", b"free"): [(2, None)]})
    engine.set_matcher(m)
    for _ in range(3):
        assert engine.limit(b"c", b"GET /", now_ms=0)[1] == 5
        assert engine.limit(b"c", b"GET /", b"free", now_ms=0)[1] == 2
    assert m.calls == [(b"GET /", None), (b"GET /", b"free")]
    m.table[(b"GET /", None)] = [(2, None)]
    assert engine.limit(b"d", b"GET /", now_ms=0)[1] == 5          # still the cached answer
    engine.invalidate()
    assert engine.limit(b"d", b"GET /", now_ms=0)[1] == 2
    assert len(m.calls) == 3
    engine.set_matcher(Matcher())                                  # a new matcher: no cache
    assert engine.limit(b"d", b"GET /", now_ms=0) == NO_RULE
    # a rule defined after the answer was cached is not seen until invalidate
    m2 = Matcher({(b"GET /x", None): [(3, None)]})
    engine.set_matcher(m2)
    assert engine.limit(b"c", b"GET /x", now_ms=0) == NO_RULE      # 3 does not exist yet
    engine.define(3, tb(7, 1))
    engine.invalidate()
    assert engine.limit(b"c", b"GET /x", now_ms=0)[1] == 7


def test_matcher_receives_resource_and_tier(engine):
    m = Matcher()
    engine.set_matcher(m)
    engine.limit(b"c", b"POST /orders", now_ms=0)
    engine.limit(b"c", b"POST /orders", b"", now_ms=0)
    engine.limit(b"c", b"POST /orders", b"paid", now_ms=0)
    engine.limit(b"c", b"", b"paid", now_ms=0)
    assert m.calls == [(b"POST /orders", None), (b"POST /orders", b""),
                       (b"POST /orders", b"paid"), (b"", b"paid")]


def test_client_glob_filtering(engine):
    engine.define(1, tb(1, 1))
    engine.define(2, tb(5, 1))
    engine.set_matcher(Matcher({(b"GET /", None): [(1, b"ip:10.*"), (2, None)]}))
    assert engine.limit(b"ip:10.0.0.1", b"GET /", now_ms=0) == (1, 1, 0, 0, 1000)
    assert engine.limit(b"ip:10.0.0.1", b"GET /", now_ms=0)[:2] == (0, 1)
    assert engine.limit(b"ip:11.0.0.1", b"GET /", now_ms=0)[:3] == (1, 5, 4)
    assert engine.limit(b"IP:10.0.0.1", b"GET /", now_ms=0)[:3] == (1, 5, 4)   # case matters
    engine.set_matcher(Matcher({(b"GET /", None): [(1, b"user:[ab]?")]}))
    assert engine.limit(b"user:a1", b"GET /", now_ms=0)[1] == 1
    assert engine.limit(b"user:c1", b"GET /", now_ms=0) == NO_RULE


def test_apply_refuses_unknown_and_concurrency_rules(engine):
    engine.define(1, tb(1, 1))
    engine.define(2, conc(2, 1000))
    with pytest.raises(KeyError):
        engine.apply([1, 99], b"c")
    with pytest.raises(ValueError):
        engine.apply([1, 2], b"c")
    # a refused request spent nothing
    assert peek(engine, 1)[:3] == (1, 1, 1)


def test_apply_with_a_rule_named_twice_charges_it_once(engine):
    engine.define(1, tb(2, 1))
    try:
        got = engine.apply([1, 1], b"c", now_ms=0)
    except ValueError:
        return                                    # refusing duplicates is fine too
    assert got == (1, 2, 1, 0, 1000)
    assert peek(engine, 1)[:3] == (1, 2, 1), "one request charged twice"


def test_bad_arguments(engine, clock):
    engine.define(1, tb(1, 1))
    with pytest.raises(ValueError):
        engine.apply([1], b"c", cost=-1)
    with pytest.raises(ValueError):
        engine.limit(b"c", b"r", cost=-1)
    with pytest.raises(ValueError):
        engine.apply([1], b"c", now_ms=-1)
    with pytest.raises(ValueError):
        engine.apply([1], b"c", now_ms=4 * 10 ** 12 + 1)
    with pytest.raises(ValueError):
        engine.apply([1], b"c" * 70000)
    assert engine.apply([1], b"c", cost=10 ** 18, now_ms=0) == (0, 1, 1, -1, 0)
    for bad in ({"algorithm": "leaky"}, tb(0, 1), tb(1, 0), fw(0, 1), fw(1, 0), sw(1, 0),
                gcra(-1, 1, 1), gcra(1, 0, 1), gcra(1, 1, 0), conc(0, 1), conc(1025, 1),
                conc(1, 0), tb(1, 1, scope="resource"), fw(True, 1), fw(1.5, 1)):
        with pytest.raises(ValueError):
            engine.define(2, bad)
    with pytest.raises(KeyError):
        engine.apply([2], b"c")                   # nothing was defined
    engine.define(2, conc(1024, 1))               # the largest concurrency limit


def test_the_engine_uses_its_clock(engine, clock):
    engine.define(1, tb(1, 1))
    clock.set(5000)
    assert engine.apply([1], b"c") == (1, 1, 0, 0, 1000)
    assert engine.apply([1], b"c")[:4] == (0, 1, 0, 1000)
    clock.set(6000)
    assert engine.apply([1], b"c")[0] == 1


# ---- concurrency ------------------------------------------------------------------------------

def test_concurrency_acquire_up_to_the_limit(engine):
    engine.define(1, conc(3, 1000))
    leases = [engine.acquire(1, b"c", now_ms=t) for t in (0, 100, 200)]
    assert [l[:4] for l in leases] == [(1, 3, 2, 0), (1, 3, 1, 0), (1, 3, 0, 0)]
    ids = [l[4] for l in leases]
    assert len(set(ids)) == 3 and min(ids) >= 0
    # denied: retry when the soonest lease ends
    assert engine.acquire(1, b"c", now_ms=500) == (0, 3, 0, 500, -1)
    assert engine.acquire(1, b"c", now_ms=999) == (0, 3, 0, 1, -1)
    assert engine.acquire(1, b"other", now_ms=500)[:3] == (1, 3, 2)   # per client
    # releasing the middle lease frees one slot; the retry follows the soonest
    assert engine.release(1, b"c", ids[1], now_ms=600)
    again = engine.acquire(1, b"c", now_ms=600)
    assert again[:4] == (1, 3, 0, 0)
    assert engine.acquire(1, b"c", now_ms=600) == (0, 3, 0, 400, -1)
    assert engine.stats(1) == {"allowed": 5, "denied": 3, "shadow_denied": 0}
    assert engine.denials()[-1] == (600, 1, b"c", 1)


def test_concurrency_release_frees_exactly_once(engine):
    engine.define(1, conc(2, 1000))
    a = engine.acquire(1, b"c", now_ms=0)[4]
    b = engine.acquire(1, b"c", now_ms=0)[4]
    assert engine.release(1, b"c", a, now_ms=10) is True
    assert engine.release(1, b"c", a, now_ms=10) is False              # twice
    c = engine.acquire(1, b"c", now_ms=20)[4]                          # may reuse a's slot
    assert c != a
    assert engine.release(1, b"c", a, now_ms=30) is False              # still stale
    assert engine.acquire(1, b"c", now_ms=30)[0] == 0                  # b and c hold both
    for forged in (-1, 0, 1, 12345, c + 1, c ^ (1 << 16), 2 ** 62, b | 0xFFFF):
        assert engine.release(1, b"c", forged, now_ms=30) is False
    assert engine.release(1, b"other", b, now_ms=30) is False           # another client's
    assert engine.release(1, b"c", b, now_ms=30) is True
    assert engine.release(1, b"c", c, now_ms=30) is True
    assert engine.acquire(1, b"c", now_ms=30)[:3] == (1, 2, 1)


def test_concurrency_lease_expires_after_lease_ms(engine):
    engine.define(1, conc(1, 500))
    crashed = engine.acquire(1, b"c", now_ms=1000)[4]
    assert engine.acquire(1, b"c", now_ms=1499) == (0, 1, 0, 1, -1)
    took = engine.acquire(1, b"c", now_ms=1500)                       # the crashed lease ran out
    assert took[:4] == (1, 1, 0, 0)
    assert engine.release(1, b"c", crashed, now_ms=1500) is False
    assert engine.release(1, b"c", took[4], now_ms=2000) is False      # ran out too
    assert engine.acquire(1, b"c", now_ms=2000)[0] == 1


def test_concurrency_lease_ids_are_never_reused(engine):
    engine.define(1, conc(2, 100))
    engine.define(2, conc(2, 100))
    seen = []
    now = 0
    for cycle in range(40):
        ids = [engine.acquire(1, b"c", now_ms=now)[4], engine.acquire(2, b"c", now_ms=now)[4]]
        assert min(ids) >= 0
        seen.append(ids[0])
        if cycle % 3 == 0:
            assert engine.release(1, b"c", ids[0], now_ms=now + 1)
        now += 5000                                   # records expire ...
        if cycle % 2 == 0:
            engine.sweep(now_ms=now, budget_ms=50.0)  # ... and are dropped
            assert len(engine) == 0
    assert len(set(seen)) == len(seen)
    for old in seen:
        assert engine.release(1, b"c", old, now_ms=now) is False
    fresh = engine.acquire(1, b"c", now_ms=now)[4]
    for old in seen:
        assert engine.release(1, b"c", old, now_ms=now) is False
    assert engine.release(1, b"c", fresh, now_ms=now) is True


def test_concurrency_redefine_keeps_leases_for_the_same_limit(engine):
    engine.define(1, conc(2, 1000))
    a = engine.acquire(1, b"c", now_ms=0)[4]
    b = engine.acquire(1, b"c", now_ms=0)[4]
    engine.define(1, conc(2, 5000))                   # same limit, longer leases
    assert engine.acquire(1, b"c", now_ms=10) == (0, 2, 0, 990, -1)
    assert engine.release(1, b"c", a, now_ms=20) is True
    c = engine.acquire(1, b"c", now_ms=30)
    assert c[:4] == (1, 2, 0, 0) and c[4] not in (a, b)
    assert engine.acquire(1, b"c", now_ms=1000)[:4] == (1, 2, 0, 0)      # b ran out at 1000
    assert engine.acquire(1, b"c", now_ms=1000) == (0, 2, 0, 4030, -1)   # c ends at 5030
    # a new limit starts afresh: old leases are gone and their ids free nothing
    engine.define(1, conc(3, 1000))
    got = [engine.acquire(1, b"c", now_ms=1100) for _ in range(3)]
    assert [g[:3] for g in got] == [(1, 3, 2), (1, 3, 1), (1, 3, 0)]
    assert {g[4] for g in got}.isdisjoint({a, b, c[4]})
    assert engine.release(1, b"c", c[4], now_ms=1100) is False
    assert engine.acquire(1, b"c", now_ms=1100)[0] == 0


def test_concurrency_rules_are_skipped_by_limit_and_refused_by_apply(engine):
    engine.define(1, conc(1, 1000))
    engine.define(2, tb(5, 1))
    engine.set_matcher(Matcher({(b"GET /", None): [(1, None), (2, None)]}))
    for _ in range(3):
        assert engine.limit(b"c", b"GET /", now_ms=0, detail=True)[1][0][0] == 2
    engine.set_matcher(Matcher({(b"GET /", None): [(1, None)]}))
    assert engine.limit(b"c", b"GET /", now_ms=0) == NO_RULE
    with pytest.raises(ValueError):
        engine.apply([1], b"c")
    assert engine.acquire(1, b"c", now_ms=0)[0] == 1          # limit() took no lease
    with pytest.raises(ValueError):
        engine.acquire(2, b"c")
    with pytest.raises(ValueError):
        engine.release(2, b"c", 0)
    with pytest.raises(KeyError):
        engine.acquire(3, b"c")
    engine.forget(1)
    with pytest.raises(KeyError):
        engine.acquire(1, b"c")


def test_concurrency_scope_client_and_resource(engine):
    engine.define(1, conc(1, 1000, scope="client+resource"))
    a = engine.acquire(1, b"c", b"export", now_ms=0)
    assert a[0] == 1
    assert engine.acquire(1, b"c", b"import", now_ms=0)[0] == 1
    assert engine.acquire(1, b"c", b"export", now_ms=0)[0] == 0
    assert engine.release(1, b"c", a[4], b"import", now_ms=0) is False
    assert engine.release(1, b"c", a[4], b"export", now_ms=0) is True


def test_acquire_and_release_refuse_times_out_of_range(engine):
    """The same bounds as limit()/apply(): a negative time would read every
    free slot as busy."""
    engine.define(1, conc(2, 1000))
    with pytest.raises(ValueError):
        engine.acquire(1, b"c", now_ms=-5)
    with pytest.raises(ValueError):
        engine.acquire(1, b"c", now_ms=4 * 10 ** 12 + 1)
    with pytest.raises(ValueError):
        engine.release(1, b"c", 0, now_ms=-5)


# ---- sweep, len, memory -------------------------------------------------------------------------

SWEEP_CASES = {
    # each spends 3 at time 0; every bucket has expired at 3000 ms (the
    # record's expiry is kept in whole seconds, rounded up)
    "token_bucket": tb(10, 1),
    "fixed_window": fw(10, 3000),
    "sliding_window": sw(10, 1500),
    "gcra": gcra(9, 1, 1000),
    "concurrency": conc(4, 3000),
}
EXPIRED_AT = 3000


@pytest.mark.parametrize("algorithm", list(SWEEP_CASES))
def test_sweep_drops_expired_buckets(algorithm):
    spec, expired_at = SWEEP_CASES[algorithm], EXPIRED_AT
    eng = RuleEngine(clock=Clock(manual=True), shards=4, seed=SEED)
    eng.define(1, spec)
    empty = eng.memory_bytes
    n = 3000

    def use(key, now):
        if algorithm == "concurrency":
            return eng.acquire(1, key, now_ms=now)[0]
        return eng.apply([1], key, cost=3, now_ms=now)[0]

    for i in range(n):
        assert use(b"key:%d" % i, 0)
    assert len(eng) == n
    full = eng.memory_bytes
    assert full > empty
    removed, _ = eng.sweep(now_ms=expired_at - 1000, budget_ms=1000.0)
    assert removed == 0 and len(eng) == n           # nothing expired yet
    if algorithm == "concurrency":
        assert eng.acquire(1, b"key:7", now_ms=0)[2] == 2
    else:
        assert eng.apply([1], b"key:7", cost=0, now_ms=0)[2] == 7
    removed, _ = eng.sweep(now_ms=expired_at + 1000, budget_ms=1000.0)
    assert removed == n and len(eng) == 0
    assert eng.memory_bytes < full
    assert use(b"key:1", expired_at + 1000)           # a dropped bucket is a new, full one
    assert len(eng) == 1


def test_sweep_covers_every_table_and_clear_empties_them(engine):
    for num, spec in enumerate(ALGORITHM_SPECS.values()):
        engine.define(num, spec)
    engine.define(9, conc(3, 100))
    for i in range(200):
        engine.apply([0, 1, 2, 3], b"u%d" % i, now_ms=0)
        engine.acquire(9, b"u%d" % i, now_ms=0)
        engine.throttle(b"t%d" % i, 4, 1, 1, now_ms=0)
    assert len(engine) == 200 * 6
    full = engine.memory_bytes
    engine.sweep(now_ms=10 ** 7, budget_ms=1000.0)
    assert len(engine) == 0
    assert engine.memory_bytes < full
    for i in range(50):
        engine.apply([0, 1, 2, 3], b"u%d" % i, now_ms=10 ** 7)
        engine.acquire(9, b"u%d" % i, now_ms=10 ** 7)
    assert len(engine) == 250
    engine.clear()
    assert len(engine) == 0
    assert engine.apply([0], b"u1", now_ms=10 ** 7)[2] == 9


def test_sweep_mid_sequence_changes_no_answer():
    """Long random sequences with sweeps in between give the model's answers
    (run_sequence sweeps now and then); at the end a sweep far in the future
    leaves nothing."""
    for algorithm in ("token_bucket", "fixed_window", "sliding_window", "gcra"):
        eng = run_sequence(algorithm, 99, 400)
        eng.sweep(now_ms=4 * 10 ** 12, budget_ms=1000.0)
        assert len(eng) == 0
