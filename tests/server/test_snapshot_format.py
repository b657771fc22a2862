"""fastlimit.server.snapshot on its own: write, read and restore with an
embedded BucketStore and RuleEngine and a stand-in for the rule registry
(anything with ``rule_by_num``: {number: object with .id, .algorithm,
.scope}).

* a round trip keeps every kind of bucket (CL.CHECK's, each algorithm's,
  CL.THROTTLE's, concurrency leases) exactly: the same replies at the same
  times, before and after;
* the layout is the documented one and the CRC is zlib.crc32 of
  everything before the footer;
* every truncation and every single-byte change of a small snapshot is
  refused with SnapshotError, never another exception;
* a file whose checksum is right but whose contents are not a snapshot
  this version can use (another version's, a crafted one) is refused
  with SnapshotError too, never another exception, and in bounded memory;
* restoring maps the snapshot's rule numbers to the registry's through
  rule ids, and leaves out the buckets of rules that are gone or whose
  algorithm or key scope changed.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

import pytest
from snapshot_files import Side, T, conc, framed, fw, gcra, header, read_bytes, section, sw, tb

from fastlimit.server import snapshot
from fastlimit.server.snapshot import FOOTER, MAGIC, SnapshotError

TRAILER = 4 + len(FOOTER)
LEASE = 1 << 16        # a lease id is (generation << 16) | slot

RULES = {1: ("tb", tb(10, 3, 1000)),
         2: ("fw", fw(10, 60_000)),
         3: ("sw", sw(10, 60_000)),
         4: ("gcra", gcra(5, 10, 60_000)),
         5: ("tb-slow", tb(7, 2, 3_000)),
         6: ("lease", conc(3, 60_000))}
CHECK_KEYS = [(b"k", 10, 1), (b"\x00bin\xff", 5, 2), (b"long" * 300, 100, 7)]
CLIENTS = [b"u1", b"u2", b"\xff\x00"]


def spend(side: Side) -> list[int]:
    """Spends a little of every kind of bucket at T; returns the lease ids."""
    for i, (key, cap, rate) in enumerate(CHECK_KEYS):
        assert side.store.check(key, cap, rate, cost=i + 2, now_ms=T)[0] == 1
    for i, client in enumerate(CLIENTS):
        for num in (1, 2, 3, 4, 5):
            assert side.engine.apply([num], client, cost=i + 1, now_ms=T)[0] == 1
    assert side.engine.throttle(b"thr", 15, 30, 60, 4, now_ms=T)[0] == 0
    return [side.engine.acquire(6, b"u1", now_ms=T + n)[4] for n in range(2)]


def probe(side: Side, at_ms: int) -> list:
    """Every bucket's state at at_ms, spending nothing."""
    out = [side.store.check(key, cap, rate, cost=0, now_ms=at_ms)
           for key, cap, rate in CHECK_KEYS]
    out += [side.engine.apply([num], client, cost=0, now_ms=at_ms)
            for client in CLIENTS for num in (1, 2, 3, 4, 5)]
    out.append(side.engine.throttle(b"thr", 15, 30, 60, 0, now_ms=at_ms))
    return out


def small_snapshot(tmp_path) -> bytes:
    """A few buckets: CL.CHECK's, one rule's, CL.THROTTLE's and a lease."""
    side = Side({1: ("a", tb(10, 1)), 2: ("l", conc(2, 5000))})
    side.store.check(b"k", 10, 1, cost=3, now_ms=T)
    side.engine.apply([1], b"u", cost=4, now_ms=T)
    side.engine.throttle(b"t", 5, 10, 60, 2, now_ms=T)
    side.engine.acquire(2, b"u", now_ms=T)
    return side.write(tmp_path / "small.snap")


# ---- round trip -----------------------------------------------------------------------------

