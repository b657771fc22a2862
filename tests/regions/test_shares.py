"""A region's static share of a rule (fastlimit.regions.shares, through
Rule.engine_spec): a table of documents and the numbers each region
enforces, the document errors, and the bound for random rules and weights:
the regions' tokens together never exceed the rule's and their rates add
up to its rate exactly."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from fastlimit.regions.shares import Regions, share_spec, tier_regions
from fastlimit.rules.model import RuleError, parse_rule

THREE = ("ap", "eu", "us")


def spec_in(region: str, doc: dict, names=THREE) -> dict:
    return parse_rule("r", doc).engine_spec(Regions(region, names))


TB = {"capacity": 100, "refill_per_second": 10, "regions": "static"}


@pytest.mark.parametrize("doc, region, expected", [
    # equal shares: a third of the tokens (rounded down), a third of the rate
    (TB, "eu", {"capacity": 33, "refill": 1, "period_ms": 300}),
    # weights 3:1: eu three quarters, us one quarter
    (dict(TB, shares={"eu": 3, "us": 1}), "eu", {"capacity": 75, "refill": 3, "period_ms": 400}),
    (dict(TB, shares={"eu": 3, "us": 1}), "us", {"capacity": 25, "refill": 1, "period_ms": 400}),
    ({"algorithm": "fixed_window", "limit": 10, "window_ms": 1000, "regions": "static"}, "ap",
     {"limit": 3, "window_ms": 1000}),
    ({"algorithm": "sliding_window", "limit": 90, "window_ms": 60_000, "regions": "static",
      "shares": {"ap": 1, "eu": 1, "us": 1}}, "us", {"limit": 30, "window_ms": 60_000}),
    # GCRA: burst + 1 tokens shared, the emission interval three times longer
    ({"algorithm": "gcra", "burst": 8, "count": 10, "period_ms": 1000, "regions": "static"}, "eu",
     {"burst": 2, "count": 1, "period_ms": 300}),
    ({"algorithm": "concurrency", "limit": 7, "lease_ms": 1000, "regions": "static"}, "eu",
     {"limit": 2, "lease_ms": 1000}),
    # regional (the default): every region the whole rule
    ({"capacity": 100, "refill_per_second": 10}, "eu",
     {"capacity": 100, "refill": 10, "period_ms": 1000}),
])
def test_each_region_enforces_its_share(doc, region, expected):
    spec = spec_in(region, doc)
    assert {k: spec[k] for k in expected} == expected


def test_a_tier_without_regions_enforces_the_whole_static_rule():
    rule = parse_rule("r", TB)
    assert rule.engine_spec(None)["capacity"] == 100
    assert tier_regions(None, []) is None
    # one region alone holds the whole limit
    assert rule.engine_spec(tier_regions("eu", []))["capacity"] == 100


def test_the_document_keeps_regions_and_shares():
    rule = parse_rule("r", dict(TB, shares={"us": 1, "eu": 3}))
    assert (rule.regions, rule.shares) == ("static", (("eu", 3), ("us", 1)))
    assert parse_rule("r", rule.to_json()) == rule
    assert '"regions":"static","shares":{"eu":3,"us":1}' in rule.to_json()
    assert "regions" not in parse_rule("r", {"capacity": 1, "refill_per_second": 1}).to_json()


@pytest.mark.parametrize("doc, error", [
    (dict(TB, regions="anywhere"), "regions: must be 'regional' or 'static' or 'global' or "
                                   "'home'"),
    (dict(TB, regions="regional", shares={"eu": 1}),
     'shares: only a static or global rule has shares'),
    (dict(TB, regions="static", partition="whole"),
     'partition: only a global rule has a partition policy ("regions": "global")'),
    (dict(TB, regions="global", partition="all"), "partition: must be 'share' or 'whole'"),
    (dict(TB, regions="global", split=2), "regions: a global rule cannot be a concurrency "
                                          "rule or split"),
    ({"algorithm": "concurrency", "limit": 3, "lease_ms": 10, "regions": "global"},
     "regions: a global rule cannot be a concurrency rule or split"),
    (dict(TB, regions="home", split=2), "regions: a home rule cannot be a concurrency "
                                        "rule or split"),
    (dict(TB, regions="global", home="eu"), 'home: only a home rule has a home'),
    (dict(TB, regions="home", home="e u"), "home: must be a region's name"),
    (dict(TB, regions="static", home_prefixes={"a": "eu"}), "home_prefixes: only a home rule"),
    (dict(TB, regions="home", home_prefixes={"": "eu"}), "home_prefixes: must be an object"),
    (dict(TB, regions="home", home_prefixes={"a": "e u"}), "home_prefixes: must be an object"),
    (dict(TB, regions="home", home_prefixes={"a" * 257: "eu"}),
     "home_prefixes: must be an object"),
    (dict(TB, regions="global", home_allowance=1), "home_allowance: only a home rule has"),
    (dict(TB, regions="home", home_allowance=0), "home_allowance: must be an integer from 1 "
                                                 "to 10"),
    (dict(TB, regions="home", capacity=10, home_allowance=11),
     "home_allowance: must be an integer from 1 to 10"),
    (dict(TB, regions="home", home_allowance=True), "home_allowance: must be an integer"),
    ({"capacity": 1000, "refill": 1, "period_ms": 4_000_000_000, "regions": "home",
      "home_allowance": 1}, "home_allowance: a region's share makes the refill period"),
    (dict(TB, shares=[1, 2]), "shares: must be an object of at most 64 regions"),
    (dict(TB, shares={}), "shares: must be an object"),
    (dict(TB, shares={"eu": 0}), "shares: must be an object"),
    (dict(TB, shares={"eu": True}), "shares: must be an object"),
    (dict(TB, shares={"e u": 1}), "shares: must be an object"),
    (dict(TB, shares={"eu": 1_000_001}), "shares: must be an object"),
    (dict(TB, shares={f"r{i}": 1 for i in range(65)}), "shares: must be an object"),
    # every named region must hold a token, so every region refuses it alike
    (dict(TB, capacity=3, shares={"eu": 1, "us": 3}),
     "shares: region 'eu': a region's share (1/4 of 3) holds no token"),
    ({"capacity": 1000, "refill": 1, "period_ms": 4_000_000_000, "regions": "static",
      "shares": {"eu": 1, "us": 2}}, "shares: region 'eu': a region's share makes the "
                                     "refill period 12000000000 ms"),
])
def test_document_errors(doc, error):
    with pytest.raises(RuleError) as e:
        parse_rule("r", doc)
    assert str(e.value).startswith(f"invalid rule 'r': {error}"), str(e.value)


@pytest.mark.parametrize("doc, numbers", [
    (dict(TB, capacity=100, refill_per_second=10), {"capacity": 5, "refill": 1,
                                                    "period_ms": 2000}),
    ({"algorithm": "fixed_window", "limit": 60, "window_ms": 60_000}, {"limit": 5,
                                                                       "window_ms": 60_000}),
    ({"algorithm": "gcra", "burst": 9, "count": 10, "period_ms": 1000},
     {"burst": 4, "count": 1, "period_ms": 200}),
])
def test_a_home_allowance_is_that_many_of_the_rules_tokens_and_that_share_of_its_rate(
        doc, numbers):
    rule = parse_rule("r", dict(doc, regions="home", home_allowance=5))
    spec = rule.allowance_spec()
    assert {k: spec[k] for k in numbers} == numbers
    assert "home" not in spec and spec["algorithm"] == rule.algorithm
    assert parse_rule("r", rule.to_json()) == rule and '"home_allowance":5' in rule.to_json()
    assert parse_rule("r", dict(doc, regions="home")).allowance_spec() is None


def test_a_region_the_shares_do_not_name_cannot_enforce_the_rule():
    with pytest.raises(ValueError, match="no share for this region \\('ap'\\)"):
        spec_in("ap", dict(TB, shares={"eu": 1, "us": 1}))


def test_equal_shares_among_too_many_regions_hold_no_token():
    with pytest.raises(ValueError, match="holds no token"):
        spec_in("eu", dict(TB, capacity=2))


def _rate(spec: dict) -> Fraction:
    if spec["algorithm"] == "token_bucket":
        return Fraction(spec["refill"], spec["period_ms"])
    if spec["algorithm"] == "gcra":
        return Fraction(spec["count"], spec["period_ms"])
    return Fraction(0)


def _tokens(spec: dict) -> int:
    return {"token_bucket": lambda: spec["capacity"], "gcra": lambda: spec["burst"] + 1}.get(
        spec["algorithm"], lambda: spec["limit"])()


@pytest.mark.parametrize("seed", range(20))
def test_the_regions_together_never_hold_more_than_the_rule(seed):
    rng = random.Random(seed)
    for _ in range(50):
        algorithm = rng.choice(["token_bucket", "gcra", "fixed_window", "sliding_window"])
        spec = {"algorithm": algorithm}
        if algorithm == "token_bucket":
            spec.update(capacity=rng.randint(100, 10**6), refill=rng.randint(1, 10**4),
                        period_ms=rng.randint(1, 10**5))
        elif algorithm == "gcra":
            spec.update(burst=rng.randint(100, 10**5), count=rng.randint(1, 10**4),
                        period_ms=rng.randint(1, 10**5))
        else:
            spec.update(limit=rng.randint(100, 10**6), window_ms=rng.randint(1, 10**6))
        weights = [rng.randint(1, 20) for _ in range(rng.randint(1, 5))]
        shares = [share_spec(spec, w, sum(weights)) for w in weights]
        assert sum(_tokens(s) for s in shares) <= _tokens(spec)
        assert sum(_tokens(s) for s in shares) > _tokens(spec) - len(weights)
        assert sum(_rate(s) for s in shares) == _rate(spec)


def test_a_global_rule_is_whole_until_partitioned_with_the_share_policy():
    rule = parse_rule("r", dict(TB, regions="global"))
    regions = Regions("eu", THREE)
    assert rule.partition == "share"
    whole = rule.engine_spec(regions)
    assert (whole["capacity"], whole["region_sync"]) == (100, True)
    apart = rule.engine_spec(regions, partitioned=True)
    assert (apart["capacity"], apart["refill"], apart["period_ms"]) == (33, 1, 300)
    avail = parse_rule("r", dict(TB, regions="global", partition="whole"))
    assert avail.engine_spec(regions, partitioned=True)["capacity"] == 100
    assert '"regions":"global","partition":"whole"' in avail.to_json()


def test_home_prefixes_name_regions_by_index_for_the_engine():
    rule = parse_rule("r", dict(TB, regions="home", home_prefixes={"t:us-": "us", "t:": "ap"}))
    spec = rule.engine_spec(Regions("eu", THREE))
    assert spec["home"] == -2 and spec["home_prefixes"] == [(b"t:", 0), (b"t:us-", 2)]
    assert parse_rule("r", rule.to_json()) == rule
    with pytest.raises(ValueError, match="home_prefixes: 'xx' is not one of the regions"):
        parse_rule("r", dict(TB, regions="home", home_prefixes={"a": "xx"})).engine_spec(
            Regions("eu", THREE))
