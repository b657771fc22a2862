"""maxmemory: the bound on the bucket tables and its policy (the work is
in C, _core.pyx's MemoryBound: a command adding a bucket past the bound
evicts or is refused there).  This subsystem attaches the stores' tables
to the bound while maxmemory is set (with none they pay nothing), brings
the tables back under a lowered bound a tick at a time, and reports the
figures INFO memory shows."""

from __future__ import annotations

from fastlimit._core import MemoryBound
from fastlimit.server.config import MAXMEMORY_POLICIES
from fastlimit.server.subsystem import Subsystem

# While the tables are over the bound (it was lowered), each tick evicts
# for this share of the tick's interval.
EVICT_TICK_SHARE = 0.25


class MaxMemory(Subsystem):
    def __init__(self, server):
        self.server = server
        self.bound = MemoryBound()
        self.attached = False
        self.budget_ms = 0.0
        self.peak = 0

    def apply_settings(self, settings) -> None:
        self.bound.configure(settings.maxmemory,
                             MAXMEMORY_POLICIES[settings.maxmemory_policy],
                             settings.maxmemory_samples)
        self.budget_ms = 1000 / settings.hz * EVICT_TICK_SHARE
        on = settings.maxmemory > 0
        if on != self.attached:
            bound = self.bound if on else None
            for store in self.server.stores:
                store.set_bound(bound)
            self.attached = on

    def tick(self) -> None:
        # A standby keeps what its primary keeps: it applies the primary's
        # evictions (tombstones in the stream) and makes none of its own.
        if self.attached and not self.server.core.readonly:
            self.bound.evict(self.server.clock.now(), self.budget_ms)

    def cron(self) -> None:
        self.used_memory()

    def counted(self) -> int:
        """Bytes compared with maxmemory: every store's tables (the
        buckets', the rules', the windowed counters')."""
        return self.bound.used if self.attached else sum(
            store.memory_bytes for store in self.server.stores)

    def used_memory(self) -> int:
        """INFO's used_memory: the tables and the clients' buffers (which,
        as Redis's replica buffers, are not counted for eviction)."""
        used = self.counted() + self.not_counted()
        self.peak = max(self.peak, used)
        return used

    def not_counted(self) -> int:
        return sum(c.input_memory + c.output_buffer_len
                   for c in self.server.core.clients.values())

    @property
    def evicted(self) -> int:
        return self.bound.evicted