def test_round_trip_keeps_every_bucket_exactly(tmp_path):
    before = Side(RULES)
    leases = spend(before)
    assert leases == [1 * LEASE + 0, 2 * LEASE + 1]
    count = len(before)
    assert count == len(CHECK_KEYS) + len(CLIENTS) * 5 + 1 + 1
    before.write(tmp_path / "s.snap", now_ms=T + 123)
    assert sorted(os.listdir(tmp_path)) == ["s.snap"]      # no temporary file left

    snap = snapshot.read(str(tmp_path / "s.snap"))
    assert snap.created_ms == T + 123
    assert snap.rules == {num: (rule_id, spec["algorithm"], spec["scope"])
                          for num, (rule_id, spec) in RULES.items()}
    assert [(s.name, s.records) for s in snap.sections] == [
        (b"check", 3), (b"token_bucket", 6), (b"fixed_window", 3), (b"sliding_window", 3),
        (b"gcra", 3), (b"throttle", 1), (b"leases:6", 1)]

    after = Side(RULES)
    assert snapshot.restore(snap, after.store, after.engine, after.registry) == count
    assert len(after) == count
    for at in (T, T + 1, T + 999, T + 2_500, T + 59_999, T + 60_000, T + 3_600_000):
        assert probe(after, at) == probe(before, at), at
    # the leases: both held, the third slot free, each releasable once
    assert after.engine.acquire(6, b"u1", now_ms=T + 5)[:4] == (1, 3, 0, 0)
    assert after.engine.acquire(6, b"u1", now_ms=T + 6)[:4] == (0, 3, 0, 60_000 - 6)
    for lease_id in leases:
        assert after.engine.release(6, b"u1", lease_id, now_ms=T + 7) is True
        assert after.engine.release(6, b"u1", lease_id, now_ms=T + 7) is False


def test_an_empty_server_round_trips(tmp_path):
    before = Side({})
    data = before.write(tmp_path / "e.snap")
    after = Side({})
    assert after.restore_from(tmp_path / "e.snap") == 0
    assert len(after) == 0
    snap = snapshot.read(str(tmp_path / "e.snap"))
    assert snap.rules == {}
    assert [s.records for s in snap.sections] == [0] * 6
    assert data.startswith(MAGIC) and data.endswith(FOOTER)


def test_restore_adds_to_what_is_there_and_replaces_the_same_keys(tmp_path):
    before = Side({})
    before.store.check(b"a", 10, 1, cost=4, now_ms=T)
    before.write(tmp_path / "s.snap")
    after = Side({})
    after.store.check(b"a", 10, 1, cost=1, now_ms=T)
    after.store.check(b"b", 10, 1, cost=1, now_ms=T)
    assert after.restore_from(tmp_path / "s.snap") == 0     # "a" replaced, not added
    assert after.store.check(b"a", 10, 1, cost=0, now_ms=T) == (1, 10, 6, 0, 4000)
    assert after.store.check(b"b", 10, 1, cost=0, now_ms=T) == (1, 10, 9, 0, 1000)


def test_the_write_is_atomic_and_a_failed_one_keeps_the_old_snapshot(tmp_path):
    path = tmp_path / "s.snap"
    good = Side({})
    good.store.check(b"k", 10, 1, cost=1, now_ms=T)
    old = good.write(path)

    class Failing:
        def dump(self, fd, crc):
            os.write(fd, b"partial")
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        snapshot.write(str(path), Failing(), good.engine, {}, T)
    assert sorted(os.listdir(tmp_path)) == ["s.snap"]
    assert path.read_bytes() == old
    with pytest.raises(FileNotFoundError):
        snapshot.write(str(tmp_path / "missing" / "s.snap"), good.store, good.engine, {}, T)


# ---- the layout and the checksum -----------------------------------------------------------

