"""Decision (fastlimit.decision): a frozen value, however it was built."""

from __future__ import annotations

import dataclasses

import pytest

from fastlimit import Decision, Limiter
from fastlimit.decision import make_decision


def test_built_fast_or_slow_it_is_the_same_value():
    slow = Decision(True, 5, 4, 0, 500, "local")
    assert make_decision(True, 5, 4, 0, 500, "local") == slow
    assert Decision.from_reply([1, 5, 4, 0, 500], "local") == slow
    assert hash(make_decision(True, 5, 4, 0, 500, "local")) == hash(slow)


def test_it_is_frozen():
    d = make_decision(True, 5, 4, 0, 500, "local")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.allowed = False
    assert dataclasses.replace(d, allowed=False).allowed is False


def test_allowed_is_a_bool():
    assert Decision.from_reply([0, 5, 0, 500, 2500]).allowed is False
    limiter = Limiter()
    assert limiter.check("k", 1, 1).allowed is True
    assert limiter.check("k", 1, 1).allowed is False


def test_malformed_replies_are_refused():
    with pytest.raises(ValueError):
        Decision.from_reply([1, 2, 3])
    with pytest.raises(TypeError):
        Decision.from_reply(None)
