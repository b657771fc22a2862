"""The replication stream's format: framing and payloads, no I/O.

After a replica's ``CL.SYNC`` is answered with ``+FULLSYNC <replid>
<offset>``, the primary sends frames ``<u8 kind><u64 length><payload>``:

    R  rules: JSON [[number, id, rule JSON, source, updated_ms], ...], the
       whole rule set (sent at sync and after every change of rules)
    S  full copy: <u64 stream offset><a snapshot file's bytes> (snapshot.py);
       it replaces every bucket the replica has
    B  batch: <i64 stamp ms><u32 n>{<u32 rule number><u32 lease generation>}*n
       then snapshot sections whose records are the current states of the
       keys written since the previous batch; a record with expiry second 0
       is a tombstone (the key is gone).  The stamp is the wall time of the
       batch's oldest change, so `now - stamp` bounds the lag of every change
       in it.
       A batch without sections is a heartbeat.
    F  every bucket was removed (FLUSHALL)

Records are states with absolute times, never commands: applying a batch
twice, or an older state after a newer full copy, changes nothing a later
batch does not set right.  The offset counts the bytes of every frame sent
after the full copies, as Redis's replication offset does.
"""

from __future__ import annotations

import json
import os
import struct
import time

from fastlimit.server.snapshot import MAX_RULE_NUMBER, Section, SnapshotError, parse_sections

FRAME = struct.Struct("<BQ")
RULES, SNAPSHOT, BATCH, FLUSH = b"RSBF"
KINDS = {RULES, SNAPSHOT, BATCH, FLUSH}
_BATCH_HEAD = struct.Struct("<qI")
_GENERATION = struct.Struct("<II")
_OFFSET = struct.Struct("<Q")

# A frame longer than this is not believed: the replica drops the link.
# A batch or the rules fit well within it; a full copy may be as large as
# the primary's memory, so it is bounded by this machine's.
MAX_FRAME = 1 << 30


def wall_ms() -> int:
    """A batch's stamp: the primary's wall clock, which its replicas' lag
    is measured against."""
    return time.time_ns() // 1_000_000


def physical_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def frame(kind: int, *parts: bytes | memoryview) -> bytes:
    """One frame whose payload is the parts, joined in one copy."""
    return b"".join([FRAME.pack(kind, sum(map(len, parts))), *parts])


def rules_payload(numbered_rows) -> bytes:
    """numbered_rows: (number, id, rule JSON, source, updated_ms)."""
    return json.dumps([list(row) for row in numbered_rows]).encode()


def parse_rules(payload: memoryview) -> list[tuple[int, str, str, str, int]]:
    try:
        rows = json.loads(bytes(payload))
        out = []
        for num, rule_id, doc, source, updated_ms in rows:
            if not all(type(x) is int for x in (num, updated_ms)) or not all(
                    isinstance(x, str) for x in (rule_id, doc, source)) or not (
                    0 <= num <= MAX_RULE_NUMBER):
                raise ValueError(f"bad rule row {rule_id!r}")
            out.append((num, rule_id, doc, source, updated_ms))
        return out
    except (ValueError, TypeError) as e:
        raise SnapshotError(f"unreadable rules frame: {e}") from None


def snapshot_payload(offset: int, snapshot: bytes) -> bytes:
    return _OFFSET.pack(offset) + snapshot


def parse_snapshot(payload: memoryview) -> tuple[int, memoryview]:
    if len(payload) < _OFFSET.size:
        raise SnapshotError("full copy frame too short")
    return _OFFSET.unpack_from(payload)[0], payload[_OFFSET.size:]


def batch_head(stamp_ms: int, generations: dict[int, int]) -> bytes:
    """A batch's payload up to its sections, which follow it."""
    return _BATCH_HEAD.pack(stamp_ms, len(generations)) + b"".join(
        _GENERATION.pack(n, g) for n, g in generations.items())


def parse_batch(payload: memoryview) -> tuple[int, dict[int, int], list[Section]]:
    """(stamp ms, lease generations, sections); SnapshotError if malformed."""
    if len(payload) < _BATCH_HEAD.size:
        raise SnapshotError("batch frame too short")
    stamp, n = _BATCH_HEAD.unpack_from(payload)
    pos = _BATCH_HEAD.size
    if n > (len(payload) - pos) // _GENERATION.size:
        raise SnapshotError("batch frame: lease generations run past the end")
    generations = dict(_GENERATION.iter_unpack(payload[pos:pos + n * _GENERATION.size]))
    return stamp, generations, parse_sections(payload, pos + n * _GENERATION.size)


class FrameReader:
    """Splits a byte stream into frames; feed() returns the complete ones
    as (kind, payload) and keeps the rest."""

    def __init__(self, max_frame: int = MAX_FRAME, max_full_copy: int | None = None):
        self.buf = bytearray()
        self.limits = {kind: max_frame for kind in KINDS}
        self.limits[SNAPSHOT] = (max_full_copy if max_full_copy is not None
                                 else max(max_frame, physical_memory()))

    def feed(self, data: bytes) -> list[tuple[int, memoryview]]:
        self.buf += data
        frames, pos, view = [], 0, memoryview(self.buf)
        try:
            while len(view) - pos >= FRAME.size:
                kind, length = FRAME.unpack_from(view, pos)
                if kind not in KINDS:
                    raise SnapshotError(f"unknown frame kind {kind!r}")
                if length > self.limits[kind]:
                    raise SnapshotError(f"frame of {length} bytes is over the limit")
                if len(view) - pos - FRAME.size < length:
                    break
                start = pos + FRAME.size
                frames.append((kind, bytes(view[start:start + length])))
                pos = start + length
        finally:
            view.release()
        if pos:
            del self.buf[:pos]
        return [(kind, memoryview(payload)) for kind, payload in frames]

    @property
    def pending(self) -> int:
        return len(self.buf)

    @property
    def next_frame_size(self) -> int | None:
        """The size, header included, of the frame being read, once its
        header is in; None before."""
        if len(self.buf) < FRAME.size:
            return None
        return FRAME.size + FRAME.unpack_from(self.buf)[1]
