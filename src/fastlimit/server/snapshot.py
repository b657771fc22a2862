"""Snapshots: every live bucket in one file, so a restart does not hand
every client a fresh burst.

A snapshot is written to a temporary file, fsync'ed, renamed over the old
one and the directory fsync'ed, so a crash leaves the old snapshot or the
new one, never a mix.  Layout (little-endian):

    FLSNAP\\0\\1  <u32 meta length><meta: JSON {"created_ms", "rules"}>
    sections: <u16 name length><name><u32 value size><u64 records><u64 bytes><records>
    <u32 CRC-32 of everything before it>  FLSNAPEND

Records are the engine's packed records (see _core.pxd), with absolute
times, so refill over the downtime is right.  Rule buckets carry their
rule's number; "rules" maps those numbers to rule ids so that a restart,
which numbers rules afresh, finds each bucket's rule (the rules themselves
are durable in the rules database).  Nothing is trusted before the
checksum matches, and every length is bounds-checked after.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass

MAGIC = b"FLSNAP\x00\x01"
FOOTER = b"FLSNAPEND"
_SECTION = struct.Struct("<IQQ")


class SnapshotError(Exception):
    """A snapshot file that cannot be used (truncated, corrupt, foreign)."""


@dataclass
class Section:
    name: bytes
    value_size: int
    records: int
    data: memoryview


@dataclass
class Snapshot:
    created_ms: int
    rules: dict[int, tuple[str, str, str]]     # number -> (id, algorithm, scope)
    sections: list[Section]


def write(path: str, store, engine, rules: dict[int, tuple[str, str, str]],
          now_ms: int) -> None:
    """Writes a snapshot of store and engine to path, atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    meta = json.dumps({"created_ms": now_ms,
                       "rules": {str(n): list(r) for n, r in rules.items()}}).encode()
    head = MAGIC + struct.pack("<I", len(meta)) + meta
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        _write_all(fd, head)
        crc = store.dump(fd, zlib.crc32(head))
        _, crc = engine.dump(fd, crc)
        _write_all(fd, struct.pack("<I", crc) + FOOTER)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> Snapshot:
    """Reads and verifies a snapshot; SnapshotError says what is wrong."""
    with open(path, "rb") as f:
        data = f.read()
    trailer = 4 + len(FOOTER)
    if len(data) < len(MAGIC) + 4 + trailer or not data.startswith(MAGIC):
        raise SnapshotError("not a fastlimit snapshot (bad header)")
    if not data.endswith(FOOTER):
        raise SnapshotError("truncated (no end marker)")
    body = memoryview(data)[:-trailer]
    (stored_crc,) = struct.unpack_from("<I", data, len(data) - trailer)
    if zlib.crc32(body) != stored_crc:
        raise SnapshotError("checksum mismatch: the file is damaged")
    return _parse(body)


def _parse(body: memoryview) -> Snapshot:
    pos = len(MAGIC)
    (meta_len,) = struct.unpack_from("<I", body, pos)
    pos += 4
    if pos + meta_len > len(body):
        raise SnapshotError("metadata runs past the end")
    try:
        meta = json.loads(bytes(body[pos:pos + meta_len]))
        rules = {int(n): (str(r[0]), str(r[1]), str(r[2])) for n, r in meta["rules"].items()}
        created = int(meta["created_ms"])
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise SnapshotError(f"unreadable metadata: {e}") from None
    pos += meta_len
    sections = []
    while pos < len(body):
        if pos + 2 > len(body):
            raise SnapshotError("section header runs past the end")
        (name_len,) = struct.unpack_from("<H", body, pos)
        pos += 2
        if pos + name_len + _SECTION.size > len(body):
            raise SnapshotError("section header runs past the end")
        name = bytes(body[pos:pos + name_len])
        value_size, records, nbytes = _SECTION.unpack_from(body, pos + name_len)
        pos += name_len + _SECTION.size
        if pos + nbytes > len(body):
            raise SnapshotError(f"section {name!r} runs past the end")
        sections.append(Section(name, value_size, records, body[pos:pos + nbytes]))
        pos += nbytes
    return Snapshot(created, rules, sections)