def test_layout_and_crc(tmp_path):
    data = small_snapshot(tmp_path)
    assert data.startswith(MAGIC) and data.endswith(FOOTER)
    body, (crc,) = data[:-TRAILER], struct.unpack("<I", data[-TRAILER:-len(FOOTER)])
    assert crc == zlib.crc32(body)
    # the documented layout, parsed here independently of read()
    pos = len(MAGIC)
    (meta_len,) = struct.unpack_from("<I", body, pos)
    meta = json.loads(body[pos + 4:pos + 4 + meta_len])
    assert meta["created_ms"] == T
    assert meta["rules"] == {"1": ["a", "token_bucket", "client"],
                             "2": ["l", "concurrency", "client"]}
    pos += 4 + meta_len
    sections = {}
    while pos < len(body):
        (name_len,) = struct.unpack_from("<H", body, pos)
        name = body[pos + 2:pos + 2 + name_len]
        value_size, records, nbytes = struct.unpack_from("<IQQ", body, pos + 2 + name_len)
        pos += 2 + name_len + 20 + nbytes
        sections[name] = (value_size, records)
    assert pos == len(body)
    assert sections == {b"check": (20, 1), b"token_bucket": (20, 1), b"fixed_window": (16, 0),
                        b"sliding_window": (24, 0), b"gcra": (16, 0), b"throttle": (16, 1),
                        b"leases:2": (24, 1)}


def test_a_checksum_that_does_not_match_is_refused(tmp_path):
    data = small_snapshot(tmp_path)
    body = data[:-TRAILER]
    wrong = struct.pack("<I", zlib.crc32(body) ^ 1)
    with pytest.raises(SnapshotError, match="checksum"):
        read_bytes(tmp_path, body + wrong + FOOTER)
    # and recomputing it over a changed body makes the file readable again
    assert read_bytes(tmp_path, framed(body)).created_ms == T


# ---- damage -------------------------------------------------------------------------------------

def test_every_truncation_is_refused(tmp_path):
    data = small_snapshot(tmp_path)
    assert 200 < len(data) < 2000
    for n in range(len(data)):
        with pytest.raises(SnapshotError):
            read_bytes(tmp_path, data[:n])


def test_every_single_byte_change_is_refused(tmp_path):
    data = small_snapshot(tmp_path)
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[i] ^= mask
            with pytest.raises(SnapshotError):
                read_bytes(tmp_path, bytes(damaged))


@pytest.mark.parametrize("extra", [b"\x00", b"FLSNAPEND", b"x" * 100])
def test_bytes_after_the_footer_are_refused(tmp_path, extra):
    with pytest.raises(SnapshotError):
        read_bytes(tmp_path, small_snapshot(tmp_path) + extra)


@pytest.mark.parametrize("data", [b"", b"FLSNAP", MAGIC, MAGIC + FOOTER,
                                  b"REDIS0011" + bytes(100), os.urandom(4096),
                                  MAGIC + os.urandom(200) + FOOTER],
                         ids=["empty", "short", "magic", "magic+footer", "rdb", "random",
                              "random-framed"])
def test_foreign_files_are_refused(tmp_path, data):
    with pytest.raises(SnapshotError):
        read_bytes(tmp_path, data)


