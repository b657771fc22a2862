"""Loaded values are range-checked like wire values: a snapshot (or a
replication batch, the same loader) whose checksum is right but whose
records hold values no call could have stored is refused as corrupt with
SnapshotError naming the section, and a value at each bound still loads
and answers within range."""

from __future__ import annotations

import struct

import pytest
from snapshot_files import Side, conc, framed, fw, gcra, header, read_bytes, section, sw, tb

from fastlimit.server import snapshot
from fastlimit.server.snapshot import SnapshotError

MAX_NOW = 4 * 10**12
MAX_CAP_M = 10**15 * 1000
RULES = {1: ("tb", tb(10, 1)), 2: ("fw", fw(10, 1000)), 3: ("sw", sw(10, 1000)),
         4: ("gcra", gcra(5, 10, 1000)), 5: ("lease", conc(2, 1000))}
META = {"created_ms": 0, "rules": {str(n): [rid, spec["algorithm"], spec["scope"]]
                                   for n, (rid, spec) in RULES.items()}}
FAR = 0xFFFFFFFF     # an expiry second that keeps the record live


def record(value: bytes, key: bytes, expire_s=FAR) -> bytes:
    return struct.pack("<IH", expire_s, len(key)) + value + key


def rule_key(num: int, client=b"u") -> bytes:
    return struct.pack("<I", num) + client


def i64s(*values) -> bytes:
    return b"".join(struct.pack("<q", v) for v in values)


def bucket(tokens, last) -> bytes:
    return i64s(tokens, last) + struct.pack("<I", 0)


def crafted(name: bytes, value: bytes, key: bytes) -> bytes:
    return framed(header(META) + section(name, len(value), 1, record(value, key)))


def load(tmp_path, data: bytes) -> Side:
    side = Side(RULES)
    snapshot.restore(read_bytes(tmp_path, data), side.store, side.engine, side.registry)
    return side


BAD = {
    "tokens below zero": (b"check", bucket(-10**18, 0), b"neg"),
    "tokens above any capacity": (b"check", bucket(MAX_CAP_M + 1, 0), b"big"),
    "last before the clock's zero": (b"check", bucket(0, -1), b"k"),
    "last after the clock's end": (b"check", bucket(0, MAX_NOW + 1), b"k"),
    "rule bucket tokens below zero": (b"token_bucket", bucket(-1, 0), rule_key(1)),
    "fixed window count below zero": (b"fixed_window", i64s(-5, 0), rule_key(2)),
    "fixed window count above any limit": (b"fixed_window", i64s(10**15 + 1, 0), rule_key(2)),
    "fixed window start negative": (b"fixed_window", i64s(1, -1000), rule_key(2)),
    "sliding window previous negative": (b"sliding_window", i64s(-1, 0, 0), rule_key(3)),
    "sliding window current too big": (b"sliding_window", i64s(0, 10**15 + 1, 0),
                                       rule_key(3)),
    "gcra count zero": (b"gcra", i64s(0, 0), rule_key(4)),
    "gcra count above the bound": (b"gcra", i64s(0, 10**6 + 1), rule_key(4)),
    "gcra arrival time negative": (b"gcra", i64s(-1, 10), rule_key(4)),
    "gcra arrival time beyond now + tolerance": (
        b"gcra", i64s(MAX_NOW * 10 + 10**18 + 1, 10), rule_key(4)),
    "throttle arrival time that would overflow": (b"throttle", i64s(2**63 - 1, 1), b"t"),
    "lease expiry negative": (b"leases:5", i64s(-1) + b"\0" * 4 + bytes(12), rule_key(5)),
}


@pytest.mark.parametrize("case", list(BAD))
def test_values_no_call_could_store_are_refused_as_corrupt(tmp_path, case):
    name, value, key = BAD[case]
    with pytest.raises(SnapshotError, match=f"section {name!r}: a bucket's value is out of range"):
        load(tmp_path, crafted(name, value, key))


def test_the_check_section_value_size_is_checked(tmp_path):
    data = framed(header(META) + section(b"check", 4, 1, record(b"\0" * 4, b"k")))
    with pytest.raises(SnapshotError, match="section b'check': value size 4, not 20"):
        load(tmp_path, data)


def test_values_at_their_bounds_load_and_answer_in_range(tmp_path):
    side = load(tmp_path, crafted(b"check", bucket(MAX_CAP_M, MAX_NOW), b"hi"))
    assert side.store.check(b"hi", 10**15, 1000, cost=0, now_ms=MAX_NOW)[:3] == (1, 10**15, 10**15)
    side = load(tmp_path, crafted(b"check", bucket(0, 0), b"lo"))
    assert side.store.check(b"lo", 10, 1, cost=0, now_ms=5000) == (1, 10, 5, 0, 5000)
    # the largest arrival time a write can leave (now + tolerance at the
    # clock's end) in ticks of count 1, read with the largest count: the
    # rescaled time is 10^24 ticks, and the waits still fit
    side = load(tmp_path, crafted(b"throttle", i64s(MAX_NOW + 10**18, 1), b"t"))
    limited, limit, remaining, retry_s, reset_s = side.engine.throttle(
        b"t", 0, 10**6, 1, 1, now_ms=0)
    assert (limited, limit, remaining) == (1, 1, 0)
    assert retry_s == reset_s == (MAX_NOW + 10**18) // 1000
