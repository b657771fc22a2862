"""The windowed counters' part of the snapshot format (server/snapshot.py,
_windows.pyx's sections) on an embedded store: a round trip keeps every
kind exactly, a version 1 file (buckets only, before the windowed
counters) still loads, and what no version writes is refused with
SnapshotError."""

from __future__ import annotations

import struct

import pytest
from snapshot_files import Side, T, framed, header, read_bytes, section, tb

from fastlimit._windows import WindowStore
from fastlimit.server import snapshot
from fastlimit.server.snapshot import MAGIC, MAGIC_V1, SnapshotError

WINDOW = 60_000
FIXED = [(b"LIMITS:f:%d" % i, i + 1) for i in range(5)]
SLIDING = [(b"LIMITS:s:%d" % i, i + 1) for i in range(5)]
# a log of one run, and logs of 3, 20 and 300 runs (three size classes)
MOVING = [(b"LIMITS:m:%d" % runs, runs) for runs in (1, 3, 20, 300)]


def spend(w: WindowStore) -> None:
    for key, amount in FIXED:
        w.fixed(key, WINDOW, amount, now_ms=T)
    for key, amount in SLIDING:
        w.sliding(key, 100, WINDOW, amount, now_ms=T - WINDOW)    # the previous window
        w.sliding(key, 100, WINDOW, amount, now_ms=T)
    for key, runs in MOVING:
        for i in range(runs):
            assert w.moving(key, 1000, WINDOW, 2, now_ms=T + i)[0] == 1


def probe(w: WindowStore, at: int) -> list:
    out = [w.fixed(key, WINDOW, 0, now_ms=at) for key, _ in FIXED]
    out += [w.sliding(key, 100, WINDOW, 0, now_ms=at) for key, _ in SLIDING]
    out += [w.moving(key, 1000, WINDOW, 0, now_ms=at) for key, _ in MOVING]
    return out


def with_windows(rules=None) -> Side:
    side = Side(rules or {})
    side.windows = WindowStore(side.clock)
    return side


def write(side: Side, path) -> bytes:
    snapshot.write(str(path), side.store, side.engine, side.numbers(), T, side.windows)
    return path.read_bytes()


def restore(side: Side, path) -> int:
    return snapshot.restore(snapshot.read(str(path)), side.store, side.engine, side.registry,
                            side.windows)


def test_a_round_trip_keeps_every_windowed_counter_exactly(tmp_path):
    before = with_windows({1: ("a", tb(10, 1))})
    spend(before.windows)
    before.store.check(b"k", 10, 1, cost=3, now_ms=T)
    before.engine.apply([1], b"u", cost=4, now_ms=T)
    data = write(before, tmp_path / "s.snap")
    assert data.startswith(MAGIC) and MAGIC.endswith(b"\x02")

    snap = snapshot.read(str(tmp_path / "s.snap"))
    assert snap.version == 2
    windows = {s.name: s.records for s in snap.sections if s.name.startswith(b"windows:")}
    # empty log classes are not written; a log of n runs is in class ceil(log2(n))
    assert windows == {b"windows:fixed": 5, b"windows:sliding": 5, b"windows:log:0": 1,
                       b"windows:log:2": 1, b"windows:log:5": 1, b"windows:log:9": 1}

    after = with_windows({1: ("a", tb(10, 1))})
    assert restore(after, tmp_path / "s.snap") == 2 + len(FIXED) + len(SLIDING) + len(MOVING)
    for at in (T, T + 1, T + 299, T + 30_000, T + WINDOW - 1, T + WINDOW, T + WINDOW + 150,
               T + 2 * WINDOW):
        assert probe(after.windows, at) == probe(before.windows, at), at
    assert after.store.check(b"k", 10, 1, cost=0, now_ms=T)[2] == 7
    # and they go on alike: the exhausted log refuses, the others take more
    for w in (before.windows, after.windows):
        assert w.moving(b"LIMITS:m:300", 600, WINDOW, 1, now_ms=T + 400)[0] == 0
        assert w.fixed(b"LIMITS:f:0", WINDOW, 1, now_ms=T + 5) == [2, T + WINDOW]


def test_a_version_1_snapshot_still_loads(tmp_path):
    # what a server before the windowed counters wrote: the same layout
    # under the version 1 magic, with no windows sections
    old = Side({1: ("a", tb(10, 1))})
    old.store.check(b"k", 10, 1, cost=3, now_ms=T)
    old.engine.apply([1], b"u", cost=4, now_ms=T)
    data = old.write(tmp_path / "new.snap")
    v1 = framed(MAGIC_V1 + data[len(MAGIC):-(4 + len(snapshot.FOOTER))])
    snap = read_bytes(tmp_path, v1, "old.snap")
    assert snap.version == 1
    after = with_windows({1: ("a", tb(10, 1))})
    assert snapshot.restore(snap, after.store, after.engine, after.registry,
                            after.windows) == 2
    assert after.store.check(b"k", 10, 1, cost=0, now_ms=T)[2] == 7
    assert after.engine.apply([1], b"u", cost=0, now_ms=T)[2] == 6
    assert len(after.windows) == 0


