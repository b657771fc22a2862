"""Numbers reserved by name (the Envoy rate limit service's counters):
never a rule's, stable while held, carried beside the rules' numbers."""

from __future__ import annotations

import pytest

from fastlimit._core import Clock
from fastlimit._rules import RuleEngine
from fastlimit.regions.shares import Regions
from fastlimit.rules.model import RuleError, parse_rule
from fastlimit.rules.registry import SOURCE_RESERVED, RuleRegistry

RULE = {"capacity": 20, "refill_per_second": 10, "match": {"resource": "api:*"}}


@pytest.fixture
def registry():
    reg = RuleRegistry(RuleEngine(clock=Clock(manual=True)))
    reg.start()
    return reg


def test_a_reserved_number_is_never_a_rules_and_is_kept_while_held(registry):
    registry.set("api", RULE)
    num = registry.reserve("@rls/fixed_window/0/60", "fixed_window", "rls")
    assert num != registry.num_for("api")
    assert registry.reserve("@rls/fixed_window/0/60", "fixed_window", "rls") == num
    assert registry.num_for("@rls/fixed_window/0/60") is None    # not a rule to check by id
    assert registry.carried() == {registry.num_for("api"): ("api", "token_bucket", "client"),
                                  num: ("@rls/fixed_window/0/60", "fixed_window", "rls")}
    assert registry.reserved_rows() == [
        (num, "@rls/fixed_window/0/60", "fixed_window", SOURCE_RESERVED, 0)]
    registry.release("@rls/fixed_window/0/60")
    assert num not in registry.carried()
    assert registry.reserve("@rls/fixed_window/0/60", "fixed_window", "rls") != num


def test_every_reservation_change_is_announced(registry):
    seen = []
    registry.on_change = lambda: seen.append(len(registry.reserved_rows()))
    registry.reserve("@rls/gcra/5/60", "gcra", "rls")
    registry.reserve("@rls/gcra/5/60", "gcra", "rls")      # held already: no change
    registry.release("@rls/gcra/5/60")
    registry.release("@rls/gcra/5/60")                      # not held: no change
    assert seen == [1, 0]


def test_no_rule_id_can_take_a_reserved_name():
    with pytest.raises(RuleError, match="invalid rule id"):
        parse_rule("@rls/fixed_window/0/60", RULE)


def test_a_home_allowance_holds_a_reservation_while_its_rule_has_one():
    engine = RuleEngine(clock=Clock(manual=True))
    reg = RuleRegistry(engine, regions=Regions("ap", ("ap", "eu")))
    reg.start()
    home = dict(RULE, regions="home", home="eu")
    reg.set("api", dict(home, home_allowance=4))
    allowance = reg.number_of("@home-allowance:api")
    assert allowance is not None and engine.home_allowing
    assert reg.carried()[allowance] == ("@home-allowance:api", "token_bucket", "home-allowance")
    assert reg.allowances([reg.num_for("api")]) == [allowance]
    # counted whatever the key's home: the allowance is a rule of this region
    assert engine.apply([allowance], b"user:1", 4)[:3] == (1, 4, 0)
    reg.set("api", dict(home, home_allowance=2))             # resized: the same number
    assert reg.number_of("@home-allowance:api") == allowance
    reg.set("other", dict(home, match={"resource": "other"}))
    assert reg.allowances([reg.num_for("api"), reg.num_for("other")]) is None
    reg.set("api", {"match": RULE["match"], "algorithm": "fixed_window", "limit": 10,
                    "window_ms": 1000, "regions": "home", "home_allowance": 1})
    assert reg.number_of("@home-allowance:api") not in (None, allowance)
    reg.set("api", home)
    reg.delete("other")
    assert reg.number_of("@home-allowance:api") is None and not engine.home_allowing
    assert reg.reserved_rows() == []