# Right checksum, contents this version cannot use (another version's file,
# or a crafted one): SnapshotError from read or restore, nothing else.
NO_RULES = {"created_ms": 0, "rules": {}}
CONC_ROW = ["l", "concurrency", "client"]
CRAFTED = {
    "meta-not-json": header(b"{not json"),
    "meta-bad-utf8": header(b"\xff\xfe"),
    "meta-a-list": header([1, 2]),
    "meta-no-rules": header({"created_ms": 0}),
    "rules-a-list": header({"created_ms": 0, "rules": []}),
    "rule-entry-short": header({"created_ms": 0, "rules": {"1": ["a"]}}),
    "rule-number-not-a-number": header({"created_ms": 0, "rules": {"x": CONC_ROW}}),
    "rule-number-negative": header({"created_ms": 0, "rules": {"-1": CONC_ROW}}),
    "created-nan": header(b'{"created_ms": NaN, "rules": {}}'),
    "created-infinite": header(b'{"created_ms": Infinity, "rules": {}}'),
    "meta-runs-past-the-end": MAGIC + struct.pack("<I", 10**6) + b"{}",
    "section-header-cut": header(NO_RULES) + b"\x05\x00che",
    "section-runs-past-the-end": (header(NO_RULES) + section(b"check", 20, 1, b"")[:-8] +
                                  struct.pack("<Q", 10**6)),
    "records-fewer-than-said": header(NO_RULES) + section(b"check", 20, 5, b"abc"),
    "records-more-than-said": header(NO_RULES) + section(b"check", 20, 0, b"abc"),
    "lease-section-not-a-number": header(NO_RULES) + section(b"leases:abc", 24, 0, b""),
    "lease-section-negative": header(NO_RULES) + section(b"leases:-1", 24, 0, b""),
    "lease-section-past-u32": header(NO_RULES) + section(b"leases:4294967296", 24, 0, b""),
}


