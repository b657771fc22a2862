"""The registry driving the real engine (fastlimit._rules.RuleEngine):
rule changes take effect on the next check, keep or drop buckets as
documented, matching by resource, tier and client, all-or-nothing
evaluation, shadow rules, counters and denials; and the model's bounds
are exactly the engine's."""

from __future__ import annotations

import pytest

from fastlimit.rules.model import NUMBER_FIELDS, RuleError, parse_rule


def tb(capacity, rate=1, **fields):
    return {"capacity": capacity, "refill_per_second": rate, **fields}


@pytest.fixture
def reg(real_engine, store, registry_factory):
    return registry_factory(real_engine, store)


@pytest.fixture
def check(real_engine):
    def run(client=b"user:1", resource=b"GET /", tier=None, cost=1, now=0, detail=False):
        return real_engine.limit(client, resource, tier, cost, now_ms=now, detail=detail)
    return run


def allowed(result) -> int:
    return result[0]


def test_no_rule_allows(reg, check):
    assert check() == (1, -1, -1, 0, 0)


def test_a_new_rule_applies_to_the_next_check(reg, check):
    assert allowed(check())                     # the engine caches "no rules" for GET /
    reg.set("one", tb(1))
    assert check() == (1, 1, 0, 0, 1000)
    assert check()[:2] == (0, 1)
    reg.delete("one")
    assert check() == (1, -1, -1, 0, 0)


def test_all_or_nothing(reg, check):
    reg.set("per-second", tb(5, 5))
    reg.set("per-hour", tb(3, 3))
    for _ in range(3):
        assert allowed(check())
    five, detail = check(detail=True)
    assert five[0] == 0
    steps = {reg.rule_id(num): ok for num, _, ok, _, _, _ in detail}
    assert steps == {"per-hour": 0, "per-second": 1}
    reg.delete("per-hour")
    # per-second had 2 left, and the denied call spent none of them.
    assert check()[:3] == (1, 5, 1)


def test_changing_numbers_keeps_buckets(reg, check):
    reg.set("r", tb(10))
    for _ in range(8):
        check()
    assert check(cost=0)[2] == 2
    reg.set("r", tb(20))                        # more room: the 2 tokens stay 2
    assert check(cost=0)[:3] == (1, 20, 2)
    reg.set("r", tb(1))                         # less room: capped
    assert check(cost=0)[:3] == (1, 1, 1)
    reg.set("r", tb(1, mode="shadow"))          # mode: same buckets
    reg.set("r", tb(1, match={"resource": "GET /*"}))
    assert check()[:3] == (1, 1, 0)


def test_deleting_drops_buckets(reg, check):
    reg.set("r", tb(2))
    check(), check()
    assert not allowed(check())
    reg.delete("r")
    reg.set("r", tb(2))
    assert check()[:3] == (1, 2, 1)             # a new rule: a full bucket


def test_a_new_algorithm_starts_fresh(reg, check):
    reg.set("r", tb(2))
    check(), check()
    reg.set("r", {"algorithm": "fixed_window", "limit": 3, "window_ms": 1000})
    assert check()[:3] == (1, 3, 2)
    reg.set("r", tb(2))                         # back again: not the old, empty bucket
    assert check()[:3] == (1, 2, 1)


def test_rules_never_share_buckets(reg, check):
    reg.set("a", tb(1))
    reg.set("b", tb(1, match={"tier": "t"}))
    assert allowed(check())                     # a spends its token
    assert allowed(check(client=b"user:2", tier=b"t"))
    # b's bucket for user:1 is untouched by a's spending; a denies.
    five, detail = check(tier=b"t", detail=True)
    steps = {reg.rule_id(d[0]): d[2] for d in detail}
    assert five[0] == 0 and steps == {"a": 0, "b": 1}


def test_tier_matching(reg, check):
    reg.set("free", tb(1, match={"tier": "free"}))
    assert check(tier=b"free")[:2] == (1, 1)
    assert check(tier=b"free")[0] == 0
    assert check(tier=b"paid") == (1, -1, -1, 0, 0)
    assert check(tier=None) == (1, -1, -1, 0, 0)
    assert check(tier=b"Free") == (1, -1, -1, 0, 0)


def test_resource_and_client_globs(reg, check):
    reg.set("products", tb(1, match={"resource": "GET /products/*", "client": "ip:10.*"}))
    assert check(b"ip:10.0.0.1", b"GET /products/1")[:2] == (1, 1)
    assert check(b"ip:10.0.0.1", b"GET /products/2")[0] == 0     # one bucket per client
    assert check(b"ip:11.0.0.1", b"GET /products/1") == (1, -1, -1, 0, 0)
    assert check(b"ip:10.0.0.1", b"GET /orders") == (1, -1, -1, 0, 0)


def test_bucket_per_client_and_resource(reg, check):
    reg.set("r", tb(1, key="client+resource", match={"resource": "GET /*"}))
    assert allowed(check(resource=b"GET /a"))
    assert allowed(check(resource=b"GET /b"))
    assert not allowed(check(resource=b"GET /a"))


