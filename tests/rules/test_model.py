"""The rule document: valid documents, their canonical form and engine
spec; invalid ones with the exact error text an operator sees."""

from __future__ import annotations

import json

import pytest

from fastlimit.rules.model import Match, Rule, RuleError, check_rule_id, parse_rule

TB = {"capacity": 20, "refill_per_second": 10}

# (document, canonical JSON, engine spec)
VALID = [
    (TB,
     '{"match":{},"algorithm":"token_bucket","capacity":20,"refill_per_second":10,'
     '"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "token_bucket", "shadow": False, "scope": "client",
      "capacity": 20, "refill": 10, "period_ms": 1000}),
    ({"match": {"resource": "POST /orders", "tier": "free", "client": "ip:10.*"},
      "algorithm": "token_bucket", "capacity": 20, "refill_per_second": 10,
      "mode": "enforce", "on_failure": "open"},
     '{"match":{"resource":"POST /orders","tier":"free","client":"ip:10.*"},'
     '"algorithm":"token_bucket","capacity":20,"refill_per_second":10,'
     '"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "token_bucket", "shadow": False, "scope": "client",
      "capacity": 20, "refill": 10, "period_ms": 1000}),
    # 1,000 an hour, exactly.
    ({"capacity": 1000, "refill": 1000, "period_ms": 3600000, "mode": "shadow",
      "on_failure": "closed", "key": "client+resource"},
     '{"match":{},"algorithm":"token_bucket","capacity":1000,"refill":1000,'
     '"period_ms":3600000,"mode":"shadow","on_failure":"closed","key":"client+resource"}',
     {"algorithm": "token_bucket", "shadow": True, "scope": "client+resource",
      "on_failure": "closed", "capacity": 1000, "refill": 1000, "period_ms": 3600000}),
    # a priority for shedding (README "Overload"), an index of PRIORITIES in the spec
    ({**TB, "priority": "critical"},
     '{"match":{},"algorithm":"token_bucket","capacity":20,"refill_per_second":10,'
     '"mode":"enforce","on_failure":"open","key":"client","priority":"critical"}',
     {"algorithm": "token_bucket", "shadow": False, "scope": "client", "priority": 2,
      "capacity": 20, "refill": 10, "period_ms": 1000}),
    ({"algorithm": "fixed_window", "limit": 100, "window_ms": 60000},
     '{"match":{},"algorithm":"fixed_window","limit":100,"window_ms":60000,'
     '"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "fixed_window", "shadow": False, "scope": "client",
      "limit": 100, "window_ms": 60000}),
    ({"window_ms": 4294967295, "limit": 10**15, "algorithm": "sliding_window"},
     '{"match":{},"algorithm":"sliding_window","limit":1000000000000000,'
     '"window_ms":4294967295,"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "sliding_window", "shadow": False, "scope": "client",
      "limit": 10**15, "window_ms": 4294967295}),
    ({"algorithm": "gcra", "burst": 0, "count": 1, "period_ms": 1000},
     '{"match":{},"algorithm":"gcra","burst":0,"count":1,"period_ms":1000,'
     '"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "gcra", "shadow": False, "scope": "client",
      "burst": 0, "count": 1, "period_ms": 1000}),
    ({"algorithm": "concurrency", "limit": 5, "lease_ms": 30000,
      "match": {"resource": "GET /export/*"}},
     '{"match":{"resource":"GET /export/*"},"algorithm":"concurrency","limit":5,'
     '"lease_ms":30000,"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "concurrency", "shadow": False, "scope": "client",
      "limit": 5, "lease_ms": 30000}),
    # Non-ASCII globs stay readable in the canonical document.
    ({"match": {"resource": "GET /café/*"}, **TB},
     '{"match":{"resource":"GET /café/*"},"algorithm":"token_bucket","capacity":20,'
     '"refill_per_second":10,"mode":"enforce","on_failure":"open","key":"client"}',
     {"algorithm": "token_bucket", "shadow": False, "scope": "client",
      "capacity": 20, "refill": 10, "period_ms": 1000}),
]


@pytest.mark.parametrize("doc, canonical, spec", VALID)
def test_valid_documents(doc, canonical, spec):
    rule = parse_rule("r1", doc)
    assert rule.to_json() == canonical
    assert rule.engine_spec() == spec
    # The canonical document reads back as the same rule, as text or bytes.
    assert parse_rule("r1", canonical) == rule
    assert parse_rule("r1", canonical.encode()) == rule


