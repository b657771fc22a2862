"""What the registry acknowledges it can enforce: a change is all or nothing
whatever fails, strings are what the store can hold, no request can match
more rules than the engine evaluates, and a change costs what it changes."""

from __future__ import annotations

import fnmatch
import gc
import itertools
import json
import random

import pytest

from fastlimit.rules import matching
from fastlimit.rules.matching import MatchIndex, compile_row, crowding
from fastlimit.rules.model import MAX_RULES_PER_REQUEST, RuleError, parse_rule
from fastlimit.rules.store import StoreError

TB = {"capacity": 20, "refill_per_second": 10}


def tb(resource=None, **match):
    if resource is not None:
        match["resource"] = resource
    return {"match": match, **TB}


@pytest.fixture
def reg(fake_engine, store, registry_factory):
    return registry_factory(fake_engine, store)


@pytest.fixture
def mem_reg(fake_engine, registry_factory):
    """Without a database: no fsync per change in tests that make many."""
    return registry_factory(fake_engine, None)


def matched(reg, resource: bytes, tier: bytes | None = None) -> list[str]:
    return [reg.rule_id(num) for num, _ in reg.matcher(resource, tier)]


# ---- strings the store can hold ------------------------------------------------------

@pytest.mark.parametrize("field", ["resource", "tier", "client"])
def test_a_match_string_must_be_valid_utf8(field):
    with pytest.raises(RuleError) as e:
        parse_rule("x", json.dumps({"match": {field: "a\ud800"}, **TB}))
    assert str(e.value) == f"invalid rule 'x': match.{field}: not valid UTF-8"


