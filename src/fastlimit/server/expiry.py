"""The sweep that forgets idle buckets, a tick's worth of budget at a
time, as Redis's active expiry (expire.c) does: when a tick finds much of
what it scanned expired, the next one gets a larger budget.  Unlike
Redis's, a tick's budget is spent in slices of at most SLICE_MS, one per
loop turn, so a check waits behind at most one slice of it; and while the
node sheds load (overload/, level 1 or 2) the budget does not grow: the
checks come first, the idle buckets wait."""

from __future__ import annotations

import asyncio

from fastlimit.server.subsystem import Subsystem

# When a sweep tick finds this share of what it scanned already expired,
# the next tick gets the larger budget.
BUSY_SWEEP_SHARE = 0.10
BUSY_SWEEP_FACTOR = 25
SLICE_MS = 0.25


class Expiry(Subsystem):
    def __init__(self, tables, meter):
        self.tables = tables      # each has sweep(budget_ms) -> (removed, scanned)
        self.meter = meter        # the saturation meter (_load.LoadMeter)
        self.base_budget_ms = 1.0
        self.budget_ms = 1.0
        self.runs = 0
        self._left_ms = 0.0       # of the tick being swept; 0: none is
        self._removed = self._scanned = 0

    def apply_settings(self, settings) -> None:
        self.base_budget_ms = self.budget_ms = settings.sweep_budget_ms

    def tick(self) -> None:
        if self._left_ms > 0:
            return                # the last tick's slices still run
        self._left_ms = self.budget_ms
        self._removed = self._scanned = 0
        self.sweep_slice()

    def sweep_slice(self) -> None:
        step = min(self._left_ms, SLICE_MS)
        for table in self.tables:
            r, s = table.sweep(budget_ms=step)
            self._removed, self._scanned = self._removed + r, self._scanned + s
        self._left_ms = max(0.0, self._left_ms - step)
        if self._left_ms > 0:
            asyncio.get_running_loop().call_soon(self.sweep_slice)
            return
        self.runs += 1
        busy = self._scanned and self._removed / self._scanned >= BUSY_SWEEP_SHARE
        grow = busy and not self.meter.level
        self.budget_ms = self.base_budget_ms * (BUSY_SWEEP_FACTOR if grow else 1)

    def info_sections(self, sections, named):
        return {"stats": {"sweep_runs": self.runs, "sweep_last_budget_ms": self.budget_ms}}