@pytest.mark.parametrize("body", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_checksummed_file_with_unusable_contents_is_refused(tmp_path, body):
    after = Side({1: ("l", conc(1, 5000))})
    try:
        after.restore_from(_write(tmp_path, framed(body)))
    except SnapshotError:
        return
    except Exception as e:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{type(e).__name__} instead of SnapshotError: {e}") from None
    raise AssertionError("an unusable snapshot was accepted")


HUGE_NUMBER_SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from types import SimpleNamespace as NS
from fastlimit._core import BucketStore, Clock
from fastlimit._rules import RuleEngine
from fastlimit.server import snapshot
clock = Clock(manual=True)
engine = RuleEngine(clock=clock, shards=4)
engine.define(1, {"algorithm": "concurrency", "limit": 1, "lease_ms": 5000,
                  "shadow": False, "scope": "client"})
registry = NS(carried=lambda: {1: ("l", "concurrency", "client")})
try:
    n = snapshot.restore(snapshot.read(sys.argv[1]), BucketStore(shards=4, clock=clock),
                         engine, registry)
    print("restored", n)
except snapshot.SnapshotError as e:
    print("SnapshotError", e)
"""


def test_a_huge_rule_number_costs_no_huge_allocation(tmp_path):
    # Rule numbers are u32 and this one is in range; its id is in force, so
    # restore must either use it or refuse the file, in bounded memory
    # (the child process is limited to 1 GiB of address space).
    body = header({"created_ms": 0, "rules": {"4294967295": CONC_ROW}}) + section(
        b"leases:4294967295", 12, 0, b"")
    path = _write(tmp_path, framed(body))
    run = subprocess.run([sys.executable, "-c", HUGE_NUMBER_SCRIPT, str(path)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(("restored", "SnapshotError")), run.stdout


def _write(tmp_path, data: bytes):
    path = tmp_path / "crafted.snap"
    path.write_bytes(data)
    return path


# ---- rule numbers ------------------------------------------------------------------------------

OLD = {1: ("a", tb(10, 1)),
       2: ("b", tb(10, 1)),
       3: ("gone", tb(10, 1)),
       4: ("changed", tb(10, 1)),
       5: ("scoped", tb(10, 1)),
       6: ("lease", conc(2, 60_000)),
       7: ("lease-resized", conc(2, 60_000))}
# New numbers, deliberately reusing old ones for other rules: "b" now has
# the number "gone" had, "lease" the one "a" had.
NEW = {6: ("a", tb(10, 1)),
       3: ("b", tb(10, 1)),
       1: ("lease", conc(2, 60_000)),
       2: ("changed", fw(10, 60_000)),
       4: ("scoped", tb(10, 1, scope="client+resource")),
       5: ("lease-resized", conc(3, 60_000))}


def test_rule_numbers_are_mapped_through_ids(tmp_path):
    before = Side(OLD)
    for num, cost in ((1, 1), (2, 2), (3, 3), (4, 4), (5, 5)):
        assert before.engine.apply([num], b"u", cost=cost, now_ms=T)[2] == 10 - cost
    lease = before.engine.acquire(6, b"u", now_ms=T)[4]
    before.engine.acquire(7, b"u", now_ms=T)
    before.engine.throttle(b"thr", 15, 30, 60, 4, now_ms=T)
    before.store.check(b"k", 10, 1, cost=6, now_ms=T)
    before.write(tmp_path / "s.snap")

    after = Side(NEW)
    # a, b, the lease, CL.THROTTLE's and CL.CHECK's; nothing of "gone",
    # "changed" (its algorithm changed), "scoped" (its key scope changed)
    # or "lease-resized" (its limit changed, so its slots mean something else)
    assert after.restore_from(tmp_path / "s.snap") == 5
    assert len(after) == 5

    def remaining(num, **kw):
        return after.engine.apply([num], b"u", cost=0, now_ms=T, **kw)[2]

    assert remaining(6) == 9                      # a, was 1
    assert remaining(3) == 8                      # b, was 2 (3 was "gone"'s number)
    assert remaining(2) == 10                     # changed: fresh
    assert remaining(4, resource=b"") == 10       # scoped: fresh
    assert after.engine.acquire(1, b"u", now_ms=T)[:4] == (1, 2, 0, 0)    # one was held
    assert after.engine.acquire(1, b"u", now_ms=T)[:4] == (0, 2, 0, 60_000)
    assert after.engine.release(1, b"u", lease, now_ms=T) is True
    assert after.engine.acquire(5, b"u", now_ms=T)[:3] == (1, 3, 2)     # fresh
    assert after.engine.throttle(b"thr", 15, 30, 60, 0, now_ms=T) == \
        before.engine.throttle(b"thr", 15, 30, 60, 0, now_ms=T)
    assert after.store.check(b"k", 10, 1, cost=0, now_ms=T)[2] == 4


def test_buckets_of_numbers_the_snapshot_does_not_name_are_dropped(tmp_path):
    # Buckets of a rule retired before the save (its number is in no
    # snapshot "rules" entry) are never attached to anything.
    before = Side(OLD)
    before.engine.apply([1], b"u", cost=4, now_ms=T)
    before.engine.apply([2], b"u", cost=2, now_ms=T)
    snapshot.write(str(tmp_path / "s.snap"), before.store, before.engine,
                   {2: ("b", "token_bucket", "client")}, T)
    after = Side({1: ("b", tb(10, 1)), 2: ("a", tb(10, 1))})
    assert after.restore_from(tmp_path / "s.snap") == 1
    assert after.engine.apply([1], b"u", cost=0, now_ms=T)[2] == 8
    assert after.engine.apply([2], b"u", cost=0, now_ms=T)[2] == 10


def test_lease_ids_are_not_given_again_after_a_restore(tmp_path):
    rules = {1: ("lease", conc(1, 60_000))}
    before = Side(rules)
    first = before.engine.acquire(1, b"u", now_ms=T)[4]
    assert before.engine.release(1, b"u", first, now_ms=T) is True
    second = before.engine.acquire(1, b"u", now_ms=T)[4]
    assert (first, second) == (1 * LEASE, 2 * LEASE)
    before.write(tmp_path / "s.snap")

    after = Side(rules)
    after.restore_from(tmp_path / "s.snap")
    assert after.engine.release(1, b"u", first, now_ms=T) is False
    assert after.engine.release(1, b"u", second, now_ms=T) is True
    third = after.engine.acquire(1, b"u", now_ms=T)[4]
    assert third not in (first, second)
    # the first holder's release, repeated, must free nothing
    assert after.engine.release(1, b"u", first, now_ms=T) is False
