"""The engine's change logs (what replication ships): with tracking on,
every committed write notes its key; a drain gives each noted key's
current record once, or a tombstone for a key that is gone; loading the
drain with deletes makes another store equal.  Manual clock throughout.
"""

from __future__ import annotations

import random

import pytest

from fastlimit._core import BucketStore, Clock
from fastlimit._rules import RuleEngine
from fastlimit.server.snapshot import parse_sections



def sections(drained: list):
    """The drained sections, read by the snapshot format's own parser."""
    return parse_sections(memoryview(b"".join(drained)))


def apply(store: BucketStore, drained: list) -> int:
    total = 0
    for s in sections(drained):
        assert s.name == b"check"
        store.load(s.data, s.records, True)
        total += s.records
    return total


def pair(start_ms=1_000_000):
    clock = Clock(manual=True, start_ms=start_ms)
    return BucketStore(clock=clock), BucketStore(clock=clock), clock


def peeks(store, keys, capacity=10, refill=1):
    return [store.check(k, capacity, refill, cost=0) for k in keys]


def test_nothing_is_noted_until_tracking_starts():
    a, _, _ = pair()
    a.check(b"k", 10, 1)
    assert a.drain_changes() == []
    assert a.oldest_change_ms() is None
    a.track_changes(1 << 20)
    assert a.drain_changes() == []      # tracking starts empty
    a.check(b"k", 10, 1)
    assert a.oldest_change_ms() is not None
    assert [s.records for s in sections(a.drain_changes())] == [1]
    assert a.drain_changes() == []      # a drain empties the log
    a.untrack_changes()
    a.check(b"k", 10, 1)
    assert a.drain_changes() == []


def test_a_key_written_many_times_is_shipped_once_as_it_is_now():
    a, b, _ = pair()
    a.track_changes(1 << 20)
    for _ in range(7):
        a.check(b"hot", 10, 1)
    drained = a.drain_changes()
    assert apply(b, drained) == 1
    assert peeks(b, [b"hot"]) == peeks(a, [b"hot"]) == [(1, 10, 3, 0, 7000)]


@pytest.mark.parametrize("remove", [
    lambda s, k: s.reset(k),                             # CL.RESET
    lambda s, k: s.check(k, 10, 1, cost=11, now_ms=2_000_000),  # refilled: a full bucket is dropped
])
def test_a_removed_key_ships_as_a_tombstone(remove):
    a, b, _ = pair()
    a.check(b"gone", 10, 1, cost=4)
    b.check(b"gone", 10, 1, cost=4)      # the replica had it
    a.track_changes(1 << 20)
    remove(a, b"gone")
    assert len(a) == 0
    apply(b, a.drain_changes())
    assert len(b) == 0


def test_a_tombstone_for_a_key_the_replica_never_had_is_harmless():
    a, b, _ = pair()
    a.track_changes(1 << 20)
    a.check(b"k", 10, 1)
    a.reset(b"k")
    apply(b, a.drain_changes())
    assert len(b) == 0


def test_applying_a_drain_twice_changes_nothing():
    a, b, _ = pair()
    a.track_changes(1 << 20)
    keys = [b"k%d" % i for i in range(50)]
    for k in keys:
        a.check(k, 10, 1, cost=3)
    a.reset(keys[0])
    drained = a.drain_changes()
    apply(b, drained)
    first = peeks(b, keys)
    apply(b, drained)
    assert peeks(b, keys) == first == peeks(a, keys)


@pytest.mark.parametrize("seed", range(3))
def test_random_writes_drained_now_and_then_keep_a_copy_equal(seed):
    rng = random.Random(seed)
    a, b, clock = pair()
    a.track_changes(1 << 20)
    keys = [b"key:%d" % i for i in range(300)]
    for step in range(6000):
        k = rng.choice(keys)
        op = rng.random()
        if op < 0.05:
            a.reset(k)
        else:
            a.check(k, 10, 1, cost=rng.randint(0, 4))
        if rng.random() < 0.01:
            clock.advance(rng.randint(0, 3000))
        if rng.random() < 0.02:
            apply(b, a.drain_changes())
    apply(b, a.drain_changes())
    assert len(b) == len(a)
    assert peeks(b, keys) == peeks(a, keys)


def test_a_full_log_stops_and_says_so():
    a, _, _ = pair()
    a.track_changes(2048)
    for i in range(200):
        a.check(b"key:%06d" % i, 10, 1)
    assert a.changes_overflowed()
    a.track_changes(2048)                # restarting empties it
    assert not a.changes_overflowed()


def test_rule_engine_tables_are_tracked_including_lease_tables_made_later():
    clock = Clock(manual=True, start_ms=1_000_000)
    a, b = RuleEngine(clock=clock), RuleEngine(clock=clock)
    spec = {"algorithm": "fixed_window", "limit": 5, "window_ms": 60000}
    for engine in (a, b):
        engine.define(1, spec)
    a.track_changes(1 << 20)
    conc = {"algorithm": "concurrency", "limit": 2, "lease_ms": 1000}
    for engine in (a, b):
        engine.define(2, conc)
    a.apply([1], b"client")
    lease = a.acquire(2, b"client")
    drained = sections(a.drain_changes())
    assert sorted(s.name for s in drained) == [b"fixed_window", b"leases:2"]
    renumber = [0, 1, 2]
    for s in drained:
        assert b.load_section(s.name, s.value_size, s.data, s.records, renumber, True)
    assert b.apply([1], b"client", cost=0) == a.apply([1], b"client", cost=0)
    assert b.release(2, b"client", lease[4]) is True


def test_malformed_drains_are_refused():
    a, b, _ = pair()
    a.track_changes(1 << 20)
    a.check(b"k", 10, 1)
    (s,) = sections(a.drain_changes())
    body = bytes(s.data)
    for bad in (body[:-1], body + b"\0", body[:3]):
        with pytest.raises(ValueError):
            b.load(bad, s.records, True)
    with pytest.raises(ValueError):
        b.load(body, s.records + 1, True)
