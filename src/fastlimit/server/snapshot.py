"""Snapshots: every live bucket in one file, so a restart does not hand
every client a fresh burst.

A snapshot is written to a temporary file, fsync'ed, renamed over the old
one and the directory fsync'ed, so a crash leaves the old snapshot or the
new one, never a mix.  Layout (little-endian):

    FLSNAP\\0\\2  <u32 meta length><meta: JSON {"created_ms", "rules"}>
    sections: <u16 name length><name><u32 value size><u64 records><u64 bytes><records>
    <u32 CRC-32 of everything before it>  FLSNAPEND

The magic's last byte is the format's version.  Version 2 added the
windowed counters' sections ("windows:fixed", "windows:sliding",
"windows:log:<k>": _windows.pyx, the `limits` library's strategies);
version 1 files (buckets only) still load.  A server that reads only
version 1 refuses a version 2 file instead of loading it without the
windowed counts.

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
import signal
import struct
import traceback
import zlib
from dataclasses import dataclass

MAGIC = b"FLSNAP\x00\x02"          # what this version writes
MAGIC_V1 = b"FLSNAP\x00\x01"       # buckets only, before the windowed counters
READABLE = {MAGIC: 2, MAGIC_V1: 1}
WINDOWS_PREFIX = b"windows:"        # the windowed counters' sections (_windows.pyx)
BUCKET_VALUE_SIZE = 20      # a "check" record's value (see _core.pxd)
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
    lease_generations: dict[int, int]          # concurrency rule number -> generation
    sections: list[Section]
    version: int = 2


def write(path: str, store, engine, rules: dict[int, tuple[str, str, str]],
          now_ms: int, windows=None) -> None:
    """Writes a snapshot of store, engine and windows (the windowed
    counters' store, if any) to path, atomically."""
    tmp = temp_path(path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            write_to(fd, store, engine, rules, now_ms, windows)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        unlink_if_there(tmp)
        raise
    _fsync_dir(path)


def temp_path(path: str, pid: int) -> str:
    """Where process pid writes the snapshot before renaming it to path."""
    return f"{path}.tmp-{pid}"


def remove_stale_temp_files(path: str) -> list[str]:
    """Removes the temporary files of saves that never finished (a kill -9
    or a crash during SAVE or BGSAVE): ``<path>.tmp-<pid>`` whose pid is not
    a running process of ours (our own pid counts as stale: nothing saves
    before start-up ends).  Returns the names removed."""
    folder = os.path.dirname(os.path.abspath(path))
    prefix = os.path.basename(temp_path(path, 0))[:-1]
    removed: list[str] = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        pid = entry[len(prefix):]
        if entry.startswith(prefix) and pid.isascii() and pid.isdigit() and not _running(int(pid)):
            unlink_if_there(os.path.join(folder, entry))
            removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    """Whether pid is a process of ours other than this one (another
    server, or its BGSAVE child, may be writing that file now)."""
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, OverflowError):
        return False
    return True


def unlink_if_there(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_to(fd: int, store, engine, rules: dict[int, tuple[str, str, str]],
             now_ms: int, windows=None) -> None:
    """Writes a whole snapshot to an open file descriptor."""
    meta = json.dumps({"created_ms": now_ms,
                       "rules": {str(n): list(r) for n, r in rules.items()},
                       "lease_generations": {str(n): g for n, g in
                                             engine.lease_generations().items()}}).encode()
    head = MAGIC + struct.pack("<I", len(meta)) + meta
    write_all(fd, head)
    crc = store.dump(fd, zlib.crc32(head))
    _, crc = engine.dump(fd, crc)
    if windows is not None:
        _, crc = windows.dump(fd, crc)
    write_all(fd, struct.pack("<I", crc) + FOOTER)




def write_all(fd: int, data: bytes) -> None:
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
        return decode(f.read())


def decode(data) -> Snapshot:
    """Verifies and parses a snapshot's bytes (any bytes-like object);
    SnapshotError if unusable."""
    data = memoryview(data)
    trailer = 4 + len(FOOTER)
    if len(data) < len(MAGIC) + 4 + trailer or bytes(data[:len(MAGIC)]) not in READABLE:
        if len(data) >= len(MAGIC) and bytes(data[:len(MAGIC) - 1]) == MAGIC[:-1]:
            raise SnapshotError(f"snapshot format version {data[len(MAGIC) - 1]}: this "
                                f"server reads versions 1 to {READABLE[MAGIC]}")
        raise SnapshotError("not a fastlimit snapshot (bad header)")
    if data[-len(FOOTER):] != FOOTER:
        raise SnapshotError("truncated (no end marker)")
    body = data[:-trailer]
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
        rules = {_rule_number(n): _rule_row(r) for n, r in meta["rules"].items()}
        generations = {_rule_number(n): _u32(g)
                       for n, g in meta.get("lease_generations", {}).items()}
        created = meta["created_ms"]
        if type(created) is not int:
            raise ValueError("created_ms is not an integer")
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as e:
        raise SnapshotError(f"unreadable metadata: {e}") from None
    pos += meta_len
    version = READABLE[bytes(body[:len(MAGIC)])]
    sections = parse_sections(body, pos)
    if version < 2 and any(s.name.startswith(WINDOWS_PREFIX) for s in sections):
        raise SnapshotError("windowed counters in a version 1 snapshot")
    return Snapshot(created, rules, generations, sections, version)


def parse_sections(body: memoryview, pos: int = 0) -> list[Section]:
    """The sections from body[pos:] to its end, bounds-checked."""
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
    return sections


def _u32(value) -> int:
    if type(value) is not int or not 0 <= value < 2**32:
        raise ValueError(f"{value!r} is not a 32-bit unsigned integer")
    return value


# Rule numbers count up from 0 and are never reused in a process; a
# snapshot naming one beyond this is not to be trusted (and restoring maps
# every number below it).
MAX_RULE_NUMBER = 1 << 22


def _rule_number(text: str) -> int:
    if not isinstance(text, str) or not text.isdigit() or int(text) > MAX_RULE_NUMBER:
        raise ValueError(f"rule number {text!r}")
    return int(text)


def _rule_row(row) -> tuple[str, str, str]:
    if not isinstance(row, list) or len(row) != 3 or not all(isinstance(x, str) for x in row):
        raise ValueError(f"rule entry {row!r}")
    return tuple(row)


def rule_numbers(registry) -> dict[int, tuple[str, str, str]]:
    """The numbers a snapshot records: every rule's and every reserved
    one's (the Envoy rate limit service's counters)."""
    return registry.carried()


def restore(snapshot: Snapshot, store, engine, registry, windows=None) -> int:
    """Loads a verified snapshot; returns the buckets (and windowed
    counters, given their store) loaded.  Buckets of rules that are gone,
    or whose algorithm or key scope changed, are left out."""
    renumber = renumber_map(snapshot.rules, registry)

    def count() -> int:
        return len(store) + len(engine) + (len(windows) if windows is not None else 0)

    before = count()
    load_sections(snapshot.sections, store, engine, renumber, windows=windows)
    advance_lease_generations(snapshot.lease_generations, engine, renumber)
    return count() - before


def renumber_map(numbered: dict[int, tuple[str, str, str]], registry) -> list[int | None]:
    """Another process's rule numbers (number -> (id, algorithm, scope))
    mapped to this registry's: None where the rule is gone or its buckets
    mean something else now."""
    by_id = {rule_id: (num, algorithm, scope)
             for num, (rule_id, algorithm, scope) in rule_numbers(registry).items()}
    renumber: list[int | None] = [None] * (max(numbered, default=-1) + 1)
    for old, (rule_id, algorithm, scope) in numbered.items():
        now = by_id.get(rule_id)
        if now is not None and now[1:] == (algorithm, scope):
            renumber[old] = now[0]
    return renumber


def load_sections(sections: list[Section], store, engine, renumber: list,
                  deletes: bool = False, windows=None) -> None:
    """Loads sections (of a snapshot, or of a replication batch, whose
    tombstones delete when `deletes`); SnapshotError if malformed.  The
    windowed counters' sections go to windows (left out without one)."""
    for s in sections:
        try:
            if s.name.startswith(WINDOWS_PREFIX):
                if windows is not None and not windows.load_section(
                        s.name, s.value_size, s.data, s.records, deletes):
                    raise ValueError("no such windowed counter table")
            elif s.name == b"check":
                if s.value_size != BUCKET_VALUE_SIZE:
                    raise ValueError(f"value size {s.value_size}, not {BUCKET_VALUE_SIZE}")
                store.load(s.data, s.records, deletes)
            else:
                engine.load_section(s.name, s.value_size, s.data, s.records, renumber, deletes)
        except (ValueError, OverflowError) as e:
            raise SnapshotError(f"section {s.name!r}: {e}") from None


def advance_lease_generations(generations: dict[int, int], engine, renumber: list) -> None:
    for old, generation in generations.items():
        if old < len(renumber) and renumber[old] is not None:
            engine.advance_lease_generation(renumber[old], generation)


def fork_worker(work) -> int:
    """Runs work() in a forked child, which sees the memory as it is now
    (copy on write) and exits 0 when work returns, 1 if it raises.
    Returns the child's pid; the parent reaps it."""
    # Signals wait until the child has dropped the parent's handlers
    # (see _forget_parent_signals); the parent gets them a moment later.
    signal.pthread_sigmask(signal.SIG_BLOCK, PARENT_SIGNALS)
    pid = os.fork()
    if pid != 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PARENT_SIGNALS)
        return pid
    status = 1       # the child: work and leave, touching nothing else
    try:
        _forget_parent_signals()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PARENT_SIGNALS)
        work()
        status = 0
    except BaseException:
        traceback.print_exc()    # to the server's log
    finally:
        os._exit(status)


def _forget_parent_signals() -> None:
    """In a forked child: the event loop's signal handling writes signals
    to a wakeup fd the parent reads, so a SIGTERM sent to the child would
    stop the parent.  The child takes the default actions instead."""
    signal.set_wakeup_fd(-1)
    for sig in PARENT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


PARENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
