"""The registry's side of a shared store (RuleRegistry.apply_stored and
vet), without a database: rows as the table holds them, each applied all
or nothing, a row that does not validate left out and named, versions
that say whether anything changed, and a writer's check that takes no
engine number."""

from __future__ import annotations

import json

import pytest

from fastlimit.rules.model import MAX_RULES_PER_REQUEST, RuleError, parse_rule
from fastlimit.rules.registry import parse_stored


def doc(capacity: int, resource: str = "api/*") -> str:
    return json.dumps({"match": {"resource": resource}, "capacity": capacity,
                       "refill_per_second": 1})


def row(rule_id, text, version, source="sql"):
    return (rule_id, parse_stored(rule_id, text), version, source, 1_000)


@pytest.fixture
def reg(fake_engine, store, registry_factory):
    return registry_factory(fake_engine, store)


CASES = [
    # (rows already applied, rows now, capacity in force after (None: absent), rejected ids)
    ([], [("a", doc(3), 5)], 3, []),
    ([("a", doc(3), 5)], [("a", doc(4), 7)], 4, []),
    ([("a", doc(3), 5)], [("a", doc(4), 5)], 3, []),          # the same version: nothing
    ([("a", doc(3), 5)], [("a", None, 0)], None, []),           # gone from the table
    ([], [("a", None, 0)], None, []),                           # gone, and never here
    ([("a", doc(3), 5)], [("a", '{"capacity": 0}', 9)], 3, ["a"]),   # keeps the one in force
    ([], [("a", '{"capacity": "x"}', 9)], None, ["a"]),
    ([], [("bad id!", doc(3), 2)], None, ["bad id!"]),          # an id no rule may have
    ([], [("a", "not json", 2)], None, ["a"]),
]


@pytest.mark.parametrize(("before", "now", "capacity", "rejected"), CASES)
def test_apply_stored(reg, before, now, capacity, rejected):
    assert reg.apply_stored([row(*r) for r in before]) == []
    refused = reg.apply_stored([row(*r) for r in now])
    assert [rule_id for rule_id, _, _ in refused] == rejected
    rule = reg.get("a")
    assert (json.loads(rule.document)["capacity"] if rule else None) == capacity


def test_a_row_applied_is_kept_with_its_version_and_source_in_the_cache(reg, store):
    reg.apply_stored([row("a", doc(3), 41, "command")])
    entry = reg.entry("a")
    assert (entry.version, entry.source) == (41, "command")
    assert [(s.rule.id, s.version, s.source) for s in store.load()] == [("a", 41, "command")]


def test_one_row_the_batch_cannot_take_keeps_no_other_out(reg):
    crowd = [row(f"c{i}", doc(2, "x/*"), i + 1) for i in range(MAX_RULES_PER_REQUEST + 1)]
    refused = reg.apply_stored([row("fine", doc(3, "y/*"), 100), *crowd])
    assert reg.get("fine") is not None
    assert len(refused) == 1 and "rules could match one request" in refused[0][2]
    assert len(reg) == MAX_RULES_PER_REQUEST + 1


def test_vet_refuses_what_the_batch_would_refuse_and_changes_and_takes_nothing(reg, fake_engine):
    reg.apply_stored([row(f"c{i}", doc(2, "x/*"), i + 1)
                      for i in range(MAX_RULES_PER_REQUEST)])
    calls = list(fake_engine.calls)
    next_number = reg._next_num
    reg.vet([parse_rule("other", doc(2, "y/*"))])
    with pytest.raises(RuleError, match="rules could match one request"):
        reg.vet([parse_rule("one-more", doc(2, "x/*"))])
    assert fake_engine.calls == calls and reg._next_num == next_number
    assert reg.get("one-more") is None and len(reg) == MAX_RULES_PER_REQUEST
    assert [num for num, _ in reg.matcher(b"x/1", None)] == \
        [reg.num_for(f"c{i}") for i in sorted(range(MAX_RULES_PER_REQUEST), key=str)]