def test_rule_fields():
    rule = parse_rule("orders", {"match": {"resource": "POST /orders", "tier": "free"},
                                 **TB, "mode": "shadow"})
    assert rule.id == "orders"
    assert rule.match == Match(resource="POST /orders", tier="free", client=None)
    assert rule.algorithm == "token_bucket"
    assert rule.params == {"capacity": 20, "refill_per_second": 10}
    assert (rule.mode, rule.shadow, rule.on_failure, rule.scope) == ("shadow", True, "open", "client")
    with pytest.raises(AttributeError):
        rule.mode = "enforce"   # frozen


def test_field_order_does_not_matter():
    a = parse_rule("x", {"refill_per_second": 10, "capacity": 20, "match": {"tier": "t"}})
    b = parse_rule("x", json.dumps({"match": {"tier": "t"}, "capacity": 20,
                                    "refill_per_second": 10}))
    assert a == b and a.to_json() == b.to_json()


def err(field, reason):
    return f"invalid rule 'orders': {field}: {reason}"


INVALID = [
    ({**TB, "priority": "urgent"}, err("priority", "must be 'low' or 'normal' or 'critical'")),
    ({**TB, "priority": 2}, err("priority", "must be 'low' or 'normal' or 'critical'")),
    # numbers
    ({"capacity": 0, "refill_per_second": 1}, err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": 10**15 + 1, "refill_per_second": 1},
     err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": "20", "refill_per_second": 1}, err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": 20.0, "refill_per_second": 1}, err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": True, "refill_per_second": 1}, err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": None, "refill_per_second": 1}, err("capacity", "must be an integer from 1 to 10^15")),
    ({"capacity": 5, "refill_per_second": 0},
     err("refill_per_second", "must be an integer from 1 to 10^15")),
    ({"refill_per_second": 1}, err("capacity", "required")),
    ({}, err("capacity", "required")),
    ({"capacity": 5}, err("refill_per_second", "required (or refill with period_ms)")),
    ({"capacity": 5, "refill": 1}, err("period_ms", "required with refill")),
    ({"capacity": 5, "refill_per_second": 1, "period_ms": 1000},
     err("period_ms", "goes with refill (refill_per_second is per 1000 ms)")),
    ({"capacity": 5, "refill_per_second": 1, "refill": 1, "period_ms": 1000},
     err("refill", "give either refill_per_second, or refill with period_ms, not both")),
    ({"capacity": 5, "refill": 1, "period_ms": 0},
     err("period_ms", "must be an integer from 1 to 4294967295")),
    ({"capacity": 5, "refill": 1, "period_ms": 4294967296},
     err("period_ms", "must be an integer from 1 to 4294967295")),
    # The engine's bound on the time to refill a whole bucket.
    ({"capacity": 10**15, "refill": 1, "period_ms": 1001},
     err("refill", "too slow for the capacity: refilling the whole bucket would take "
                   "more than 10^15 ms")),
    ({"capacity": 10**13, "refill_per_second": 9},
     err("refill_per_second", "too slow for the capacity: refilling the whole bucket "
                              "would take more than 10^15 ms")),
    ({"algorithm": "fixed_window", "limit": 0, "window_ms": 1000},
     err("limit", "must be an integer from 1 to 10^15")),
    ({"algorithm": "fixed_window", "limit": 10}, err("window_ms", "required")),
    ({"algorithm": "sliding_window", "limit": 10, "window_ms": -1},
     err("window_ms", "must be an integer from 1 to 4294967295")),
    ({"algorithm": "gcra", "burst": -1, "count": 1, "period_ms": 1000},
     err("burst", "must be an integer from 0 to 10^9")),
    ({"algorithm": "gcra", "burst": 5, "count": 10**6 + 1, "period_ms": 1000},
     err("count", "must be an integer from 1 to 10^6")),
    ({"algorithm": "gcra", "burst": 10**9, "count": 1, "period_ms": 10**9 + 1},
     err("period_ms", "period_ms * (burst + 1) must be at most 10^18")),
    ({"algorithm": "concurrency", "limit": 1025, "lease_ms": 1000},
     err("limit", "must be an integer from 1 to 1024")),
    ({"algorithm": "concurrency", "limit": 5, "lease_ms": 86400001},
     err("lease_ms", "must be an integer from 1 to 86400000")),
    # enumerations
    ({"algorithm": "leaky_bucket", "capacity": 5},
     err("algorithm", "must be one of token_bucket, fixed_window, sliding_window, gcra, "
                      "concurrency")),
    ({**TB, "mode": "dry-run"}, err("mode", "must be 'enforce' or 'shadow'")),
    ({**TB, "on_failure": "allow"}, err("on_failure", "must be 'open' or 'closed'")),
    ({**TB, "key": "resource"}, err("key", "must be 'client' or 'client+resource'")),
    ({**TB, "mode": None}, err("mode", "must be 'enforce' or 'shadow'")),
    # unknown fields
    ({**TB, "burst": 5},
     err("burst", "unknown field for token_bucket (it takes capacity, refill_per_second, "
                  "refill, period_ms)")),
    ({"algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "capacity": 1},
     err("capacity", "unknown field for fixed_window (it takes limit, window_ms)")),
    ({**TB, "Capacity": 5}, err("Capacity", "unknown field")),
    ({**TB, "bad\nname": 5}, err("bad\\nname", "unknown field")),
    # match
    ({**TB, "match": "POST /orders"}, err("match", "must be an object")),
    ({**TB, "match": None}, err("match", "must be an object")),
    ({**TB, "match": {"path": "/x"}},
     err("match.path", "unknown field (match takes resource, tier, client)")),
    ({**TB, "match": {"resource": ""}},
     err("match.resource", "must be a string of 1 to 1024 characters")),
    ({**TB, "match": {"tier": 1}}, err("match.tier", "must be a string of 1 to 1024 characters")),
    ({**TB, "match": {"client": "x" * 1025}},
     err("match.client", "must be a string of 1 to 1024 characters")),
    # the document itself
    ([TB], "invalid rule 'orders': must be an object"),
    ("[1, 2]", "invalid rule 'orders': must be an object"),
    ('{"capacity": 5,', "invalid rule 'orders': not valid JSON: Expecting property name "
                        "enclosed in double quotes: line 1 column 16 (char 15)"),
    ("", "invalid rule 'orders': not valid JSON: Expecting value: line 1 column 1 (char 0)"),
    ('{"capacity": 5, "capacity": 6, "refill_per_second": 1}',
     "invalid rule 'orders': not valid JSON: duplicate key 'capacity'"),
    ('{"capacity": NaN, "refill_per_second": 1}',
     "invalid rule 'orders': not valid JSON: NaN is not allowed"),
    ('{"capacity": 1e3, "refill_per_second": 1}', err("capacity", "must be an integer from 1 to 10^15")),
    (b'{"capacity": 5, "match": {"tier": "\xff"}}', "invalid rule 'orders': not valid UTF-8"),
    ("{" + " " * 65536 + "}", "invalid rule 'orders': document longer than 65536 bytes"),
]


