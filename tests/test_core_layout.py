"""The arena's packed layout against the wire form (_core.pxd).

In memory a record is narrower than on the wire: a one-byte key length
(a u16 after the value for keys of 255 bytes or more) and a token
bucket's 20-byte value in 17.  Snapshots, replication batches, slot
migrations and takeovers carry the wire form, which did not change with
the layout: a record written by hand in that form loads, and dumps back
byte for byte.  Manual clock throughout.
"""

from __future__ import annotations

import struct
import tempfile

import pytest

from fastlimit._core import BucketStore, Clock
from fastlimit._rules import RuleEngine
from fastlimit.server.snapshot import parse_sections

MAX_CAPACITY = 10**15
MAX_NOW_MS = 4 * 10**12
TOKEN_BUCKET = {"algorithm": "token_bucket", "capacity": 100, "refill": 10,
                "period_ms": 1000, "scope": "client"}


def dumped(dump) -> list:
    """The sections a store's dump(fd) writes, read by the snapshot parser
    (through an unlinked file: a pipe would fill before it is read)."""
    with tempfile.TemporaryFile() as f:
        dump(f.fileno())
        f.seek(0)
        return parse_sections(memoryview(f.read()))


def wire_record(key: bytes, expire_s: int, tokens_m: int, last_ms: int, fraction: int) -> bytes:
    """A "check" record as the format has always had it."""
    return struct.pack("<IHqqI", expire_s, len(key), tokens_m, last_ms, fraction) + key


def store_at(ms: int) -> BucketStore:
    return BucketStore(shards=4, clock=Clock(manual=True, start_ms=ms))


@pytest.mark.parametrize("keylen", [0, 1, 17, 254, 255, 256, 4096, 65535])
def test_keys_of_every_length_round_trip(keylen):
    a = store_at(5_000)
    keys = [bytes([65 + i]) * keylen if keylen else b"" for i in range(3 if keylen else 1)]
    for k in keys:
        a.check(k, 10, 1, cost=3)
    (section,) = dumped(a.dump)
    assert (section.name, section.value_size, section.records) == (b"check", 20, len(keys))
    assert len(section.data) == len(keys) * (6 + 20 + keylen)    # the header's byte count
    b = store_at(5_000)
    b.load(section.data, section.records)
    assert [b.check(k, 10, 1, cost=0) for k in keys] == [(1, 10, 7, 0, 3000)] * len(keys)
    again = dumped(b.dump)[0]      # in slot order, which the seed decides
    assert sorted(wire_split(bytes(again.data))) == sorted(wire_split(bytes(section.data)))


def test_a_hand_written_wire_record_loads_and_dumps_back_byte_for_byte():
    # 2.5 tokens left at t=10 s of a bucket of 10 refilling 1 a second,
    # with a remainder: what the format has always carried, field by field
    records = [wire_record(b"user:7", 18, 2_500, 10_000, 1 << 31),
               wire_record(b"x" * 300, 4_000_000_000, MAX_CAPACITY * 1000 - 1, MAX_NOW_MS, 2**32 - 1)]
    data = b"".join(records)
    store = store_at(10_000)
    store.load(memoryview(data), 2)
    assert store.check(b"user:7", 10, 1, cost=0)[:3] == (1, 10, 2)
    (section,) = dumped(store.dump)
    assert sorted(wire_split(bytes(section.data))) == sorted(records)


def wire_split(data: bytes, value_size: int = 20) -> list:
    """The records of a section's data."""
    out, pos = [], 0
    while pos < len(data):
        (keylen,) = struct.unpack_from("<H", data, pos + 4)
        out.append(data[pos:pos + 6 + value_size + keylen])
        pos += 6 + value_size + keylen
    return out


def test_a_drained_change_is_in_the_wire_form():
    a = store_at(1_000_000)
    a.track_changes(1 << 20)
    a.check(b"k" * 255, 10, 1, cost=4)
    (section,) = parse_sections(memoryview(b"".join(a.drain_changes())))
    ((record),) = wire_split(bytes(section.data))
    expire_s, keylen, tokens, last, fraction = struct.unpack_from("<IHqqI", record)
    assert (keylen, tokens, last, fraction) == (255, 6_000, 1_000_000, 0)
    assert record[26:] == b"k" * 255


def test_rule_buckets_round_trip_in_the_wire_form():
    clock = Clock(manual=True, start_ms=50_000)
    engines = [RuleEngine(clock=clock, shards=4) for _ in range(2)]
    for e in engines:
        e.define(0, TOKEN_BUCKET)
    for n in (1, 254, 255, 300):
        engines[0].apply([0], b"c" * n, cost=n % 7 + 1)
    sections = dumped(engines[0].dump)
    bucket = [s for s in sections if s.name == b"token_bucket"]
    assert bucket and bucket[0].value_size == 20 and bucket[0].records == 4
    renumber = [0]
    for s in sections:
        engines[1].load_section(s.name, s.value_size, s.data, s.records, renumber)
    assert [sorted(wire_split(bytes(s.data), s.value_size)) for s in dumped(engines[1].dump)] \
        == [sorted(wire_split(bytes(s.data), s.value_size)) for s in sections]


@pytest.mark.release_only       # a million traced checks took 94 s of the debug pass
def test_a_million_keys_of_17_bytes_take_at_most_48_bytes_each():
    # the issue's figure, exact: the tables' own count of their bytes
    store = BucketStore(clock=Clock(manual=True, start_ms=10**9))
    for i in range(1_000_000):
        store.check(b"key:%013d" % i, 100, 10)
    assert len(store) == 1_000_000
    assert store.memory_bytes / len(store) <= 48
