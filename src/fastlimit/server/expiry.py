"""The sweep that forgets idle buckets, a tick's worth of budget at a
time, as Redis's active expiry (expire.c) does: when a tick finds much of
what it scanned expired, the next one gets a larger budget."""

from __future__ import annotations

from fastlimit.server.subsystem import Subsystem

# When a sweep tick finds this share of what it scanned already expired,
# the next tick gets the larger budget.
BUSY_SWEEP_SHARE = 0.10
BUSY_SWEEP_FACTOR = 25


class Expiry(Subsystem):
    def __init__(self, tables):
        self.tables = tables      # each has sweep(budget_ms) -> (removed, scanned)
        self.base_budget_ms = 1.0
        self.budget_ms = 1.0
        self.runs = 0

    def apply_settings(self, settings) -> None:
        self.base_budget_ms = self.budget_ms = settings.sweep_budget_ms

    def tick(self) -> None:
        removed = scanned = 0
        for table in self.tables:
            r, s = table.sweep(budget_ms=self.budget_ms)
            removed, scanned = removed + r, scanned + s
        self.runs += 1
        busy = scanned and removed / scanned >= BUSY_SWEEP_SHARE
        self.budget_ms = self.base_budget_ms * (BUSY_SWEEP_FACTOR if busy else 1)

    def info_sections(self, sections, named):
        return {"stats": {"sweep_runs": self.runs, "sweep_last_budget_ms": self.budget_ms}}
