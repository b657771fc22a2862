"""Embedded mode (fastlimit.embedded): the Limiter with the client's API
and no server, and the LocalFallback that clients run on it."""

from __future__ import annotations

import threading

import pytest

from fastlimit import Clock, Decision, Limiter, LocalFallback
from fastlimit.embedded import MAX_PERIOD_MS, SWEEP_EVERY, divide_limit


def manual_limiter(**kwargs) -> tuple[Limiter, Clock]:
    clock = Clock(manual=True)
    return Limiter(clock=clock, **kwargs), clock


def test_worked_example_from_the_brief():
    limiter, clock = manual_limiter()
    allowed = []
    for t in (0, 0, 0, 0, 0, 0, 500, 500, 1500, 1500, 1500):
        clock.set(t)
        allowed.append(limiter.check("user:42", 5, 2).allowed)
    assert allowed == [True] * 5 + [False, True, False, True, True, False]


def test_decision_fields_match_the_engine():
    limiter, clock = manual_limiter()
    assert limiter.check(b"k", 5, 2) == Decision(True, 5, 4, 0, 500, "local")
    assert limiter.check(b"k", 5, 2, cost=4) == Decision(True, 5, 0, 0, 2500, "local")
    assert limiter.check(b"k", 5, 2) == Decision(False, 5, 0, 500, 2500, "local")
    assert limiter.check(b"k", 5, 2, cost=6) == Decision(False, 5, 0, -1, 2500, "local")


def test_period_makes_slow_rates_exact():
    limiter, clock = manual_limiter()
    hour = 3_600_000
    assert sum(limiter.check("report", 2, 1, period_ms=hour).allowed for _ in range(3)) == 2
    clock.set(hour - 1)
    assert not limiter.check("report", 2, 1, period_ms=hour).allowed
    clock.set(hour)
    assert limiter.check("report", 2, 1, period_ms=hour).allowed


def test_text_and_bytes_keys_are_one_bucket():
    limiter, _ = manual_limiter()
    limiter.check("clé", 2, 1)
    assert limiter.check("clé".encode(), 2, 1).remaining == 0


def test_bad_arguments_raise():
    limiter, _ = manual_limiter()
    with pytest.raises(ValueError):
        limiter.check("k", 0, 1)
    with pytest.raises(ValueError):
        limiter.check("k", 5, 1, on_failure="maybe")
    with pytest.raises(TypeError):
        limiter.check(42, 5, 1)


def test_reset_and_len():
    limiter, _ = manual_limiter()
    limiter.check("a", 5, 1)
    limiter.check("b", 5, 1)
    assert len(limiter) == 2
    assert limiter.reset("a") and not limiter.reset("a")
    assert len(limiter) == 1 and limiter.check("a", 5, 1).remaining == 4


def test_idle_buckets_are_swept_without_a_server():
    limiter, clock = manual_limiter(shards=1)
    for i in range(2000):
        limiter.check(f"idle:{i}", 5, 5)
    clock.set(10_000)                       # every bucket has refilled
    assert limiter.sweep(budget_ms=1000) == 2000
    assert len(limiter) == 0


def test_checks_pay_for_the_sweep_now_and_then():
    limiter, clock = manual_limiter(shards=1)
    for i in range(1000):
        limiter.check(f"idle:{i}", 5, 5)
    clock.set(10_000)
    for _ in range(SWEEP_EVERY):
        limiter.check("busy", 10**9, 1)
    assert len(limiter) < 1001


@pytest.mark.untraced  # tracing lets threads into a check
def test_many_threads_get_exactly_the_capacity():
    limiter, _ = manual_limiter()           # the clock never moves: no refill
    capacity, threads, per_thread = 1000, 32, 100
    start = threading.Barrier(threads)
    allowed = [0] * threads

    def hammer(i: int) -> None:
        start.wait()
        for _ in range(per_thread):
            allowed[i] += limiter.check("shared", capacity, 1).allowed

    workers = [threading.Thread(target=hammer, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sum(allowed) == capacity
    assert limiter.check("shared", capacity, 1).remaining == 0


@pytest.mark.untraced  # tracing lets threads into a check
def test_many_threads_many_keys():
    limiter, _ = manual_limiter()
    threads, keys, capacity = 32, 10, 7
    start = threading.Barrier(threads)
    allowed: dict[int, int] = {}
    lock = threading.Lock()

    def hammer() -> None:
        start.wait()
        for round_ in range(20):
            for k in range(keys):
                if limiter.check(f"key:{k}", capacity, 1).allowed:
                    with lock:
                        allowed[k] = allowed.get(k, 0) + 1

    workers = [threading.Thread(target=hammer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert allowed == {k: capacity for k in range(keys)}


@pytest.mark.parametrize("limit, divisor, expected", [
    ((10, 4, 1000), 1, (10, 4, 1000)),
    ((10, 4, 1000), 2, (5, 2, 1000)),        # refill divides evenly
    ((10, 2, 1000), 4, (2, 2, 4000)),        # 2 per 4 s is exactly 0.5/s
    ((3, 1, 1000), 5, (1, 1, 5000)),         # capacity never drops to 0
    ((10, 3, MAX_PERIOD_MS), 2, (5, 1, MAX_PERIOD_MS)),  # period at its bound: round down
])
def test_divide_limit(limit, divisor, expected):
    assert divide_limit(*limit, divisor) == expected


def test_fallback_enforces_the_divided_limit():
    clock = Clock(manual=True)
    fallback = LocalFallback(divisor=4, clock=clock)
    results = [fallback.check("k", 10, 2) for _ in range(4)]
    assert [d.allowed for d in results] == [True, True, False, False]
    assert {d.source for d in results} == {"local_fallback"}
    assert results[0].limit == 2
    clock.set(1999)                          # 2 per 4 s: a token every 2 s
    assert not fallback.check("k", 10, 2).allowed
    clock.set(2000)
    assert fallback.check("k", 10, 2).allowed


def test_fallback_rules_most_specific_first():
    clock = Clock(manual=True)
    fallback = LocalFallback(clock=clock, rules={
        ("POST /orders", "free"): (1, 1),
        "POST /orders": (2, 1),
        ("*", "free"): (3, 1),
        "*": (4, 1, 60_000),
    })

    def allowed(resource, tier, client="c"):
        n = 0
        while fallback.limit(client, resource, tier).allowed:
            n += 1
        return n

    assert allowed("POST /orders", "free") == 1
    assert allowed("POST /orders", "paid") == 2
    assert allowed("GET /products", "free") == 3
    assert allowed("GET /products", None) == 4
    assert allowed("GET /products", None, client="other") == 4


def test_fallback_rules_keep_buckets_apart():
    fallback = LocalFallback(rules={"a": (1, 1), "b": (1, 1)}, clock=Clock(manual=True))
    assert fallback.limit("c", "a").allowed and fallback.limit("c", "b").allowed
    assert not fallback.limit("c", "a").allowed
    # a check() key never shares a bucket with a rule's
    assert fallback.check("c", 1, 1).allowed


def test_fallback_without_a_matching_rule_says_none():
    fallback = LocalFallback(rules={"POST /orders": (5, 1)})
    assert fallback.limit("c", "GET /") is None
    assert LocalFallback().limit("c", "GET /") is None


def test_fallback_validates():
    with pytest.raises(ValueError):
        LocalFallback(divisor=0)
    with pytest.raises(ValueError):
        LocalFallback(rules={"x": (1,)})
