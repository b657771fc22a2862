"""The replication stream's framing and payloads, without processes: a
replica must take frames split anywhere, and refuse (never crash on)
whatever is malformed."""

from __future__ import annotations

import random
import time

import pytest

from fastlimit.replication import stream as rs
from fastlimit.server.snapshot import SnapshotError, Section

SECTION = (b"\x05\x00check" + (20).to_bytes(4, "little") + (1).to_bytes(8, "little")
           + (27).to_bytes(8, "little") + bytes(27))


def stream() -> bytes:
    return (rs.frame(rs.RULES, rs.rules_payload([(1, "r", '{"capacity":1}', "command", 5)]))
            + rs.frame(rs.SNAPSHOT, rs.snapshot_payload(42, b"snapshot bytes"))
            + rs.frame(rs.BATCH, rs.batch_head(1234, {3: 7}), SECTION)
            + rs.frame(rs.BATCH, rs.batch_head(1235, {}))
            + rs.frame(rs.FLUSH))


def test_round_trip_of_every_frame_kind():
    frames = rs.FrameReader().feed(stream())
    assert [kind for kind, _ in frames] == [rs.RULES, rs.SNAPSHOT, rs.BATCH, rs.BATCH, rs.FLUSH]
    assert rs.parse_rules(frames[0][1]) == [(1, "r", '{"capacity":1}', "command", 5)]
    offset, body = rs.parse_snapshot(frames[1][1])
    assert (offset, bytes(body)) == (42, b"snapshot bytes")
    stamp, generations, sections = rs.parse_batch(frames[2][1])
    assert (stamp, generations) == (1234, {3: 7})
    assert [(s.name, s.value_size, s.records, len(s.data)) for s in sections] == [
        (b"check", 20, 1, 27)]
    assert rs.parse_batch(frames[3][1]) == (1235, {}, [])


def test_frames_split_at_every_byte_come_out_the_same():
    data = stream()
    whole = [(k, bytes(p)) for k, p in rs.FrameReader().feed(data)]
    for cut in range(len(data) + 1):
        reader = rs.FrameReader()
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [(k, bytes(p)) for k, p in got] == whole
        assert reader.pending == 0


def test_one_byte_at_a_time():
    reader, got = rs.FrameReader(), []
    for b in stream():
        got += reader.feed(bytes([b]))
    assert len(got) == 5


@pytest.mark.parametrize("data, message", [
    (b"X" + bytes(8), "unknown frame kind"),
    (bytes([rs.BATCH]) + (rs.MAX_FRAME + 1).to_bytes(8, "little"), "over the limit"),
    (bytes([rs.RULES]) + (rs.MAX_FRAME + 1).to_bytes(8, "little"), "over the limit"),
    # a full copy may be large, but not larger than this machine's memory
    (bytes([rs.SNAPSHOT]) + (rs.physical_memory() + 1).to_bytes(8, "little"), "over the limit"),
])
def test_bad_frame_headers_are_refused(data, message):
    with pytest.raises(SnapshotError, match=message):
        rs.FrameReader().feed(data)


@pytest.mark.parametrize("parse, payload", [
    (rs.parse_batch, b"\0" * 11),                                   # shorter than its head
    (rs.parse_batch, (0).to_bytes(8, "little") + (5).to_bytes(4, "little")),  # generations past the end
    (rs.parse_batch, rs.batch_head(1, {}) + SECTION[:-1]),        # section past the end
    (rs.parse_snapshot, b"\0" * 7),
    (rs.parse_rules, b"not json"),
    (rs.parse_rules, b'[[1, "r"]]'),
    (rs.parse_rules, b'[[-1, "r", "{}", "command", 0]]'),
    (rs.parse_rules, b'[["1", "r", "{}", "command", 0]]'),
    (rs.parse_rules, b'[[100000000, "r", "{}", "command", 0]]'),   # past MAX_RULE_NUMBER
])
def test_malformed_payloads_are_refused(parse, payload):
    with pytest.raises(SnapshotError):
        parse(memoryview(payload))


def test_random_bytes_never_raise_anything_but_snapshot_error():
    rng = random.Random(5)
    base = stream()
    for _ in range(2000):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            for kind, payload in rs.FrameReader(max_frame=1 << 20).feed(bytes(data)):
                {rs.RULES: rs.parse_rules, rs.SNAPSHOT: rs.parse_snapshot,
                 rs.BATCH: rs.parse_batch, rs.FLUSH: bytes}[kind](payload)
        except SnapshotError:
            pass


def test_sections_are_what_snapshots_use():
    stamp, _, sections = rs.parse_batch(memoryview(rs.batch_head(1, {}) + SECTION * 2))
    assert all(isinstance(s, Section) for s in sections) and len(sections) == 2


def cpu_to_feed(size: int, chunk: int) -> float:
    """CPU seconds for a reader to take one frame of size bytes, chunk
    bytes at a time."""
    data = rs.frame(rs.BATCH, bytes(size))
    reader, got = rs.FrameReader(), []
    start = time.process_time()
    for pos in range(0, len(data), chunk):
        got += reader.feed(data[pos:pos + chunk])
    spent = time.process_time() - start
    assert len(got) == 1 and reader.pending == 0
    return spent


def test_a_large_frame_fed_in_small_pieces_is_not_rescanned():
    """Each read costs what it adds: a frame 8 times larger takes about 8
    times the CPU (a reader re-copying or re-parsing its buffer per read
    would take 64 times)."""
    small = min(cpu_to_feed(1 << 20, 512) for _ in range(3))
    large = min(cpu_to_feed(8 << 20, 512) for _ in range(3))
    assert large < 24 * max(small, 1e-3), (small, large)
