"""Asynchronous replication: a primary streams bucket states to its
replicas; a replica follows one primary and refuses writes until promoted.

The primary never waits for a replica.  A full copy is written by a
forked child into a memory file (the fork is the only pause), then sent
a chunk at a time as the replica's socket drains, while the batches made
meanwhile wait behind it.  Replicas that arrive while a copy is in flight
share it (at most `repl-max-full-copies` exist at once).  While a replica
is attached, every table notes the keys its writes touch; every
`repl-flush-ms` the notes are drained into one batch of current states
written to every replica.  A replica whose unsent output (its socket's
buffer plus the batches waiting behind its copy) passes
`repl-buffer-limit`, or that has not acknowledged for `repl-timeout`
seconds, is dropped; it reconnects and gets a full copy.  A replica in
sync serves replicas too: a full copy of its own state, then every frame
of its primary's stream relayed as it came (so offsets agree down the
chain).  Format: replstream.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastlimit.rules.registry import SOURCE_RESERVED
from fastlimit.server import replstream as rs
from fastlimit.server import snapshot
from fastlimit.server.snapshot import SnapshotError
from fastlimit.server.subsystem import Subsystem

if TYPE_CHECKING:
    from fastlimit._protocol import Connection

HEARTBEAT_S = 1.0          # an empty batch this often keeps an idle link alive
ACK_S = 1.0                # a replica reports its offset this often
RECONNECT_S = 0.5          # a replica retries its primary after this long...
RECONNECT_MAX_S = 4.0      # ...doubled on each failure in a row, up to this
FAILURE_LOG_S = 60.0       # a run of link failures is logged at most this often
LAG_BUCKETS_MS = 1000      # lag histogram: 1 ms buckets, then one for the rest


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# A full copy goes out this much at a time, while less than SEND_AHEAD (or
# half repl-buffer-limit) is unsent: what each follower reading it holds of
# its own (the stream's frames are the same objects for all of them), and
# still 500 MB/s at one refill per repl-flush-ms.
SEND_CHUNK = 256 * 1024
SEND_AHEAD = 1 << 20


@dataclass
class FullCopy:
    """One full copy, shared by every follower that starts from it: the
    state at stream offset `offset`, written by a forked child into a
    memory file, and every frame broadcast since, which each of its
    followers gets after the copy itself (so joining a copy already made,
    even one being sent, gives a consistent state)."""
    offset: int
    fd: int
    child: int = 0                  # pid writing it; 0 once written
    size: int = 0                   # known once written
    frames: list = field(default_factory=list)    # broadcast since `offset`
    frames_bytes: int = 0
    followers: int = 0              # followers it is still being sent to

    def memory_bytes(self) -> int:
        try:
            return os.fstat(self.fd).st_size
        except OSError:
            return 0

    def release(self) -> None:
        if self.child:
            _reap(self.child, kill=True)
            self.child = 0
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class Follower:
    """A replica as its primary sees it.  States as Redis names them:
    wait_bgsave (a child writes its full copy), send_bulk, online."""
    conn: Connection
    ip: str
    port: int = 0                   # the replica's own listening port
    state: str = "wait_bgsave"
    ack_offset: int = 0
    last_ack: float = field(default_factory=time.monotonic)
    copy: FullCopy | None = None    # until online
    copy_sent: int = 0

    @property
    def output_bytes(self) -> int:
        """What it has not yet read: its socket's unsent output plus,
        before it is online, the frames waiting behind its copy."""
        waiting = self.copy.frames_bytes if self.copy is not None else 0
        return self.conn.output_buffer_len + waiting


class LagStats:
    """How long changes took to reach this replica, weighted by records."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * (LAG_BUCKETS_MS + 1)
        self.records = 0
        self.last_ms = 0
        self.max_ms = 0

    def add(self, lag_ms: int, records: int) -> None:
        lag_ms = max(lag_ms, 0)
        self.last_ms = lag_ms
        self.max_ms = max(self.max_ms, lag_ms)
        if records:
            self.counts[min(lag_ms, LAG_BUCKETS_MS)] += records
            self.records += records

    def percentile(self, p: float) -> int:
        """The smallest lag (ms) within which a share p of records arrived;
        LAG_BUCKETS_MS means "that or more"."""
        if not self.records:
            return 0
        need, seen = p * self.records, 0
        for ms, n in enumerate(self.counts):
            seen += n
            if seen >= need:
                return ms
        return LAG_BUCKETS_MS


