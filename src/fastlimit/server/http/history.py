"""What the status page shows of the past: a bounded history of the
server's totals, so a page opened during an incident shows what led to
it (``GET /v1/stats?since=<ms>``).

Two rings of samples, each sample the cumulative totals at one time (the
reader takes differences, as the page does with its own polls):

    seconds   one sample a second, the last SECONDS (10 minutes)
    minutes   the first sample of each minute, the last MINUTES (24 hours)

A sample is (time ms, commands run, and over every rule: allowed, denied,
shadow-denied).  The rings are preallocated arrays, so their memory is
fixed (``INFO memory``: ``status_history_bytes``) whatever the traffic.
Summing the rules' counters costs some microseconds a rule, so it is
spread over the ticks, at most SUM_PER_TICK rules a tick: with more rules
than a second of ticks covers, a sample is taken once the pass over them
ends (every few seconds), never as one long pause of the loop.
"""

from __future__ import annotations

import time
from array import array

from fastlimit.rules.registry import STAT_FIELDS
from fastlimit.server.subsystem import Subsystem

SECONDS = 600
MINUTES = 1440
FIELDS = ("time_ms", "commands", *STAT_FIELDS)
SUM_PER_TICK = 500        # rules summed per tick (hz: 10 a second by default)


class Ring:
    """The last `size` samples of len(FIELDS) integers, in one array."""

    def __init__(self, size: int):
        self.size = size
        self.data = array("q", bytes(8 * size * len(FIELDS)))
        self.count = 0            # samples ever added
        self.last_time = -1

    def add(self, sample: tuple[int, ...]) -> None:
        at = (self.count % self.size) * len(FIELDS)
        self.data[at:at + len(FIELDS)] = array("q", sample)
        self.count += 1
        self.last_time = sample[0]

    def since(self, since_ms: int) -> list[list[int]]:
        """The samples taken after since_ms, oldest first."""
        n = min(self.count, self.size)
        out = []
        for i in range(self.count - n, self.count):
            at = (i % self.size) * len(FIELDS)
            if self.data[at] > since_ms:
                out.append(self.data[at:at + len(FIELDS)].tolist())
        return out

    @property
    def memory_bytes(self) -> int:
        return self.data.itemsize * len(self.data)


class StatusHistory(Subsystem):
    def __init__(self, server):
        self.server = server
        self.seconds = Ring(SECONDS)
        self.minutes = Ring(MINUTES)
        self._pending: list[str] | None = None     # rule ids left to sum in this pass
        self._sums = dict.fromkeys(STAT_FIELDS, 0)
        self._due = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if self._pending is None:
            if now < self._due:
                return
            self._due = now + 1.0
            self._pending = list(self.server.rules.num_by_id)     # ids, unsorted: O(n)
            self._sums = dict.fromkeys(STAT_FIELDS, 0)
        registry = self.server.rules
        batch, self._pending = self._pending[:SUM_PER_TICK], self._pending[SUM_PER_TICK:]
        for rule_id in batch:
            counts = registry.stats(rule_id)
            if counts is not None:        # deleted meanwhile: its counts went with it
                for name in STAT_FIELDS:
                    self._sums[name] += counts[name]
        if not self._pending:
            self._pending = None
            self.record(int(time.time() * 1000))

    def record(self, time_ms: int) -> None:
        sample = (time_ms, self.server.core.total_commands,
                  *(self._sums[name] for name in STAT_FIELDS))
        self.seconds.add(sample)
        if self.minutes.last_time < 0 or time_ms // 60_000 != self.minutes.last_time // 60_000:
            self.minutes.add(sample)

    def since(self, since_ms: int) -> dict:
        """The samples after since_ms, as /v1/stats?since= shows them."""
        return {"fields": list(FIELDS), "seconds": self.seconds.since(since_ms),
                "minutes": self.minutes.since(since_ms)}

    @property
    def memory_bytes(self) -> int:
        return self.seconds.memory_bytes + self.minutes.memory_bytes

    def info_sections(self, sections, named):
        if "memory" not in sections:
            return {}
        return {"memory": {"status_history_bytes": self.memory_bytes}}
