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


@pytest.mark.parametrize("policy", ["nearest-full", "allkeys-random"])
def test_a_flood_never_takes_the_tables_past_the_bound(clock, policy):
    store, engine, bound = bounded(clock, 512 * KB, policy)
    for i in range(100_000):
        store.check(b"flood:%d" % i, 10, 1)
        if i % 10_000 == 0:
            assert bound.used <= 512 * KB
    assert exact(store, engine, bound) and bound.used <= 512 * KB
    assert bound.evicted == 100_000 - len(store)
    assert len(store) > 0.8 * 512 * KB / 60      # about 55 bytes a bucket: little left unused


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


def test_noeviction_refuses_only_new_buckets(clock):
    store, engine, bound = bounded(clock, 1 << 30, "noeviction")
    store.check(b"old", 10, 1)
    bound.configure(1, "noeviction", 5)
    with pytest.raises(OutOfMemory, match="OOM command not allowed when used memory"):
        store.check(b"new", 10, 1)
    assert store.check(b"old", 10, 1)[:3] == (1, 10, 8)
    assert store.check(b"new", 10, 1, cost=0)[0] == 1      # a peek stores nothing
    assert bound.evicted == 0 and len(store) == 1
    assert bound.evict(10.0) == 0        # nothing to evict under noeviction


def test_a_lowered_bound_is_reached_by_evict(clock):
    store, engine, bound = bounded(clock, 1 << 30)
    for i in range(50_000):
        store.check(b"k:%d" % i, 10, 1)
    bound.configure(256 * KB, "nearest-full", 5)
    while bound.used > 256 * KB:
        assert bound.evict(50.0) > 0
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
