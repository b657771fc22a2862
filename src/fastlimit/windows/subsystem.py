"""The owner of the windowed counters' store: emptied by FLUSHALL, swept
by server/expiry.py with the buckets, shown in INFO memory and keyspace."""

from __future__ import annotations

from fastlimit._windows import WindowStore
from fastlimit.server.subsystem import Subsystem


class WindowsSubsystem(Subsystem):
    def __init__(self, clock):
        self.store = WindowStore(clock)

    def flush(self) -> None:
        self.store.flush()

    def info_sections(self, sections, named):
        if "memory" not in sections:
            return {}
        return {"memory": {"windows_keys": len(self.store),
                           "windows_memory_bytes": self.store.memory_bytes}}
