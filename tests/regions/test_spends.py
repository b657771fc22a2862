"""The engine's side of global rules (fastlimit._rules): a spend of a
global rule is logged for the other regions (summed per bucket when
drained, bounded, never blocking a check) and another region's spend is
debited from the bucket here (as much as it holds: a bucket holds no
debt), without counting as a check."""

from __future__ import annotations

import pytest

from fastlimit._core import Clock
from fastlimit._rules import RuleEngine
from fastlimit.regions.shares import Regions
from fastlimit.rules.model import parse_rule

REGIONS = Regions("eu", ("ap", "eu", "us"))


@pytest.fixture
def engine():
    return RuleEngine(clock=Clock(manual=True), shards=4)


def define(engine, num: int, doc: dict) -> None:
    engine.define(num, parse_rule("r", doc).engine_spec(REGIONS))


GLOBAL_WINDOW = {"algorithm": "fixed_window", "limit": 10, "window_ms": 1000,
                 "regions": "global"}


def test_spends_of_global_rules_are_logged_summed_per_bucket(engine):
    define(engine, 1, GLOBAL_WINDOW)
    define(engine, 2, {"algorithm": "fixed_window", "limit": 10, "window_ms": 1000})
    define(engine, 3, dict(GLOBAL_WINDOW, key="client+resource"))
    for _ in range(3):
        engine.apply([1, 2], b"alice")
    engine.apply([1], b"bob", cost=4)
    engine.apply([3], b"alice", resource=b"/x", cost=2)
    engine.apply([1], b"alice", cost=0)          # a peek spends nothing
    engine.apply([1], b"bob", cost=7)            # denied: 4 + 7 > 10, nothing spent
    spends = engine.drain_spends()
    assert spends == {(1, b"alice"): 3, (1, b"bob"): 4, (3, b"\x05\x00alice/x"): 2}
    assert engine.spends_logged == 5
    assert engine.drain_spends() == {}


def test_a_full_log_drops_spends_and_counts_them_never_blocking_a_check(engine):
    define(engine, 1, dict(GLOBAL_WINDOW, limit=1000))
    engine.set_spend_limit(100)                  # five 18-byte entries fit
    allowed = [engine.apply([1], b"k%d" % i)[0] for i in range(10)]
    assert allowed == [1] * 10
    assert len(engine.drain_spends()) == 5 and engine.spends_dropped == 5


def test_a_debit_takes_what_the_bucket_holds_and_is_not_a_check(engine):
    define(engine, 1, GLOBAL_WINDOW)
    assert engine.debit(1, b"alice", 4) == 4
    assert engine.apply([1], b"alice", cost=0)[2] == 6       # remaining after the debit
    assert engine.debit(1, b"alice", 9) == 6                 # no debt: it stops at 0
    assert engine.apply([1], b"alice")[0] == 0
    # debits are not checks: the peek and the denial are the rule's only ones
    assert (engine.stats(1)["allowed"], engine.stats(1)["denied"]) == (1, 1)
    assert engine.drain_spends() == {}                       # nor logged again


@pytest.mark.parametrize("doc, expect_left", [
    ({"algorithm": "token_bucket", "capacity": 10, "refill": 1, "period_ms": 1000,
      "regions": "global"}, 7),
    ({"algorithm": "gcra", "burst": 9, "count": 1, "period_ms": 1000, "regions": "global"}, 7),
    ({"algorithm": "sliding_window", "limit": 10, "window_ms": 1000, "regions": "global"}, 7),
])
def test_every_algorithm_is_debited(engine, doc, expect_left):
    define(engine, 1, doc)
    assert engine.debit(1, b"k", 3) == 3
    assert engine.apply([1], b"k", cost=0)[2] == expect_left


def test_only_global_rules_are_debited(engine):
    define(engine, 1, {"algorithm": "fixed_window", "limit": 10, "window_ms": 1000})
    assert engine.debit(1, b"k", 3) == 0
    assert engine.debit(99, b"k", 3) == 0                    # no such rule
    define(engine, 2, GLOBAL_WINDOW)
    assert engine.debit(2, b"k", 0) == 0


def test_a_global_rule_cannot_be_split_or_concurrency(engine):
    with pytest.raises(ValueError, match="a global rule cannot be"):
        engine.define(1, {"algorithm": "fixed_window", "limit": 10, "window_ms": 1000,
                          "split": 2, "region_sync": True})


def test_a_debit_finds_the_bucket_of_a_rule_whose_split_was_undone(engine):
    """A rule once split keeps its split's epoch in its buckets' keys."""
    engine.define(1, dict(parse_rule("r", GLOBAL_WINDOW).engine_spec(REGIONS), split_epoch=3))
    engine.apply([1], b"alice")
    assert engine.debit(1, b"alice", 4) == 4
    assert engine.apply([1], b"alice", cost=0)[2] == 5
