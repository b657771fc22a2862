"""Fixtures for the rules layer: a recording stand-in for the engine (its
documented contract, nothing more), the real engine when it is built, a
temporary rules database and rules file."""

from __future__ import annotations

import pytest

from fastlimit.rules.registry import RuleRegistry
from fastlimit.rules.store import RuleStore


class FakeEngine:
    """fastlimit._rules.RuleEngine's Python API as the registry uses it:
    define / forget / set_matcher / invalidate / stats / denials.  It
    records what it is told, and refuses a spec when `refuse(num, spec)`
    returns a reason (the engine's ValueError)."""

    def __init__(self):
        self.specs: dict[int, dict] = {}
        self.forgotten: list[int] = []
        self.calls: list[tuple] = []
        self.matcher = None
        self.invalidations = 0
        self.counts: dict[int, dict] = {}
        self.recent: list[tuple] = []
        self.refuse = lambda num, spec: None

    def define(self, num, spec):
        reason = self.refuse(num, spec)
        if reason:
            raise ValueError(reason)
        assert num not in self.forgotten, f"rule number {num} reused after forget"
        if num in self.specs and self.specs[num]["algorithm"] != spec["algorithm"]:
            self.counts.pop(num, None)   # as the engine: counters are per algorithm
        self.specs[num] = dict(spec)
        self.calls.append(("define", num))

    def forget(self, num):
        self.specs.pop(num, None)
        self.forgotten.append(num)
        self.calls.append(("forget", num))

    def set_matcher(self, fn):
        self.matcher = fn

    def invalidate(self):
        self.invalidations += 1
        self.calls.append(("invalidate",))

    def stats(self, num):
        return dict(self.counts.get(num, {"allowed": 0, "denied": 0, "shadow_denied": 0}))

    def denials(self):
        return list(self.recent)

    def live(self) -> dict[int, dict]:
        return dict(self.specs)


@pytest.fixture
def fake_engine():
    return FakeEngine()


@pytest.fixture(name="FakeEngine")
def fake_engine_class():
    """The class, for tests that need a fresh engine per simulated restart."""
    return FakeEngine


@pytest.fixture
def real_engine():
    from fastlimit import Clock
    from fastlimit._rules import RuleEngine
    return RuleEngine(clock=Clock(manual=True), shards=16)


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "rules.db")


@pytest.fixture
def store(db_path):
    s = RuleStore(db_path)
    yield s
    s.close()


class Clockwork:
    """A wall clock for the registry's timestamps that tests move by hand."""

    def __init__(self, ms: int = 1_700_000_000_000):
        self.ms = ms

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


@pytest.fixture
def registry_factory(tmp_path):
    """registry_factory(engine, store=None, rules_file=None) -> started RuleRegistry."""
    made = []

    def make(engine, store=None, rules_file=None, start=True):
        r = RuleRegistry(engine, store, rules_file, now_ms=Clockwork())
        if start:
            r.start()
        made.append(r)
        return r

    return make
