"""_core.pyx's MemoryBound in-process: its count of the tables' bytes
stays exact through every way a table grows or shrinks, no flood takes
the tables past it, the default policy keeps the buckets that limit
someone (token buckets, windows, GCRA), noeviction refuses, and a table
without a bound is left alone."""

from __future__ import annotations

import pytest

from fastlimit._core import BucketStore, Clock, MemoryBound, OutOfMemory
from fastlimit._rules import RuleEngine

T0 = 1_000_000
KB = 1024


def conc(limit, lease_ms):
    return {"algorithm": "concurrency", "limit": limit, "lease_ms": lease_ms}


@pytest.fixture
def clock():
    return Clock(manual=True, start_ms=T0)


def bounded(clock, limit, policy="nearest-full", samples=5, shards=64):
    store = BucketStore(shards=shards, clock=clock)
    engine = RuleEngine(clock=clock, shards=shards)
    bound = MemoryBound()
    bound.configure(limit, policy, samples)
    store.set_bound(bound)
    engine.set_bound(bound)
    return store, engine, bound


def exact(store, engine, bound) -> bool:
    return bound.used == store.memory_bytes + engine.memory_bytes


def test_the_count_follows_every_change_of_the_tables(clock):
    store, engine, bound = bounded(clock, 1 << 30)
    assert exact(store, engine, bound)
    for i in range(20_000):
        store.check(b"k:%d" % i, 10, 1)
    engine.define(1, {"algorithm": "gcra", "burst": 5, "count": 10, "period_ms": 1000})
    for i in range(5000):
        engine.apply([1], b"c:%d" % i)
    assert exact(store, engine, bound)
    engine.define(2, conc(3, 1000))      # a table made after the bound: counted too
    for i in range(2000):
        engine.acquire(2, b"l:%d" % i)
    assert exact(store, engine, bound)
    clock.advance(60_000)                # all full again: the sweep shrinks and compacts
    store.sweep(budget_ms=1000.0)
    engine.sweep(budget_ms=1000.0)
    assert len(store) == 0 and exact(store, engine, bound)
    engine.forget(2)                     # its table goes, and its bytes with it
    assert exact(store, engine, bound)
    store.clear()
    assert exact(store, engine, bound)
    store.set_bound(None)
    engine.set_bound(None)
    assert bound.used == 0


@pytest.mark.volume
@pytest.mark.parametrize("policy", ["nearest-full", "allkeys-random"])
def test_a_flood_never_takes_the_tables_past_the_bound(clock, policy):
    store, engine, bound = bounded(clock, 512 * KB, policy)
    for i in range(100_000):
        store.check(b"flood:%d" % i, 10, 1)
        if i % 10_000 == 0:
            assert bound.used <= 512 * KB
    assert exact(store, engine, bound) and bound.used <= 512 * KB
    assert bound.evicted == 100_000 - len(store)
    assert len(store) > 0.8 * 512 * KB / 52      # about 47 bytes a bucket: little left unused


@pytest.mark.volume
def test_the_default_policy_keeps_exhausted_buckets_of_every_kind(clock):
    store, engine, bound = bounded(clock, 1024 * KB)
    engine.define(1, {"algorithm": "fixed_window", "limit": 3, "window_ms": 60_000})
    engine.define(2, {"algorithm": "gcra", "burst": 2, "count": 3, "period_ms": 60_000})
    real = [b"real:%d" % i for i in range(50)]
    for k in real:
        store.check(k, 10, 1, cost=10)
        for _ in range(3):
            engine.apply([1], k)
            engine.apply([2], k)
    for i in range(100_000):             # new keys of every kind, one unit spent each
        store.check(b"flood:%d" % i, 10, 1)
        engine.apply([1 + i % 2], b"flood:%d" % i)
    assert bound.evicted > 100_000 and bound.used <= 1024 * KB
    assert all(store.check(k, 10, 1)[0] == 0 for k in real)
    assert all(engine.apply([1], k)[0] == 0 for k in real)
    assert all(engine.apply([2], k)[0] == 0 for k in real)


