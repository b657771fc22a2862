"""The RLS layer over a real in-process engine with a manual clock."""

from __future__ import annotations

import pytest
from rls_tables import T0_MS

from fastlimit._core import Clock
from fastlimit._rules import RuleEngine
from fastlimit.rls.config import RlsConfig, load_text
from fastlimit.rls.service import RateLimitService
from fastlimit.rules.registry import RuleRegistry


class Rig:
    def __init__(self, *texts: str, headers: bool = False):
        self.clock = Clock(manual=True, start_ms=T0_MS)
        self.engine = RuleEngine(clock=self.clock)
        self.registry = RuleRegistry(self.engine)
        self.service = RateLimitService(self.engine, self.registry, headers)
        self.load(*texts)

    def load(self, *texts: str) -> None:
        domains = {}
        for i, text in enumerate(texts):
            d = load_text(f"f{i}.yaml", text)
            domains[d.name] = d
        self.service.set_config(RlsConfig(domains, ()))

    def call(self, domain: str, *descriptors, hits: int = 0):
        """descriptors: lists of (k, v) str pairs, or (entries, limit, hits)."""
        ds = []
        for d in descriptors:
            if isinstance(d, tuple):
                entries, limit, dhits = d
            else:
                entries, limit, dhits = d, None, None
            ds.append(([(k.encode(), v.encode()) for k, v in entries], limit, dhits))
        return self.service.should_rate_limit(domain.encode(), ds, hits)

    def advance(self, seconds: float) -> None:
        self.clock.advance(int(seconds * 1000))


@pytest.fixture
def rig():
    return Rig