def test_shadow_rules_count_but_never_deny(reg, check):
    reg.set("trial", tb(1, mode="shadow"))
    assert allowed(check(now=5)) and allowed(check(now=6)) and allowed(check(now=7))
    assert reg.stats("trial") == {"allowed": 1, "denied": 0, "shadow_denied": 2}
    assert [d[:2] for d in reg.denials()] == [(7, "trial"), (6, "trial")]


def test_counters_and_denials(reg, check):
    reg.set("r", tb(2))
    for t in range(4):
        check(client=b"user:9", now=t)
    assert reg.stats("r") == {"allowed": 2, "denied": 2, "shadow_denied": 0}
    assert reg.denials() == [(3, "r", b"user:9", 1), (2, "r", b"user:9", 1)]
    reg.set("r", {"algorithm": "gcra", "burst": 0, "count": 1, "period_ms": 1000})
    check(client=b"user:9", now=10)
    assert reg.stats("r") == {"allowed": 3, "denied": 2, "shadow_denied": 0}
    reg.delete("r")
    assert reg.denials()[0][1] == "r"           # still named after it is gone


def test_concurrency_rule(reg, real_engine):
    reg.set("exports", {"algorithm": "concurrency", "limit": 1, "lease_ms": 1000})
    num = reg.num_by_id["exports"]
    first = real_engine.acquire(num, b"user:1", now_ms=0)
    assert first[0] == 1
    assert real_engine.acquire(num, b"user:1", now_ms=1)[0] == 0
    assert real_engine.release(num, b"user:1", first[4], now_ms=2)


def test_restart_keeps_rules_in_force(db_path, registry_factory):
    from fastlimit import Clock
    from fastlimit._rules import RuleEngine
    from fastlimit.rules.store import RuleStore
    with RuleStore(db_path) as s:
        reg = registry_factory(RuleEngine(clock=Clock(manual=True), shards=1), s)
        reg.set("r", tb(1, match={"resource": "GET /x"}))
    engine = RuleEngine(clock=Clock(manual=True), shards=1)
    with RuleStore(db_path) as s:
        registry_factory(engine, s)
        assert engine.limit(b"u", b"GET /x", now_ms=0)[:2] == (1, 1)
        assert engine.limit(b"u", b"GET /x", now_ms=0)[0] == 0


# ---- the model's bounds are the engine's -------------------------------------------------

BASE = {
    # A fast refill keeps the refill-time bound out of the way.
    "token_bucket": {"capacity": 1, "refill": 10**15, "period_ms": 1},
    "fixed_window": {"limit": 10, "window_ms": 1000},
    "sliding_window": {"limit": 10, "window_ms": 1000},
    "gcra": {"burst": 1, "count": 1, "period_ms": 1000},
    "concurrency": {"limit": 1, "lease_ms": 1000},
}
CASES = [(algorithm, field, bound) for algorithm, fields in NUMBER_FIELDS.items()
         for field, bound in fields.items() if field != "refill_per_second"]


@pytest.mark.parametrize("algorithm, field, bound", CASES)
def test_number_bounds_match_the_engine(real_engine, algorithm, field, bound):
    low, high, _ = bound
    for value, ok in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
        doc = {"algorithm": algorithm, **BASE[algorithm], field: value}
        if algorithm == "gcra":
            doc["period_ms" if field == "burst" else "burst"] = 1
        try:
            spec = parse_rule("r", doc).engine_spec()
        except RuleError:
            assert not ok, (doc, "model refuses a value the engine takes")
            spec = {"algorithm": algorithm, "shadow": False, "scope": "client", **doc}
            with pytest.raises(ValueError):
                real_engine.define(1, spec)
            continue
        assert ok, (doc, "model takes a value it should not")
        real_engine.define(1, spec)


@pytest.mark.parametrize("doc, ok", [
    ({"capacity": 10**15, "refill": 1, "period_ms": 1}, True),
    ({"capacity": 10**15, "refill": 1, "period_ms": 2}, False),
    ({"capacity": 10**15, "refill_per_second": 1000}, True),
    ({"capacity": 10**15, "refill_per_second": 999}, False),
    ({"algorithm": "gcra", "burst": 10**9 - 1, "count": 1, "period_ms": 10**9}, True),
    ({"algorithm": "gcra", "burst": 10**9, "count": 1, "period_ms": 10**9}, False),
])
def test_combined_bounds_match_the_engine(real_engine, doc, ok):
    try:
        spec = parse_rule("r", doc).engine_spec()
    except RuleError:
        assert not ok
        spec = {"algorithm": doc.get("algorithm", "token_bucket"), **doc}
        if "refill_per_second" in spec:
            spec["refill"] = spec.pop("refill_per_second")
        with pytest.raises(ValueError):
            real_engine.define(1, spec)
        return
    assert ok
    real_engine.define(1, spec)