# The limits of a flood of new keys (one unit spent each), against victims
# exhausted under 5 a minute: a slower refill than theirs (a daily quota,
# each key full again only after 86 s, later than the victims), a faster
# one, and theirs.  By kind: a CL.CHECK bucket's (capacity, refill,
# period_ms), or a rule's numbers for each algorithm.
FLOODS = {"slower": (1000, 1000, 86_400_000), "faster": (10, 10, 1000),
          "equal": (5, 5, 60_000)}
VICTIM = FLOODS["equal"]
# Eviction samples five records of one shard: in shards of a few dozen a
# victim could be drawn five times by chance (Redis's sampling too), so
# the bound's shards hold hundreds here, as real ones hold thousands.
SHARDS = 16


def rule(algorithm, limit, per, period_ms):
    """A rule of `limit` per `period_ms` (a token bucket refilling `per`)."""
    return {"token_bucket": {"algorithm": "token_bucket", "capacity": limit, "refill": per,
                             "period_ms": period_ms},
            "gcra": {"algorithm": "gcra", "burst": limit - 1, "count": limit,
                     "period_ms": period_ms},
            "fixed_window": {"algorithm": "fixed_window", "limit": limit,
                             "window_ms": period_ms},
            "sliding_window": {"algorithm": "sliding_window", "limit": limit,
                               "window_ms": period_ms}}[algorithm]


def flood_keys(clock, check, n=20_000):
    """n new keys through check(key), the clock moving 2 s in all: the
    victims (one token back every 12 s) stay exhausted."""
    for i in range(n):
        check(b"flood:%d" % i)
        if i % 1000 == 999:
            clock.advance(100)


@pytest.mark.parametrize("flood", FLOODS)
def test_exhausted_buckets_outlast_a_flood_of_any_refill(clock, flood):
    # Regression (finding 5): nearest-full ranked buckets by their absolute
    # time to full, so a daily quota's new keys outranked exhausted
    # per-minute ones and every one of those was reset.
    store, engine, bound = bounded(clock, 512 * KB, shards=SHARDS)
    capacity, refill, period = VICTIM
    victims = [b"login:%d" % i for i in range(50)]
    for k in victims:
        store.check(k, capacity, refill, cost=capacity, period_ms=period)
    fc, fr, fp = FLOODS[flood]
    flood_keys(clock, lambda k: store.check(k, fc, fr, period_ms=fp))
    assert bound.evicted > 5_000 and bound.used <= 512 * KB
    assert [k for k in victims
            if store.check(k, capacity, refill, cost=0, period_ms=period)[2] != 0] == []


@pytest.mark.parametrize("flood", FLOODS)
@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "fixed_window", "sliding_window"])
def test_exhausted_rule_buckets_outlast_a_flood_of_any_refill(clock, algorithm, flood):
    # The same for CL.LIMIT's rules: each bucket ranked by its own rule.
    store, engine, bound = bounded(clock, 512 * KB, shards=SHARDS)
    engine.define(1, rule(algorithm, 5, 5, 60_000))
    engine.define(2, rule(algorithm, *FLOODS[flood]))
    victims = [b"login:%d" % i for i in range(50)]
    for k in victims:
        engine.apply([1], k, cost=5)
    flood_keys(clock, lambda k: engine.apply([2], k))
    assert bound.evicted > 5_000 and bound.used <= 512 * KB
    assert [k for k in victims if engine.apply([1], k, cost=0)[2] != 0] == []


def test_an_exhausted_bucket_goes_only_when_every_draw_finds_exhausted_ones(clock):
    # One shard of about 1,200 buckets, a third of them exhausted: five
    # samples all land on those in one eviction of 250, so the 4,000 the
    # flood makes once lost about 15 of them (a server's 256 shards under
    # 512kb hold some 35 buckets each: the same, once in 7,000 floods).
    # Now a draw of five exhausted ones draws again, up to four times.
    store, engine, bound = bounded(clock, 64 * KB, shards=1)
    victims = [b"login:%d" % i for i in range(400)]
    for k in victims:
        store.check(k, 5, 5, cost=5, period_ms=60_000)
    for i in range(5_000):
        store.check(b"flood:%d" % i, 10, 1)
    assert bound.evicted > 3_500 and bound.used <= 64 * KB
    assert [k for k in victims if store.check(k, 5, 5, cost=0, period_ms=60_000)[2] != 0] == []
    # When nothing but exhausted buckets is left, they are evicted all the same.
    for i in range(5_000):
        assert store.check(b"spender:%d" % i, 5, 5, cost=5, period_ms=60_000)[0] == 1
    assert bound.used <= 64 * KB
    assert sum(store.check(k, 5, 5, cost=0, period_ms=60_000)[2] != 0 for k in victims) > 300