def test_a_version_1_file_naming_windowed_counters_is_refused(tmp_path):
    before = with_windows()
    spend(before.windows)
    data = write(before, tmp_path / "s.snap")
    v1 = framed(MAGIC_V1 + data[len(MAGIC):-(4 + len(snapshot.FOOTER))])
    with pytest.raises(SnapshotError, match="version 1"):
        read_bytes(tmp_path, v1, "v1.snap")


def test_a_newer_version_is_refused_by_name(tmp_path):
    before = with_windows()
    data = write(before, tmp_path / "s.snap")
    newer = framed(MAGIC[:-1] + b"\x03" + data[len(MAGIC):-(4 + len(snapshot.FOOTER))])
    with pytest.raises(SnapshotError, match="format version 3: this server reads versions 1 to 2"):
        read_bytes(tmp_path, newer, "v3.snap")


def test_a_store_without_windows_leaves_their_sections_out(tmp_path):
    before = with_windows()
    spend(before.windows)
    before.store.check(b"k", 10, 1, cost=3, now_ms=T)
    write(before, tmp_path / "s.snap")
    plain = Side({})
    assert plain.restore_from(tmp_path / "s.snap") == 1


def _file(name: bytes, value_size: int, records: list[bytes]) -> bytes:
    return framed(header({"created_ms": 0, "rules": {}}) +
                  section(name, value_size, len(records), b"".join(records)))


def record(value: bytes, key: bytes = b"k", expire_s: int = 2_000_000) -> bytes:
    return struct.pack("<IH", expire_s, len(key)) + value + key


def i64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}q", *values)


def log(runs: list[tuple[int, int]], k: int) -> bytes:
    body = struct.pack("<I", len(runs)) + b"".join(i64(t, e) for t, e in runs)
    return body + bytes(4 + 16 * (1 << k) - len(body))


BAD = {
    "fixed-negative-count": (b"windows:fixed", 16, [record(i64(-1, T))]),
    "fixed-expiry-past-any-clock": (b"windows:fixed", 16, [record(i64(1, 2**62))]),
    "fixed-wrong-value-size": (b"windows:fixed", 24, [record(i64(1, T, 0))]),
    "sliding-count-past-any-limit": (b"windows:sliding", 24, [record(i64(1, 0, 10**16))]),
    "sliding-negative-window": (b"windows:sliding", 24, [record(i64(-5, 0, 1))]),
    "log-no-runs": (b"windows:log:1", 36, [record(log([], 1))]),
    "log-more-runs-than-its-class": (b"windows:log:0", 20,
                                     [record(struct.pack("<I", 2) + i64(T, 1))]),
    "log-runs-out-of-order": (b"windows:log:1", 36, [record(log([(T, 1), (T + 5, 1)], 1))]),
    "log-zero-entries": (b"windows:log:1", 36, [record(log([(T, 0)], 1))]),
    "log-entries-past-any-limit": (b"windows:log:1", 36,
                                   [record(log([(T, 10**15), (T - 1, 1)], 1))]),
    "log-class-no-store-has": (b"windows:log:21", 4 + 16 * (1 << 21), []),
    "unknown-kind": (b"windows:tokens", 16, []),
    "records-cut": (b"windows:fixed", 16, [record(i64(1, T))[:-3]]),
}


@pytest.mark.parametrize("name, value_size, records", BAD.values(), ids=BAD.keys())
def test_values_no_call_could_store_are_refused(tmp_path, name, value_size, records):
    after = with_windows()
    try:
        snap = read_bytes(tmp_path, _file(name, value_size, records))
        snapshot.restore(snap, after.store, after.engine, after.registry, after.windows)
    except SnapshotError as e:
        assert "metadata" not in str(e)      # refused for the section, not the header
        return
    raise AssertionError("an unusable snapshot was accepted")


def test_the_good_values_of_those_records_load(tmp_path):
    # the same shapes with values a call stores: the refusals above are
    # for the values, not the shapes
    good = [(b"windows:fixed", 16, [record(i64(3, T + 500))]),
            (b"windows:sliding", 24, [record(i64(T // WINDOW, 2, 3))]),
            (b"windows:log:1", 36, [record(log([(T, 2), (T - 10, 1)], 1))])]
    for name, value_size, records in good:
        after = with_windows()
        snap = read_bytes(tmp_path, _file(name, value_size, records))
        assert snapshot.restore(snap, after.store, after.engine, after.registry,
                                after.windows) == 1
    assert after.windows.moving(b"k", 10, 1000, 0, now_ms=T) == [0, T - 10, 3]
