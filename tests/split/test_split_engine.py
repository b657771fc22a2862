"""Split keys in fastlimit._rules.RuleEngine on its own, with the manual
clock: a split rule's k sub-buckets (fl_split.h's naming), their shares
adding up to the whole, the accuracy of a random choice with one retry
against the bound the README states, "denied only when the two tried
are empty", a live change of k keeping what was spent, and the refusals
of what cannot be split."""

from __future__ import annotations

import math
import statistics

import pytest

from fastlimit._core import Clock
from fastlimit._rules import MAX_SPLIT, RuleEngine

SEED = bytes(range(16))


@pytest.fixture
def engine():
    return RuleEngine(clock=Clock(manual=True), shards=16, seed=SEED)


def fw(limit, window_ms=1000, **extra):
    return {"algorithm": "fixed_window", "limit": limit, "window_ms": window_ms, **extra}


def tb(capacity, refill, period_ms=1000, **extra):
    return {"algorithm": "token_bucket", "capacity": capacity, "refill": refill,
            "period_ms": period_ms, **extra}


def sub_remaining(engine, num, key: bytes, k: int, now_ms: int) -> list[int]:
    """Each sub-bucket's own remaining (a peek shows k times it, capped)."""
    return [engine.apply([num], b"%s#%d" % (key, i), cost=0, now_ms=now_ms)[2] // k
            for i in range(k)]


def admitted(engine, num, key: bytes, demand: int, now_ms: int) -> int:
    return sum(engine.apply([num], key, cost=1, now_ms=now_ms)[0] for _ in range(demand))


def test_a_sub_key_names_its_sub_bucket(engine):
    engine.define(1, fw(40, split=4))
    assert engine.apply([1], b"user:42#3", cost=5, now_ms=0)[:3] == (1, 40, 20)
    assert sub_remaining(engine, 1, b"user:42", 4, 0) == [10, 10, 10, 5]
    # a hash tag: the suffix goes at the end of the hashed part
    engine.apply([1], b"a{acme#1}b", cost=10, now_ms=0)
    assert engine.apply([1], b"a{acme#1}b", cost=0, now_ms=0)[2] == 0
    assert engine.apply([1], b"a{acme#0}b", cost=0, now_ms=0)[2] == 40
    # an empty sub-key's check goes to one other sub-bucket (two choices)
    assert engine.apply([1], b"a{acme#1}b", cost=1, now_ms=0)[:3] == (1, 40, 36)
    # an index past k (a client still on a larger split) is one of the
    # base key's sub-buckets, never a bucket of its own
    assert all(engine.apply([1], b"user:42#7", cost=1, now_ms=0)[0] for _ in range(10))
    assert sum(sub_remaining(engine, 1, b"user:42", 4, 0)) == 35 - 10


@pytest.mark.parametrize("spec, total", [
    (fw(10, split=4), 10), (tb(10, 10, split=4), 10),
    ({"algorithm": "sliding_window", "limit": 10, "window_ms": 1000, "split": 3}, 10),
    ({"algorithm": "gcra", "burst": 9, "count": 10, "period_ms": 1000, "split": 4}, 10)])
def test_the_shares_add_up_to_the_limit(engine, spec, total):
    """Whatever the choices (a client naming sub-keys itself included),
    the whole key admits at most the unsplit limit at once."""
    engine.define(1, spec)
    k = spec["split"]
    allowed = sum(engine.apply([1], b"k#%d" % (i % k), cost=1, now_ms=0)[0]
                  for i in range(3 * total))
    allowed += admitted(engine, 1, b"k", 3 * total, 0)
    assert allowed == total


def test_a_denied_sub_bucket_tries_one_other(engine):
    """Two choices: with cost 1 a check is denied only when the sub-bucket
    it drew and the one it tried next are both empty, so at every denial
    at least two sub-buckets are empty."""
    k = 8
    engine.define(1, fw(8 * 20, split=k))
    denials = 0
    for _ in range(8 * 20 + 200):
        if not engine.apply([1], b"hot", cost=1, now_ms=0)[0]:
            denials += 1
            assert sum(r == 0 for r in sub_remaining(engine, 1, b"hot", k, 0)) >= 2
    assert denials >= 200


def test_random_choice_with_one_retry_admits_what_the_bound_says(engine):
    """Demand equal to the limit, window after window: never above it
    (the shares add up to L) and, on average, at least the no-retry
    figure of balls into bins, 1 - 0.4 * sqrt((k - 1) / L), which one
    retry beats (README "Split keys"; the note's table gives 0.978 for
    L = 1000, k = 16)."""
    limit, k, windows = 1000, 16, 40
    engine.define(1, fw(limit, split=k))
    ratios = []
    for w in range(windows):
        got = admitted(engine, 1, b"tenant", limit, now_ms=w * 1000)
        assert got <= limit
        ratios.append(got / limit)
    assert statistics.mean(ratios) >= 1 - 0.4 * math.sqrt((k - 1) / limit)


@pytest.mark.parametrize("spec", [fw(1000), tb(1000, 1)])
def test_changing_k_keeps_what_was_spent(engine, spec):
    """4 -> 8 -> 4 -> unsplit in one window: each new split's sub-buckets
    start as full as the old ones were, so the whole key never admits
    more than the limit and never gets its spent tokens back."""
    engine.define(1, {**spec, "split": 4})
    assert admitted(engine, 1, b"t", 600, now_ms=0) == 600
    steps = [(8, 1, [[0, 4]]), (4, 2, [[1, 8], [0, 4]]), (1, 3, [[2, 4], [1, 8], [0, 4]])]
    spent = 600
    for k, epoch, history in steps:
        engine.define(1, {**spec, "split": k, "split_epoch": epoch,
                          "split_history": history})
        got = admitted(engine, 1, b"t", 100, now_ms=0)
        assert got >= 90           # what was left is there, not reset to empty
        spent += got
    assert spent + admitted(engine, 1, b"t", 2000, now_ms=0) <= 1000


def test_a_first_split_takes_over_the_unsplit_bucket(engine):
    engine.define(1, fw(100))
    admitted(engine, 1, b"t", 80, now_ms=0)
    engine.define(1, fw(100, split=4, split_epoch=1, split_history=[[0, 1]]))
    assert admitted(engine, 1, b"t", 100, now_ms=0) <= 20


@pytest.mark.parametrize("spec, message", [
    ({"algorithm": "concurrency", "limit": 4, "lease_ms": 1000, "split": 2},
     "concurrency rule cannot be split"),
    (fw(3, split=4), "more sub-buckets than the limit"),
    (tb(100, 1, period_ms=2**31, split=4), "period_ms \\* split"),
    (fw(100, split=MAX_SPLIT + 1), "split"),
    (fw(100, split=2, split_history=[[0, 1]] * 4), "split_history"),
])
def test_what_cannot_be_split_is_refused(engine, spec, message):
    with pytest.raises(ValueError, match=message):
        engine.define(1, spec)