def test_deep_json_nesting_is_a_clear_error():
    gc.collect()    # as below
    for doc in ("[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000):
        with pytest.raises(RuleError) as e:
            parse_rule("deep", doc)
        assert str(e.value) == "invalid rule 'deep': not valid JSON: nested too deeply"


@pytest.mark.parametrize("name,text,kind", [
    ("r.toml", "x = " + "[" * 3000 + "]" * 3000, "TOML"),
    ("r.json", '{"rules":' + "[" * 5000 + "]" * 5000 + "}", "JSON")])
def test_a_deeply_nested_rules_file_is_a_clear_error(reg, tmp_path, name, text, kind):
    # Earlier tests' garbage collected in the middle of the parser's deep
    # recursion would run its finalizers there, at the recursion limit.
    gc.collect()
    path = tmp_path / name
    path.write_text(text)
    reg.rules_file = str(path)
    with pytest.raises(RuleError) as e:
        reg.reload()
    assert str(e.value) == f"rules file {path} is not valid {kind}: nested too deeply"


# ---- all or nothing, whatever fails ------------------------------------------------------

def test_an_unexpected_engine_failure_changes_nothing(reg, fake_engine, monkeypatch):
    reg.set("a", tb("GET /a"))
    before = dict(fake_engine.specs)
    define = fake_engine.define

    def broken(num, spec):
        if spec.get("capacity") == 3:
            raise OverflowError("the engine broke")
        define(num, spec)
    monkeypatch.setattr(fake_engine, "define", broken)
    with pytest.raises(RuleError) as e:
        reg.set("a", {**tb("GET /b"), "capacity": 3})
    assert "the rules in force are unchanged" in str(e.value)
    assert fake_engine.specs == before
    assert reg.get("a").match.resource == "GET /a"
    assert matched(reg, b"GET /a") == ["a"] and matched(reg, b"GET /b") == []


def test_an_unexpected_store_failure_changes_nothing(reg, fake_engine, store, monkeypatch):
    reg.set("a", tb("GET /a"))
    before = dict(fake_engine.specs)

    def broken(**kwargs):
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    monkeypatch.setattr(store, "write", broken)
    with pytest.raises(RuleError):
        reg.set("a", {**tb("GET /b"), "capacity": 3})
    with pytest.raises(RuleError):
        reg.set("new", tb("GET /new"))
    assert fake_engine.specs == before
    assert reg.get("a").params["capacity"] == 20 and reg.get("new") is None
    assert matched(reg, b"GET /a") == ["a"] and matched(reg, b"GET /new") == []


def test_a_store_that_cannot_hold_a_row_refuses_with_store_error(store):
    rule = parse_rule("a", tb("GET /a"))
    object.__setattr__(rule, "match", type(rule.match)(resource="\ud800"))
    with pytest.raises(StoreError):
        store.put(rule, "command")
    assert store.load() == []


def test_without_a_database_a_refused_rule_leaves_later_changes_working(
        fake_engine, registry_factory):
    reg = registry_factory(fake_engine, None)
    with pytest.raises(RuleError):
        reg.set("s", json.dumps({"match": {"client": "\ud800*"}, **TB}))
    assert reg.list() == []
    reg.set("other", tb("GET /o"))
    assert matched(reg, b"GET /o") == ["other"]


# ---- no request matches more rules than the engine evaluates ----------------------------

def test_64_overlapping_rules_are_accepted_and_a_65th_refused(mem_reg, fake_engine):
    for i in range(MAX_RULES_PER_REQUEST):
        mem_reg.set(f"m{i:02}", tb("GET /*"))
    specs = dict(fake_engine.specs)
    with pytest.raises(RuleError) as e:
        mem_reg.set("m64", tb("GET /*"))
    assert str(e.value) == (
        "invalid rule 'm64': 65 rules could match one request (resource 'GET /...'), and a "
        "request is checked against at most 64: narrow the match of this rule or of the "
        "rules it overlaps")
    assert mem_reg.get("m64") is None and fake_engine.specs == specs
    assert len(matched(mem_reg, b"GET /x")) == 64
    with pytest.raises(RuleError):      # one matching a subset of them counts too
        mem_reg.set("m64", tb("GET /x"))
    mem_reg.set("m64", tb("POST /x"))       # disjoint: fine
    mem_reg.set("m00", tb("GET /*"))        # replacing one of the 64 is no 65th


def test_disjoint_rules_beyond_64_are_accepted(mem_reg):
    for i in range(MAX_RULES_PER_REQUEST - 2):
        mem_reg.set(f"all{i}", tb("GET /*"))
    mem_reg.set("star", tb("*"))
    for i in range(300):
        mem_reg.set(f"thing{i}", tb(f"GET /api/v1/thing{i}/*"))
        mem_reg.set(f"exact{i}", tb(f"GET /exact/{i}"))
    assert len(matched(mem_reg, b"GET /api/v1/thing7/x")) == 64
    with pytest.raises(RuleError):
        mem_reg.set("one-too-many", tb("GET /api/v1/thing7/*"))


def test_rules_of_different_tiers_or_clients_are_not_counted_together(mem_reg):
    for i in range(100):
        mem_reg.set(f"tier{i}", tb("GET /*", tier=f"plan{i}"))
        mem_reg.set(f"cust{i}", tb("GET /*", client=f"cust:{i}"))
    for i in range(MAX_RULES_PER_REQUEST - 3):
        mem_reg.set(f"any{i}", tb("*"))
    mem_reg.set("free-any-client", tb("*", tier="plan1"))
    with pytest.raises(RuleError):      # plan1 + cust:1 + the 61 would be 65
        mem_reg.set("cust1-too", tb("*", client="cust:1*"))


def test_concurrency_rules_do_not_count(mem_reg):
    for i in range(MAX_RULES_PER_REQUEST):
        mem_reg.set(f"m{i}", tb("GET /*"))
    mem_reg.set("leases", {"match": {"resource": "GET /*"}, "algorithm": "concurrency",
                       "limit": 2, "lease_ms": 1000})


def test_a_reload_that_would_crowd_a_request_changes_nothing(reg, tmp_path):
    path = tmp_path / "rules.json"
    rules = {f"r{i}": tb("GET /*") for i in range(MAX_RULES_PER_REQUEST + 1)}
    path.write_text(json.dumps({"rules": rules}))
    reg.rules_file = str(path)
    reg.set("mine", tb("POST /x"))
    with pytest.raises(RuleError) as e:
        reg.reload()
    assert "65 rules could match one request" in str(e.value)
    assert [r.id for r in reg.list()] == ["mine"]


GLOB_PARTS = ["a", "b", "*", "?", "ab", "[ab]"]


def random_glob(rng: random.Random) -> str | None:
    if rng.random() < 0.15:
        return None
    return "".join(rng.choice(GLOB_PARTS) for _ in range(rng.randrange(1, 4)))


@pytest.mark.parametrize("seed", range(40))
def test_the_crowding_check_never_misses_a_crowded_request(seed):
    """Against brute force over every short request: when the check passes,
    no request matches more than the limit; and for rules of literal and
    '<prefix>*' globs only, it is exact."""
    rng = random.Random(seed)
    limit = 3
    simple = seed % 2 == 0
    rules = []
    for i in range(rng.randrange(2, 9)):
        match = {}
        for field in ("resource", "client"):
            glob = random_glob(rng)
            if simple and glob is not None:
                literal = glob.replace("?", "").replace("[ab]", "a").split("*")[0]
                glob = literal + rng.choice(["", "*"]) if literal else "*"
            if glob is not None:
                match[field] = glob
        if rng.random() < 0.4:
            match["tier"] = rng.choice(["t1", "t2"])
        rules.append(parse_rule(f"r{i}", {"match": match, **TB}))
    rows = [compile_row(rule, i) for i, rule in enumerate(rules)]
    strings = [""] + ["".join(p) for n in range(1, 7) for p in itertools.product("ab", repeat=n)]

    def matching(glob):
        return {text for text in strings if glob is None or fnmatch.fnmatchcase(text, glob)}
    views = [(rule.match.tier, matching(rule.match.resource), matching(rule.match.client))
             for rule in rules]
    worst = max(sum(1 for rule_tier, resources, clients in views
                    if (rule_tier is None or rule_tier == tier)
                    and resource in resources and client in clients)
                for resource, client, tier in itertools.product(strings, strings,
                                                                [None, "t1", "t2"]))
    found = crowding(rows, {rule.id for rule in rules}, limit)
    if found is None:
        assert worst <= limit
    if simple:
        assert (found is not None) == (worst > limit)


# ---- a change costs what it changes ------------------------------------------------------

def test_a_rule_change_compiles_only_the_changed_rule(mem_reg, monkeypatch):
    for i in range(2000):
        mem_reg.set(f"r{i}", tb(f"GET /api/v1/thing{i}/*/detail"))
    compiled = []
    real = matching.compile_glob
    monkeypatch.setattr(matching, "compile_glob", lambda g: compiled.append(g) or real(g))
    mem_reg.set("new", tb("GET /api/v1/new/*/detail"))
    mem_reg.delete("r5")
    mem_reg.set("r6", tb("GET /api/v1/other/*/detail"))
    assert compiled == [b"GET /api/v1/new/*/detail", b"GET /api/v1/other/*/detail"]
    assert matched(mem_reg, b"GET /api/v1/new/7/detail") == ["new"]
    assert matched(mem_reg, b"GET /api/v1/thing6/7/detail") == []


def test_a_lookup_runs_globs_only_of_rules_whose_prefix_fits():
    index = MatchIndex()
    index.update([], [compile_row(parse_rule(f"r{i}", tb(f"GET /api/v1/thing{i}/*/x")), i)
                      for i in range(5000)])
    index.update([], [compile_row(parse_rule("all", tb("GET /*")), 5000)])
    candidates = index.candidates(b"GET /api/v1/thing42/a/x")
    assert sorted(row.rule_id for row in candidates) == ["all", "r42"]
    assert [row.rule_id for row in index.lookup(b"GET /api/v1/thing42/a/x", None)] == [
        "all", "r42"]
    assert [row.rule_id for row in index.lookup(b"GET /api/v1/thing42/a/y", None)] == ["all"]
    index.update(["r42"], [])
    assert [row.rule_id for row in index.lookup(b"GET /api/v1/thing42/a/x", None)] == ["all"]
    assert [row.rule_id for row in index.lookup(b"GET /api/v1/thing43/a/x", None)] == [
        "all", "r43"]


def test_the_index_keeps_its_keys_sorted_through_small_and_large_batches():
    index = MatchIndex()
    rng = random.Random(7)
    live = {}
    for step in range(60):
        size = rng.choice([1, 2, 200])
        removes = rng.sample(sorted(live), min(len(live), rng.randrange(0, size + 1)))
        adds = []
        for _ in range(size):
            glob = rng.choice(["a", "ab", "abc", "b", "ba"]) + rng.choice(["", "*", "?x", "*y"])
            rule_id = f"r{step}-{len(adds)}"
            adds.append(compile_row(parse_rule(rule_id, tb(glob)), len(live) + len(adds)))
            live[rule_id] = glob
        for rule_id in removes:
            del live[rule_id]
        index.update(removes, adds)
        assert index._keys == sorted(set(index._cones) | set(index._points))
        for text in ["a", "ab", "abc", "abcy", "ba?x", "bax", "b"]:
            assert {row.rule_id for row in index.lookup(text.encode(), None)} == {
                rule_id for rule_id, glob in live.items() if fnmatch.fnmatchcase(text, glob)}