def test_a_bucket_is_ranked_by_how_spent_it_is_not_by_when_it_is_full(clock):
    # Both buckets sampled: the one spent 1/1000 of a daily limit goes
    # before the one spent 4/5 of a per-minute one, though it is full
    # again later (86 s against 48 s).
    store, engine, bound = bounded(clock, 1 << 30, samples=64, shards=1)
    store.check(b"spent", 5, 5, cost=4, period_ms=60_000)
    store.check(b"fresh", 1000, 1000, period_ms=86_400_000)
    bound.configure(bound.used, "nearest-full", 64)      # no byte more
    store.check(b"third", 5, 5, period_ms=60_000)        # room for it: one eviction
    assert bound.evicted == 1 and len(store) == 2
    assert store.check(b"spent", 5, 5, cost=0, period_ms=60_000)[2] == 1


def test_noeviction_refuses_only_new_buckets(clock):
    store, engine, bound = bounded(clock, 1 << 30, "noeviction")
    store.check(b"old", 10, 1)
    bound.configure(1, "noeviction", 5)
    with pytest.raises(OutOfMemory, match="OOM command not allowed when used memory"):
        store.check(b"new", 10, 1)
    assert store.check(b"old", 10, 1)[:3] == (1, 10, 8)
    assert store.check(b"new", 10, 1, cost=0)[0] == 1      # a peek stores nothing
    assert bound.evicted == 0 and len(store) == 1
    assert bound.evict(clock.now(), 10.0) == 0        # nothing to evict under noeviction


@pytest.mark.volume
def test_a_lowered_bound_is_reached_by_evict(clock):
    store, engine, bound = bounded(clock, 1 << 30)
    for i in range(50_000):
        store.check(b"k:%d" % i, 10, 1)
    bound.configure(256 * KB, "nearest-full", 5)
    while bound.used > 256 * KB:
        assert bound.evict(clock.now(), 50.0) > 0
    assert exact(store, engine, bound)


def test_bad_settings_are_refused(clock):
    bound = MemoryBound()
    with pytest.raises(ValueError, match="unknown maxmemory-policy"):
        bound.configure(1, "allkeys-lru", 5)
    with pytest.raises(ValueError, match="from 1 to 64"):
        bound.configure(1, "noeviction", 0)


def test_a_table_without_a_bound_is_never_evicted(clock):
    store = BucketStore(shards=16, clock=clock)
    bound = MemoryBound()
    bound.configure(1, "nearest-full", 5)
    for i in range(10_000):
        store.check(b"k:%d" % i, 10, 1)
    assert len(store) == 10_000 and bound.used == 0 and bound.evicted == 0


def test_a_refused_bucket_leaves_every_rule_of_the_check_unspent(clock):
    # CL.LIMIT is all or nothing: the commit of several rules makes room
    # for all their new buckets first, so a refusal spends nothing.
    store, engine, bound = bounded(clock, 1 << 30, "noeviction")
    tb = {"algorithm": "token_bucket", "capacity": 5, "refill": 1, "period_ms": 1000}
    engine.define(1, tb)
    engine.define(2, tb)
    assert engine.apply([1], b"c") == (1, 5, 4, 0, 1000)      # rule 1's bucket exists
    bound.configure(bound.used, "noeviction", 5)               # no byte more
    with pytest.raises(OutOfMemory):
        engine.apply([1, 2], b"c")                             # rule 2's would be new
    assert engine.apply([1], b"c", cost=0)[:3] == (1, 5, 4)    # rule 1 not spent
    assert engine.apply([1], b"c")[:3] == (1, 5, 3)            # an existing bucket: checked