class Replication(Subsystem):
    """The server's replication role: primary (with followers) or replica
    (with a link to its primary)."""

    def __init__(self, app, log):
        self.app = app
        self.log = log
        self.replid = os.urandom(20).hex()
        self.offset = 0
        self.followers: dict[int, Follower] = {}
        self.copies: list[FullCopy] = []     # in flight, oldest first
        self.link: PrimaryLink | None = None
        self.lag = LagStats()
        self.full_syncs = 0
        self.copies_written = 0
        self.dropped = 0
        self._flush_handle = None
        self._last_batch_ms = wall_ms()
        app.rules.on_change = self.rules_changed

    # ---- primary ------------------------------------------------------------------

    def attach(self, conn) -> None:
        """Starts a replica off from a full copy, shared with the others
        being started if there is one to share (see _copy_to_join)."""
        follower = conn.replica
        if follower is None or conn.is_closed or conn.id not in self.app.core.clients:
            return    # it left, or was refused, before its turn
        if self.link is not None and self.link.state != "connected":
            conn.abort()             # this server became a replica meanwhile
            return
        self.flush()   # the others get what changed up to the copy (or are dropped)
        if not self.followers:
            self._track(True)
        self.followers[conn.id] = follower
        try:
            copy = self._copy_to_join()
        except (OSError, MemoryError) as e:
            self._drop(follower, f"its full copy could not be started: {e}")
            return
        follower.copy, follower.ack_offset = copy, copy.offset
        follower.state = "wait_bgsave" if copy.child else "send_bulk"
        copy.followers += 1
        self.full_syncs += 1
        self._schedule_flush()
        self.log.info("replica %s:%d: full copy of offset %d (%s, shared by %d)",
                      follower.ip, follower.port, copy.offset,
                      f"being written by pid {copy.child}" if copy.child else "written",
                      copy.followers)
        self.advance_copies()

    def _copy_to_join(self) -> FullCopy:
        """The newest copy in flight while the frames behind it are under
        half repl-buffer-limit; else a new one, unless repl-max-full-copies
        are in flight already (then the newest, however far behind: at
        worst its followers pass the limit and start over)."""
        settings = self.app.settings
        if self.copies and (self.copies[-1].frames_bytes <= settings.repl_buffer_limit // 2
                            or len(self.copies) >= settings.repl_max_full_copies):
            return self.copies[-1]
        copy = self._start_copy()
        self.copies.append(copy)
        self.copies_written += 1
        return copy

    def _start_copy(self) -> FullCopy:
        """A child writing the rules and every bucket as they are now."""
        app = self.app
        rules, offset = self._rules_payload(), self.offset
        if self.link is not None:
            # A replica relays its primary's frames, which number the rules
            # as the primary does: so do the rules its copy starts with.
            # (The buckets in the copy carry its own numbers with their
            # rule ids, and are matched by id.)
            rules, offset = self.link.rules_payload, self.link.offset
        numbers, now = snapshot.rule_numbers(app.rules), app.clock.now()
        copy = FullCopy(offset, os.memfd_create("fastlimit-full-copy"))

        def write_copy():
            fd = copy.fd
            snapshot.write_all(fd, rs.frame(rs.RULES, rules) +
                               rs.frame(rs.SNAPSHOT, rs.snapshot_payload(offset, b"")))
            snapshot.write_to(fd, app.store, app.rule_engine, numbers, now)
            # the copy's length, known now, goes into its frame header
            size = os.lseek(fd, 0, os.SEEK_CUR) - len(rules) - 2 * rs.FRAME.size
            os.pwrite(fd, rs.FRAME.pack(rs.SNAPSHOT, size), len(rules) + rs.FRAME.size)

        try:
            copy.child = snapshot.fork_worker(write_copy)
        except BaseException:
            copy.release()
            raise
        return copy

    def advance_copies(self) -> None:
        """Moves the replicas being started along: reaps the children that
        wrote their copies, sends each copy as its socket drains, then the
        frames that waited behind it."""
        for copy in [c for c in self.copies if c.child]:
            status = _reap(copy.child)
            if status is None:
                continue
            copy.child = 0
            if status != 0:
                for follower in self._followers_of(copy):
                    self._drop(follower, "writing its full copy failed")
                continue
            copy.size = os.fstat(copy.fd).st_size
            for follower in self._followers_of(copy):
                follower.state = "send_bulk"
        for follower in list(self.followers.values()):
            if follower.state == "send_bulk":
                self._send_copy(follower)

    def _followers_of(self, copy: FullCopy) -> list[Follower]:
        return [f for f in self.followers.values() if f.copy is copy]

    def _send_copy(self, follower: Follower) -> None:
        conn, copy = follower.conn, follower.copy
        assert copy is not None         # a follower is sent the copy it waits for
        # All of a replica's output counts against repl-buffer-limit, so the
        # copy runs at most half of it ahead of the socket.
        ahead = min(SEND_AHEAD, self.app.settings.repl_buffer_limit // 2)
        chunk_size = min(SEND_CHUNK, ahead)
        while follower.copy_sent < copy.size and conn.output_buffer_len < ahead:
            chunk = os.pread(copy.fd, chunk_size, follower.copy_sent)
            if not chunk:
                self._drop(follower, "its full copy could not be read back")
                return
            conn.send(chunk)
            follower.copy_sent += len(chunk)
            follower.last_ack = time.monotonic()   # it is reading: alive
        if follower.copy_sent < copy.size:
            self._within_limit(follower)
            return
        for data in copy.frames:      # the same objects for every follower
            conn.send(data)
        self._leave_copy(follower)
        follower.state = "online"
        self.log.info("replica %s:%d: full copy sent (%d bytes); streaming",
                      follower.ip, follower.port, copy.size)
        self._within_limit(follower)

    def _leave_copy(self, follower: Follower) -> None:
        """The follower no longer needs its copy; the last one out frees it."""
        copy, follower.copy = follower.copy, None
        if copy is None:
            return
        copy.followers -= 1
        if copy.followers <= 0:
            self.copies.remove(copy)
            copy.release()

    def _within_limit(self, follower: Follower) -> None:
        """Redis's client-output-buffer-limit for replicas: everything a
        replica has not read, in every phase, is bounded by
        repl-buffer-limit; past it the replica is dropped (and resyncs)."""
        limit = self.app.settings.repl_buffer_limit
        pending = follower.output_bytes
        if pending > limit:
            self._drop(follower, f"its unsent output ({pending} bytes) passed "
                                 f"repl-buffer-limit ({limit} bytes)")

    def check_output(self, conn) -> None:
        """The output bound of a replica connection (see _within_limit),
        for whatever else writes to it."""
        follower = self.followers.get(conn.id)
        if follower is not None:
            self._within_limit(follower)

    def detach(self, conn) -> None:
        follower = self.followers.pop(conn.id, None)
        if follower is not None:
            self._leave_copy(follower)
            self.log.warning("replica %s:%d lost", follower.ip, follower.port)
        if not self.followers:
            self._track(False)

    def acknowledge(self, conn, offset: int) -> None:
        follower = self.followers.get(conn.id)
        if follower is not None:
            follower.ack_offset = offset
            follower.last_ack = time.monotonic()

    def _track(self, on: bool) -> None:
        app = self.app
        if on and self.link is not None:
            return    # a replica relays its primary's batches: it has none of its own
        if app.reshard.tracking:
            return    # a slot move keeps the log on (and hands it back after)
        if on:
            limit = app.settings.repl_buffer_limit
            app.store.track_changes(limit)
            app.rule_engine.track_changes(limit)
        else:
            app.store.untrack_changes()
            app.rule_engine.untrack_changes()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and self.followers:
            self._flush_handle = asyncio.get_running_loop().call_later(
                self.app.settings.repl_flush_ms / 1000, self._timed_flush)

    def _timed_flush(self) -> None:
        self._flush_handle = None
        try:
            self.flush()
            self.advance_copies()
        except (OSError, MemoryError):
            # Replicas fall behind and, past repl-timeout, resync; the
            # timer must live on whatever happened.
            self.log.exception("replication flush failed")
        finally:
            self._schedule_flush()

    def flush(self) -> None:
        """Sends what changed since the last batch (or a heartbeat when
        nothing did and one is due)."""
        if not self.followers or self.link is not None:
            return
        app = self.app
        if app.store.changes_overflowed() or app.rule_engine.changes_overflowed():
            self._drop_all("the change log passed repl-buffer-limit")
            return
        oldest = min(filter(None, (app.store.oldest_change_ms(),
                                   app.rule_engine.oldest_change_ms())), default=None)
        sections = app.store.drain_changes() + app.rule_engine.drain_changes()
        app.reshard.changes_drained(sections)    # a slot move sends its slots' part
        now = wall_ms()
        if not sections and now - self._last_batch_ms < HEARTBEAT_S * 1000:
            return
        self._last_batch_ms = now
        assert oldest is not None or not sections   # changes have an oldest one
        stamp = oldest if oldest is not None and sections else now
        generations = app.rule_engine.lease_generations() if sections else {}
        self.broadcast(rs.frame(rs.BATCH, rs.batch_head(stamp, generations), *sections))

    def broadcast(self, data: bytes) -> None:
        self.offset += len(data)
        for copy in self.copies:     # once per copy, however many share it
            copy.frames.append(data)
            copy.frames_bytes += len(data)
        for follower in list(self.followers.values()):
            if follower.state == "online":
                follower.conn.send(data)
            self._within_limit(follower)

    def rules_changed(self) -> None:
        if self.link is not None:
            # a counter reserved here since the primary's last rules frame
            self.link.renumber_again()
        if self.followers and self.link is None:
            self.flush()
            self.broadcast(rs.frame(rs.RULES, self._rules_payload()))

    def flushed_all(self) -> None:
        """Called before FLUSHALL clears the tables: what changed before
        it goes first, then the flush itself."""
        if self.followers and self.link is None:
            self.flush()
            self.broadcast(rs.frame(rs.FLUSH))

    def _rules_payload(self) -> bytes:
        registry = self.app.rules
        return rs.rules_payload([(registry.num_for(rule_id), rule_id, doc, source, updated)
                                 for rule_id, doc, source, updated in registry.export()]
                                + registry.reserved_rows())

    def _drop(self, follower: Follower, why: str) -> None:
        self.log.warning("dropping replica %s:%d: %s; it will resync in full",
                         follower.ip, follower.port, why)
        self.dropped += 1
        self.followers.pop(follower.conn.id, None)
        self._leave_copy(follower)
        follower.conn.abort()
        if not self.followers:
            self._track(False)

    def _drop_all(self, why: str) -> None:
        for follower in list(self.followers.values()):
            self._drop(follower, why)

    def cron(self) -> None:
        """Once a second: replicas silent for repl-timeout are dropped; a
        replica reports its offset."""
        timeout = self.app.settings.repl_timeout
        now = time.monotonic()
        for follower in list(self.followers.values()):
            if now - follower.last_ack > timeout:
                self._drop(follower, f"no acknowledgement for {timeout} s")
            else:
                self._within_limit(follower)
        if self.link is not None:
            self.link.cron()

    # ---- role changes ------------------------------------------------------------------

    def follow(self, host: str, port: int) -> bool:
        """Becomes a replica of host:port (REPLICAOF); False if it already
        is.  The running replicaof setting says so (for CONFIG REWRITE)."""
        if self.link is not None and (self.link.host, self.link.port) == (host, port):
            return False
        was_up = self.link is not None and self.link.state == "connected"
        self.stop_following()
        self._drop_all("this server became a replica")
        self.app.core.readonly = True
        self.app.settings.replicaof = (host, port)
        self.link = PrimaryLink(self, host, port, time.monotonic() if was_up else None)
        self.link.start()
        self.log.warning("following primary %s:%d", host, port)
        return True

    def promote(self) -> None:
        """REPLICAOF NO ONE: keeps every bucket and starts taking writes,
        under a new replication id, as Redis does."""
        if self.link is None:
            return
        self.offset = self.link.offset     # the stream goes on counting from here
        self.stop_following()
        self.app.core.readonly = False
        self.app.settings.replicaof = None
        if self.followers:
            # They go on, now with this server's own batches, which number
            # the rules as it does: its rules tell them how.
            self._track(True)
            self.broadcast(rs.frame(rs.RULES, self._rules_payload()))
        self.replid = os.urandom(20).hex()
        self.log.warning("promoted to primary; serving from the state replicated so far")
        self.app.cluster.promoted()

    def stop_following(self):
        """Ends the link to the primary; returns its connect task (see
        PrimaryLink.stop), if any."""
        link, self.link = self.link, None
        return link.stop() if link is not None else None

    async def start(self) -> None:
        if self.app.settings.replicaof:
            self.follow(*self.app.settings.replicaof)

    async def stop(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for copy in self.copies:
            copy.release()
        self.copies.clear()
        task = self.stop_following()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def reset_stats(self) -> None:
        self.lag.reset()

    # ---- INFO and ROLE -----------------------------------------------------------------------

    def info_sections(self, sections, named):
        out = {"memory": self.memory_info()}
        if "replication" in sections:     # info() flushes the batch: only when asked
            out["replication"] = self.info()
        return out

    def info(self) -> dict:
        if self.link is not None:
            return self.link.info()
        self.flush()    # the offset then covers every write before this INFO
        out = {"role": "master", **self.follower_info()}
        out.update({"master_failover_state": "no-failover", "master_replid": self.replid,
                    "master_repl_offset": self.offset, "repl_full_syncs": self.full_syncs,
                    "repl_full_copies_written": self.copies_written,
                    "repl_full_copies_in_flight": len(self.copies),
                    "repl_full_copy_bytes": self._copy_bytes(),
                    "repl_max_full_copies": self.app.settings.repl_max_full_copies,
                    "repl_dropped_replicas": self.dropped,
                    "repl_buffer_limit": self.app.settings.repl_buffer_limit})
        return out

    def follower_info(self) -> dict:
        """connected_slaves and a slave<i> line per follower."""
        out: dict[str, int | str] = {"connected_slaves": len(self.followers)}
        now = time.monotonic()
        for i, f in enumerate(self.followers.values()):
            out[f"slave{i}"] = (f"ip={f.ip},port={f.port},state={f.state},"
                                f"offset={f.ack_offset},lag={int(now - f.last_ack)}")
        return out

    def _copy_bytes(self) -> int:
        return sum(copy.memory_bytes() for copy in self.copies)

    def memory_info(self) -> dict:
        """INFO memory's view: the full copies in flight (memory files,
        outside RSS), the frames waiting behind them, and the replicas'
        unsent output."""
        return {"mem_clients_slaves": sum(f.conn.output_buffer_len
                                          for f in self.followers.values()),
                "mem_repl_waiting_frames": sum(c.frames_bytes for c in self.copies),
                "mem_repl_full_copies": self._copy_bytes(),
                "repl_full_copies": len(self.copies)}

    def role_reply(self) -> list:
        if self.link is not None:
            return self.link.role_reply()
        self.flush()
        return [b"master", self.offset,
                [[f.ip.encode(), str(f.port).encode(), str(f.ack_offset).encode()]
                 for f in self.followers.values()]]


class FailureLog:
    """A run of link failures: the first is logged, then at most one line
    per FAILURE_LOG_S saying how many there were, so a link that cannot
    come up never writes a line per retry; the retry backs off alike."""

    def __init__(self, log):
        self.log = log
        self.run = 0            # failures since the link last came up
        self.unlogged = 0
        self.logged_at = 0.0

    def failed(self, level: int, message: str) -> None:
        self.run += 1
        now = time.monotonic()
        if self.run > 1 and now - self.logged_at < FAILURE_LOG_S:
            self.unlogged += 1
            return
        more = (f" ({self.unlogged} more failures since the last report)"
                if self.unlogged else "")
        self.log.log(level, "%s%s", message, more)
        self.logged_at, self.unlogged = now, 0

    def recovered(self) -> None:
        self.run = self.unlogged = 0

    @property
    def retry_after(self) -> float:
        return min(RECONNECT_MAX_S, RECONNECT_S * 2 ** max(self.run - 1, 0))


class PrimaryLink(asyncio.Protocol):
    """A replica's connection to its primary: handshake, full copy, then
    batches; reconnects while down, backing off (see FailureLog)."""

    def __init__(self, repl: Replication, host: str, port: int,
                 down_since: float | None = None):
        self.repl = repl
        self.app = repl.app
        self.host = host
        self.port = port
        self.state = "connect"
        self.transport: asyncio.Transport | None = None
        self.reader = rs.FrameReader()
        self.handshake = bytearray()
        self.replies_due = 0
        self.offset = 0
        self.master_replid = repl.replid    # until the primary's: our own, as Redis shows
        self.renumber: list[int | None] = []
        self.numbered: list[tuple[int, str]] = []   # the primary's (number, rule id or name)
        self.last_io = time.monotonic()
        # when a link that was up went down (None: it never was), as Redis's
        # master_link_down_since_seconds counts
        self.down_since = down_since
        self.batches = 0
        self.records = 0
        self.rules_payload = b""   # the primary's last rules, for our replicas' copies
        self.failures = FailureLog(repl.log)
        self._ends = ("", "")      # this end's and the primary's address
        self._stopped = False
        self._retry: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- connecting ----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        self._retry = None
        self.state = "connecting"
        try:
            # A primary that drops SYNs would otherwise hold this for the
            # kernel's connect timeout (minutes).
            await asyncio.wait_for(asyncio.get_running_loop().create_connection(
                lambda: self, self.host, self.port, **self._tls_options()),
                self.app.settings.repl_timeout)
        except TimeoutError:
            self._failed(logging.WARNING, "connect timed out", reach=True)
        except OSError as e:
            self._failed(logging.WARNING, str(e.strerror or e), reach=True)

    def _tls_options(self) -> dict:
        """tls-replication: the primary's tls-port, over TLS (no host
        name check, as Redis)."""
        tls = self.app.tls.client if self.app.settings.tls_replication else None
        return {"ssl": tls, "server_hostname": self.host} if tls is not None else {}

    def _failed(self, level: int, why: str, reach: bool = False) -> None:
        what = "cannot reach" if reach else "replication from"
        self.failures.failed(level, f"{what} primary {self.host}:{self.port}"
                                    f"{'' if reach else ' failed'}: {why}")
        if reach:
            self._later()

    def _later(self) -> None:
        self.state = "connect"
        if not self._stopped and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(
                self.failures.retry_after, self.start)

    def stop(self):
        """Ends the link for good: no connect still in flight may complete
        it later (a promoted replica must never sync again).  Returns the
        connect task, cancelled, for a caller that must wait for it."""
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()
        return self._task

    # ---- asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport) -> None:
        if self._stopped:        # a connect that finished as the link was stopped
            transport.abort()
            return
        self.transport = transport
        self.state = "handshake"
        self.last_io = time.monotonic()
        self.reader = rs.FrameReader()
        self.handshake = bytearray()
        self._ends = (_address(transport.get_extra_info("sockname")),
                      _address(transport.get_extra_info("peername")))
        commands = [*self._auth(), [b"CL.SYNC"]]
        self.replies_due = len(commands)
        # The address follows, unanswered, on the replica link.
        transport.write(b"".join(_resp_command(c) for c in commands + [self._announce()]))

    def _auth(self) -> list[list[bytes]]:
        """The AUTH a Redis replica sends: as masteruser when set (an ACL
        user of the primary's, which needs +cl.sync +replconf), else as
        the default user; none without masterauth."""
        settings = self.app.settings
        if not settings.masterauth:
            return []
        user = [settings.masteruser.encode("utf-8", "surrogateescape")] \
            if settings.masteruser else []
        return [[b"AUTH", *user, settings.masterauth]]

    def _announce(self) -> list[bytes]:
        """REPLCONF with the address the primary is to list this replica
        under (INFO's slave<N> line, where Sentinel finds replicas): the
        replica-announce settings, else the port it listens on and the
        link's own address, as Redis sends them."""
        settings = self.app.settings
        port = settings.replica_announce_port or self.app.port
        args = [b"REPLCONF", b"listening-port", str(port).encode()]
        if settings.replica_announce_ip:
            args += [b"ip-address", settings.replica_announce_ip.encode()]
        return args

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self._stopped:
            return
        if self.state == "connected":
            self.repl.log.warning("lost the link to primary %s:%d", self.host, self.port)
            self.down_since = time.monotonic()
        self._later()

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        self.last_io = time.monotonic()
        try:
            if self.replies_due:
                data = self._handshake_replies(data)
            for kind, payload in self.reader.feed(data):
                self._apply(kind, payload)
        except _Stopped:
            pass
        except (SnapshotError, ValueError) as e:    # RuleError is a ValueError
            self._failed(logging.ERROR, f"{e}; resyncing")
            assert self.transport is not None   # data arrives only while connected
            self.transport.abort()
        except Exception:
            # A bug must cost a resync, never the replica process.
            self.repl.log.exception("replication from %s:%d failed; resyncing",
                                    self.host, self.port)
            assert self.transport is not None   # data arrives only while connected
            self.transport.abort()

    def _handshake_replies(self, data: bytes) -> bytes:
        """Consumes the one-line replies to the handshake; returns what
        follows them (the first frames)."""
        self.handshake += data
        while self.replies_due:
            end = self.handshake.find(b"\r\n")
            if end < 0:
                if len(self.handshake) > 4096:
                    raise ValueError("handshake reply too long")
                return b""
            line = bytes(self.handshake[:end]).decode("utf-8", "replace")
            del self.handshake[:end + 2]
            self.replies_due -= 1
            if not line.startswith("+"):
                self._refused(line)
            if line.startswith("+FULLSYNC"):
                parts = line.split()
                self.master_replid = parts[1] if len(parts) > 1 else "?"
                self.state = "sync"
        rest, self.handshake = bytes(self.handshake), bytearray()
        return rest

    def _refused(self, line: str) -> None:
        """A refused handshake: if the primary is this very server (its
        answer comes from one of our own connections), the link stops for
        good, as it could never succeed; else it is retried."""
        if self._to_myself():
            self.failures.failed(logging.ERROR, (
                f"REPLICAOF {self.host} {self.port} is this server itself: can't "
                f"replicate from myself; not retrying (REPLICAOF NO ONE, or another "
                f"primary)"))
            self._stopped = True
            self.state = "connect"
            assert self.transport is not None   # handshake replies: connected
            self.transport.abort()
            raise _Stopped()
        raise ValueError(f"the primary refused the handshake: {line}")

    def _to_myself(self) -> bool:
        """Whether a connection of this server's has our link's ends,
        swapped: then we dialled ourselves (whatever name or address led
        here)."""
        mine, theirs = self._ends
        return any(c.addr == mine and c.laddr == theirs
                   for c in self.app.core.clients.values())

    # ---- applying frames ----------------------------------------------------------------

    def renumber_again(self) -> None:
        self.renumber = _renumber(self.numbered, self.app.rules)

    def _apply(self, kind: int, payload: memoryview) -> None:
        """Applies a frame and relays it, as it came, to this replica's
        own replicas (all but a full copy, which they do not share)."""
        app = self.app
        if kind == rs.RULES:
            rows = rs.parse_rules(payload)
            self.numbered = [(row[0], row[1]) for row in rows]
            app.rules.mirror([row[1:] for row in rows if row[3] != SOURCE_RESERVED])
            self.renumber_again()
            self.rules_payload = bytes(payload)
        elif kind == rs.SNAPSHOT:
            self.repl._drop_all("its own primary sent a new full copy")
            offset, body = rs.parse_snapshot(payload)
            copy = snapshot.decode(body)
            app.flush_buckets()
            # the copy's buckets by their own rule numbers (a replica's
            # differ from the primary's that its stream carries)
            renumber = snapshot.renumber_map(copy.rules, app.rules)
            snapshot.load_sections(copy.sections, app.store, app.rule_engine, renumber)
            snapshot.advance_lease_generations(copy.lease_generations, app.rule_engine,
                                               renumber)
            self.offset = offset
            self.state = "connected"
            self.failures.recovered()
            self.repl.log.warning("full copy from primary %s:%d loaded: %d buckets",
                                  self.host, self.port, app.bucket_count())
            self._ack()
            return
        elif kind == rs.BATCH:
            stamp, generations, sections = rs.parse_batch(payload)
            snapshot.load_sections(sections, app.store, app.rule_engine, self.renumber,
                                   deletes=True)
            snapshot.advance_lease_generations(generations, app.rule_engine, self.renumber)
            records = sum(s.records for s in sections)
            self.repl.lag.add(wall_ms() - stamp, records)
            self.batches += 1
            self.records += records
        elif kind == rs.FLUSH:
            app.flush_buckets()
        self.offset += rs.FRAME.size + len(payload)
        if self.repl.followers:
            self.repl.broadcast(rs.frame(kind, payload))

    def _ack(self) -> None:
        if self.transport is not None and self.state == "connected":
            self.transport.write(_resp_command(
                [b"REPLCONF", b"ACK", str(self.offset).encode()]))

    def cron(self) -> None:
        timeout = self.app.settings.repl_timeout
        if self.transport is not None and time.monotonic() - self.last_io > timeout:
            self.repl.log.warning("primary %s:%d silent for %d s; reconnecting",
                                  self.host, self.port, timeout)
            self.transport.abort()
            return
        self._ack()

    # ---- INFO and ROLE -------------------------------------------------------------------

    def info(self) -> dict:
        """Redis 7.0's fields for a replica, in its order (and, like it,
        the sync's progress only during a full copy and the time down only
        while down), then fastlimit's own."""
        up = self.state == "connected"
        now = time.monotonic()
        lag = self.repl.lag
        settings = self.app.settings
        out = {"role": "slave", "master_host": self.host, "master_port": self.port,
               "master_link_status": "up" if up else "down",
               "master_last_io_seconds_ago": int(now - self.last_io) if up else -1,
               "master_sync_in_progress": int(self.state == "sync"),
               "slave_read_repl_offset": self.offset + (self.reader.pending if up else 0),
               "slave_repl_offset": self.offset}
        if self.state == "sync":
            out.update(self._sync_progress(now))
        if not up:
            out["master_link_down_since_seconds"] = (
                -1 if self.down_since is None else int(now - self.down_since))
        out.update({
            "slave_priority": settings.replica_priority, "slave_read_only": 1,
            "replica_announced": int(settings.replica_announced),
            **self.repl.follower_info(),
            "master_failover_state": "no-failover",
            "master_replid": self.master_replid, "master_repl_offset": self.offset,
            "master_link_failures": self.failures.run,
            "repl_batches_applied": self.batches, "repl_records_applied": self.records,
            "repl_lag_last_ms": lag.last_ms, "repl_lag_p50_ms": lag.percentile(0.50),
            "repl_lag_p99_ms": lag.percentile(0.99), "repl_lag_max_ms": lag.max_ms,
            "repl_lag_records": lag.records})
        return out

    def _sync_progress(self, now: float) -> dict:
        """Redis's master_sync_* fields: the full copy's frame as read so
        far (its size is known once its header has arrived; -1 before, as
        Redis says for a copy of unknown size)."""
        total = self.reader.next_frame_size
        read = self.reader.pending
        return {"master_sync_total_bytes": total if total is not None else -1,
                "master_sync_read_bytes": read,
                "master_sync_left_bytes": total - read if total is not None else -1,
                "master_sync_perc": f"{100 * read / total if total else 0:.2f}",
                "master_sync_last_io_seconds_ago": int(now - self.last_io)}

    def role_reply(self) -> list:
        return [b"slave", self.host.encode(), self.port, self.state.encode(), self.offset]


class _Stopped(Exception):
    """The link stopped itself while reading (it dialled itself)."""


def _address(addr) -> str:
    """host:port as connections show theirs (Connection.addr/laddr)."""
    if not isinstance(addr, tuple):
        return str(addr or "")
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reap(pid: int, kill: bool = False) -> int | None:
    """A child's exit code once it has ended (killing it first if asked),
    else None."""
    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        done, status = os.waitpid(pid, 0 if kill else os.WNOHANG)
    except ChildProcessError:
        return 1
    return os.waitstatus_to_exitcode(status) if done else None


def _renumber(numbered: list[tuple[int, str]], registry) -> list[int | None]:
    """The primary's rule numbers mapped to this registry's, by rule id
    (the registry mirrors the primary's rules, so every id is here) or by
    reserved name (a counter this server reserved too: None until it
    has, and the buckets of that number are left out until then)."""
    here = {name: num for num, (name, _, _) in registry.carried().items()}
    renumber: list[int | None] = [None] * (max((n for n, _ in numbered), default=-1) + 1)
    for num, name in numbered:
        renumber[num] = here.get(name)
    return renumber


def _resp_command(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