def rule_numbers(registry) -> dict[int, tuple[str, str, str]]:
    """The rules' numbers as a snapshot records them."""
    return {num: (rule.id, rule.algorithm, rule.scope)
            for num, rule in registry.rule_by_num.items()}


def restore(snapshot: Snapshot, store, engine, registry) -> int:
    """Loads a verified snapshot; returns the buckets loaded.  Buckets of
    rules that are gone, or whose algorithm or key scope changed, are left
    out."""
    in_force = rule_numbers(registry)
    by_id = {rule_id: (num, algorithm, scope)
             for num, (rule_id, algorithm, scope) in in_force.items()}
    size = max(snapshot.rules, default=-1) + 1
    renumber: list[int | None] = [None] * size
    for old, (rule_id, algorithm, scope) in snapshot.rules.items():
        now = by_id.get(rule_id)
        if now is not None and now[1:] == (algorithm, scope):
            renumber[old] = now[0]
    before = len(store) + len(engine)
    try:
        for s in snapshot.sections:
            if s.name == b"check":
                store.load(s.data, s.records)
            else:
                engine.load_section(s.name, s.value_size, s.data, s.records, renumber)
    except ValueError as e:
        raise SnapshotError(str(e)) from None
    return len(store) + len(engine) - before


class Snapshots:
    """The server's snapshot file: loaded at start, written by SAVE (in the
    foreground), BGSAVE (by a forked child, so the server keeps answering:
    the fork is the only pause, a copy-on-write page table) and at shutdown."""

    def __init__(self, path: str | None, app, log):
        self.path = path
        self.app = app
        self.log = log
        self.child: int | None = None
        self.last_save_time = int(time.time())
        self.last_status = "ok"
        self.saves = 0

    def load_at_start(self) -> None:
        """Restores the snapshot if there is one.  A damaged file is moved
        aside and the server starts empty: no trust in bad data."""
        if not self.path or not os.path.exists(self.path):
            return
        app = self.app
        try:
            loaded = restore(read(self.path), app.store, app.rule_engine, app.rules)
        except (SnapshotError, OSError) as e:
            app.flush_buckets()
            aside = f"{self.path}.corrupt-{int(time.time() * 1000)}"
            os.replace(self.path, aside)
            self.log.error("snapshot %s is unusable (%s); moved to %s, starting without it",
                           self.path, e, aside)
            return
        self.log.info("loaded %d buckets from snapshot %s", loaded, self.path)

    def save(self) -> None:
        """Writes the snapshot now, blocking (SAVE, shutdown)."""
        if not self.path:
            raise SnapshotError("no snapshot file is configured (snapshot-file)")
        app = self.app
        write(self.path, app.store, app.rule_engine, rule_numbers(app.rules), app.clock.now())
        self._saved("ok")

    def background_save(self) -> bool:
        """Starts BGSAVE; False when one is already running."""
        if not self.path:
            raise SnapshotError("no snapshot file is configured (snapshot-file)")
        if self.child is not None:
            return False
        app = self.app
        numbers, now = rule_numbers(app.rules), app.clock.now()
        pid = os.fork()
        if pid == 0:    # the child: write and leave, touching nothing else
            status = 1
            try:
                write(self.path, app.store, app.rule_engine, numbers, now)
                status = 0
            finally:
                os._exit(status)
        self.child = pid
        self.log.info("background saving started by pid %d", pid)
        return True

    def poll(self) -> None:
        """Reaps a finished BGSAVE child (called from the server's tick)."""
        if self.child is None:
            return
        pid, status = os.waitpid(self.child, os.WNOHANG)
        if pid == 0:
            return
        self.child = None
        ok = os.waitstatus_to_exitcode(status) == 0
        self._saved("ok" if ok else "err")
        (self.log.info if ok else self.log.error)(
            "background saving %s", "terminated with success" if ok else "failed")

    def due(self, every_s: int) -> bool:
        return bool(self.path) and every_s > 0 and self.child is None and \
            time.time() - self.last_save_time >= every_s

    def _saved(self, status: str) -> None:
        self.last_status = status
        if status == "ok":
            self.last_save_time = int(time.time())
            self.saves += 1
