"""Snapshot files made and read by hand, for the tests of the format
(tests/server/test_snapshot_format.py) and of the values a loader takes
(tests/server/test_snapshot_values.py): rule specs of each algorithm, an
embedded store and engine with a registry stand-in, and a body framed
with its checksum."""

from __future__ import annotations

import json
import struct
import zlib
from types import SimpleNamespace

from fastlimit._core import BucketStore, Clock
from fastlimit._rules import RuleEngine
from fastlimit.server import snapshot
from fastlimit.server.snapshot import FOOTER, MAGIC

T = 1_000_000          # the time the buckets are spent at, in ms


def tb(capacity, refill, period_ms=1000, scope="client"):
    return {"algorithm": "token_bucket", "capacity": capacity, "refill": refill,
            "period_ms": period_ms, "shadow": False, "scope": scope}


def fw(limit, window_ms):
    return {"algorithm": "fixed_window", "limit": limit, "window_ms": window_ms,
            "shadow": False, "scope": "client"}


def sw(limit, window_ms):
    return {"algorithm": "sliding_window", "limit": limit, "window_ms": window_ms,
            "shadow": False, "scope": "client"}


def gcra(burst, count, period_ms):
    return {"algorithm": "gcra", "burst": burst, "count": count, "period_ms": period_ms,
            "shadow": False, "scope": "client"}


def conc(limit, lease_ms):
    return {"algorithm": "concurrency", "limit": limit, "lease_ms": lease_ms,
            "shadow": False, "scope": "client"}


class Side:
    """A store, an engine and the registry stand-in for a set of rules
    {number: (id, spec)}."""

    def __init__(self, rules: dict[int, tuple[str, dict]]):
        self.clock = Clock(manual=True)
        self.store = BucketStore(shards=4, clock=self.clock)
        self.engine = RuleEngine(clock=self.clock, shards=4)
        self.rules = rules
        for num, (_, spec) in rules.items():
            self.engine.define(num, spec)
        carried = {num: (rule_id, spec["algorithm"], spec["scope"])
                   for num, (rule_id, spec) in rules.items()}
        self.registry = SimpleNamespace(carried=lambda: carried)

    def numbers(self) -> dict[int, tuple[str, str, str]]:
        return snapshot.rule_numbers(self.registry)

    def write(self, path, now_ms=T) -> bytes:
        snapshot.write(str(path), self.store, self.engine, self.numbers(), now_ms)
        with open(path, "rb") as f:
            return f.read()

    def restore_from(self, path) -> int:
        return snapshot.restore(snapshot.read(str(path)), self.store, self.engine,
                                self.registry)

    def __len__(self):
        return len(self.store) + len(self.engine)


def framed(body: bytes) -> bytes:
    """A body with a correct checksum and the end marker."""
    return body + struct.pack("<I", zlib.crc32(body)) + FOOTER


def header(meta) -> bytes:
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw


def section(name: bytes, value_size: int, records: int, data: bytes) -> bytes:
    return (struct.pack("<H", len(name)) + name +
            struct.pack("<IQQ", value_size, records, len(data)) + data)


def read_bytes(tmp_path, data: bytes, name="x.snap") -> snapshot.Snapshot:
    path = tmp_path / name
    path.write_bytes(data)
    return snapshot.read(str(path))