@pytest.mark.parametrize("doc, message", INVALID)
def test_invalid_documents(doc, message):
    with pytest.raises(RuleError) as e:
        parse_rule("orders", doc)
    assert str(e.value) == message


def test_first_problem_wins_in_a_fixed_order():
    doc = {"algorithm": "gcra", "capacity": 1, "burst": -1, "mode": "x"}
    with pytest.raises(RuleError, match="capacity: unknown field for gcra"):
        parse_rule("orders", doc)


@pytest.mark.parametrize("rule_id", ["a", "orders", "POST:/orders", "api/v1/orders.create",
                                     "A-Z_0.9", "x" * 128])
def test_valid_rule_ids(rule_id):
    assert check_rule_id(rule_id) == rule_id
    assert parse_rule(rule_id, TB).id == rule_id


@pytest.mark.parametrize("rule_id, shown", [
    ("", ""), ("x" * 129, "x" * 64 + "..."), ("a b", "a b"), ("a\nb", "a\\nb"),
    ("caf\u00e9", "caf\\xe9"), ("a,b", "a,b"), ("a=b", "a=b"), ("*", "*"),
])
def test_invalid_rule_ids(rule_id, shown):
    with pytest.raises(RuleError) as e:
        parse_rule(rule_id, TB)
    assert str(e.value) == (f"invalid rule id '{shown}': must be 1 to 128 characters "
                            "of A-Z a-z 0-9 _ . : / -")


def test_errors_are_one_line():
    for doc, _ in INVALID:
        try:
            parse_rule("orders", doc)
        except RuleError as e:
            assert "\n" not in str(e) and "\r" not in str(e)


def test_rules_compare_by_value():
    assert parse_rule("a", TB) == parse_rule("a", dict(TB))
    assert parse_rule("a", TB) != parse_rule("b", TB)
    assert parse_rule("a", TB) != parse_rule("a", {**TB, "mode": "shadow"})
    assert isinstance(hash(parse_rule("a", TB)), int)
    assert isinstance(parse_rule("a", TB), Rule)
