"""Decision (fastlimit.decision): an immutable value, however it was built."""

from __future__ import annotations

import pickle

import pytest

from fastlimit import Decision, Limiter


def test_built_in_c_or_in_python_it_is_the_same_value():
    made = Decision(True, 5, 4, 0, 500, "local")
    assert Limiter().check("k", 5, 2) == made
    assert Decision.from_reply([1, 5, 4, 0, 500], "local") == made
    assert hash(Limiter().check("k", 5, 2)) == hash(made)
    assert made != Decision(True, 5, 4, 0, 500, "server")
    assert repr(made) == ("Decision(allowed=True, limit=5, remaining=4, retry_after_ms=0, "
                          "reset_after_ms=500, source='local')")
    assert pickle.loads(pickle.dumps(made)) == made


def test_it_is_immutable():
    d = Decision(True, 5, 4, 0, 500, "local")
    with pytest.raises(AttributeError):
        d.allowed = False
    assert d.replace(allowed=False).allowed is False
    assert d.allowed is True


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
