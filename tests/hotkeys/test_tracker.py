"""The hot-key tracker in C (fl_hotkeys.h through _hotkeys.HotKeys) against
an exact count: Space-Saving's guarantees hold on every stream of the
table (count - error <= true <= count for every key counted, every key
above N/k counted), its memory is fixed by k, counts halve with time in
continuous mode, a session stops at its DURATION, and sampling counts one
check in `sample` at random intervals."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from fastlimit._hotkeys import BUCKET, KEY_MAX, MAX_K, RULE, HotKeys


def zipf(n: int, distinct: int, s: float, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    weights = [1 / (i + 1) ** s for i in range(distinct)]
    return [b"key:%d" % i for i in rnd.choices(range(distinct), weights, k=n)]


def uniform_plus_hot(n: int, distinct: int, hot_share: float, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    return [b"hot" if rnd.random() < hot_share else b"cold:%d" % rnd.randrange(distinct)
            for _ in range(n)]


def round_robin(n: int, distinct: int) -> list[bytes]:
    return [b"rr:%d" % (i % distinct) for i in range(n)]


STREAMS = {
    "zipf 1.1, 1k keys, k=8": (lambda: zipf(50_000, 1_000, 1.1, 1), 8),
    "zipf 0.8, 100k keys, k=32": (lambda: zipf(50_000, 100_000, 0.8, 2), 32),
    "zipf 1.5, 10 keys, k=16 (all fit)": (lambda: zipf(20_000, 10, 1.5, 3), 16),
    "one hot at 10% among 50k distinct, k=4": (lambda: uniform_plus_hot(50_000, 50_000, .1, 4), 4),
    "every key distinct, k=32": (lambda: [b"d:%d" % i for i in range(20_000)], 32),
    "round robin over 3 keys, k=2": (lambda: round_robin(9_000, 3), 2),
    "k=1": (lambda: zipf(10_000, 100, 1.2, 5), 1),
    "k=1024, 5k keys": (lambda: zipf(30_000, 5_000, 1.0, 6), MAX_K),
}


@pytest.mark.parametrize("name", STREAMS)
def test_space_saving_bounds_hold_against_an_exact_count(name):
    make, k = STREAMS[name]
    stream = make()
    exact = Counter(stream)
    t = HotKeys(k=k, sample=1, half_life_ms=0, seed=7)
    for key in stream:
        t.count(key)
    entries = t.entries(0)
    assert len(entries) == min(k, len(exact))
    assert sum(count for *_, count, _ in entries) == len(stream)    # counts add up to N
    for kind, key, full_len, count, error in entries:
        assert kind == BUCKET and full_len == len(key)
        assert count - error <= exact[key] <= count, key
    counted = {key for _, key, *_ in entries}
    for key, n in exact.items():
        if n > len(stream) / k:
            assert key in counted, key          # every key above N/k is there
    # the counters are most counted first
    assert [e[3] for e in entries] == sorted((e[3] for e in entries), reverse=True)


@pytest.mark.parametrize("name", [n for n in STREAMS if "zipf" in n or "hot" in n])
def test_the_true_top_keys_are_ranked_first(name):
    make, k = STREAMS[name]
    stream = make()
    exact = Counter(stream)
    t = HotKeys(k=k, sample=1, half_life_ms=0, seed=11)
    for key in stream:
        t.count(key)
    (top_key, top_n), = exact.most_common(1)
    if top_n > len(stream) / k:
        assert t.entries(0)[0][1] == top_key


def test_keys_longer_than_a_slot_are_kept_apart_by_their_hash_and_marked():
    t = HotKeys(k=4, sample=1, half_life_ms=0, seed=3)
    a, b = b"x" * 200 + b"a", b"x" * 200 + b"b"     # the same first 64 bytes
    for _ in range(3):
        t.count(a)
    t.count(b)
    entries = t.entries(0)
    assert [(key, full_len, count) for _, key, full_len, count, _ in entries] == [
        (b"x" * KEY_MAX, 201, 3), (b"x" * KEY_MAX, 201, 1)]


def test_a_bucket_key_and_a_rule_key_with_the_same_bytes_are_two_counters():
    t = HotKeys(k=4, sample=1, half_life_ms=0, seed=3)
    t.count(b"same", BUCKET)
    t.count(b"same", RULE)
    t.count(b"same", RULE)
    assert [(kind, count) for kind, _, _, count, _ in t.entries(0)] == [(RULE, 2), (BUCKET, 1)]


@pytest.mark.parametrize("k", [0, 1, 32, 1024])
def test_memory_is_fixed_by_k_whatever_the_number_of_distinct_keys(k):
    t = HotKeys(k=k, sample=1, half_life_ms=0, seed=1)
    before = t.nbytes
    for i in range(100_000):
        t.count(b"distinct:%d" % i)
    assert t.nbytes == before
    assert t.used == min(k, 100_000)
    if k:
        assert before < 200 * k + 1024      # a slot is about 100 bytes


def test_configure_refuses_what_is_out_of_range():
    with pytest.raises(ValueError):
        HotKeys(k=MAX_K + 1)
    with pytest.raises(ValueError):
        HotKeys(sample=0)


@pytest.mark.parametrize("sample", [1, 2, 16, 100])
def test_one_check_in_sample_is_counted_on_average(sample):
    t = HotKeys(k=8, sample=sample, half_life_ms=0, seed=5)
    n = 200_000
    for _ in range(n):
        t.check(b"k", 0)
    assert t.sampled == pytest.approx(n / sample, rel=0.05)
    assert n - 2 * sample <= t.checks <= n      # the checks up to the last sampled one
    assert t.entries(0)[0][3] == t.sampled


def test_random_intervals_see_every_key_of_a_round_robin_client():
    """A fixed interval of 16 against 16 keys in turn would see one key only."""
    t = HotKeys(k=32, sample=16, half_life_ms=0, seed=9)
    for i in range(16 * 4000):
        t.check(b"rr:%d" % (i % 16), 0)
    counts = {key: count for _, key, _, count, _ in t.entries(0)}
    assert len(counts) == 16
    assert min(counts.values()) > 0.7 * max(counts.values())


def test_continuous_mode_halves_counts_and_their_time_every_half_life():
    t = HotKeys(k=4, sample=1, half_life_ms=1000, now_ms=0, seed=1)
    for _ in range(100):
        t.check(b"a", 500)
    assert t.covered_ms(999) == 999
    assert t.entries(999)[0][3] == 100
    assert t.entries(1000)[0][3] == 50           # a half-life passed
    assert t.covered_ms(1000) == 500
    assert t.entries(3500)[0][3] == 50 >> 2         # halved at 2000 and 3000
    # a steady rate reads the same whatever the time: count / covered time
    t = HotKeys(k=4, sample=1, half_life_ms=1000, now_ms=0, seed=1)
    for ms in range(0, 10_000):
        for _ in range(3):
            t.check(b"steady", ms)
    count = t.entries(10_000)[0][3]
    assert count * 1000 / t.covered_ms(10_000) == pytest.approx(3000, rel=0.02)
    # long idle: everything halves away, nothing breaks
    assert t.entries(10**9)[0][3] == 0


def test_a_clock_that_goes_back_counts_no_time():
    t = HotKeys(k=4, sample=1, half_life_ms=0, now_ms=5000, seed=1)
    t.check(b"a", 6000)
    t.check(b"a", 4000)
    assert t.covered_ms(3000) == 1000


def test_a_session_stops_at_its_duration_and_keeps_its_counts():
    t = HotKeys()
    t.start(8, 1, 2000, 1000, seed=1)
    assert t.active and t.end_ms == 3000 and t.half_life_ms == 0
    for ms in (1000, 2000, 2999):
        t.check(b"a", ms)
    t.check(b"a", 3000)              # past the end: not counted
    t.check(b"a", 5000)
    assert not t.active
    assert t.stopped_ms == 3000
    assert t.entries(9000)[0][3] == 3
    assert t.covered_ms(9000) == 2000


def test_stop_freezes_and_reset_counts_again():
    t = HotKeys(k=4, sample=1, half_life_ms=0, seed=1)
    t.check(b"a", 10)
    t.stop(20)
    t.check(b"a", 30)
    assert not t.active and t.entries(40)[0][3] == 1
    t.reset(50)
    assert t.active and t.entries(50) == []
    t.check(b"b", 60)
    assert [key for _, key, *_ in t.entries(60)] == [b"b"]


def test_off_counts_nothing():
    t = HotKeys(k=0, sample=1)
    for _ in range(100):
        t.check(b"a", 0)
    assert not t.active and t.entries(0) == [] and t.sampled == 0


@pytest.mark.parametrize("k", [1, 3, 32])
def test_halvings_merge_counters_of_equal_counts_and_the_summary_stays_whole(k):
    """Counts halved again and again (a half-life of 7 ms over 20 s) merge
    the buckets of equal counts; every counter stays listed once, the
    counting goes on, and the steady hot key keeps first place."""
    t = HotKeys(k=k, sample=1, half_life_ms=7, now_ms=0, seed=2)
    rnd = random.Random(k)
    for ms in range(20_000):
        t.check(b"hot", ms)
        t.check(b"cold:%d" % rnd.randrange(1000), ms)
        if ms % 3 == 0:
            t.check(b"warm:%d" % rnd.randrange(4), ms)
        if ms % 5000 == 4999:
            entries = t.entries(ms)
            keys = [key for _, key, *_ in entries]
            assert len(keys) == len(set(keys)) == min(k, t.used)
            if k > 1:            # one counter is whichever key came last
                assert keys[0] == b"hot"
    assert t.used == k
