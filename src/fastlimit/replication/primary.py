"""Asynchronous replication, the primary's side: a primary streams bucket
states to its replicas (the replica's side is replica.py, the format
stream.py).

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
chain).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastlimit.replication import stream as rs
from fastlimit.replication.replica import PrimaryLink
from fastlimit.replication.stream import wall_ms
from fastlimit.server import snapshot
from fastlimit.server.subsystem import Subsystem

if TYPE_CHECKING:
    from fastlimit._protocol import Connection

HEARTBEAT_S = 1.0          # an empty batch this often keeps an idle link alive
LAG_BUCKETS_MS = 1000      # lag histogram: 1 ms buckets, then one for the rest


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
            snapshot.write_to(fd, app.store, app.rule_engine, numbers, now, app.windows.store)
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
        for store in app.stores:
            if on:
                store.track_changes(app.settings.repl_buffer_limit)
            else:
                store.untrack_changes()

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
        if any(store.changes_overflowed() for store in app.stores):
            self._drop_all("the change log passed repl-buffer-limit")
            return
        oldest = min(filter(None, (store.oldest_change_ms() for store in app.stores)),
                     default=None)
        sections = [part for store in app.stores for part in store.drain_changes()]
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
        self.follow_link(PrimaryLink(self, host, port, time.monotonic() if was_up else None))
        self.app.settings.replicaof = (host, port)
        return True

    def follow_link(self, link: PrimaryLink) -> None:
        """Becomes a replica over link: REPLICAOF's, or a takeover's link
        to the server it replaces (takeover/heir.py)."""
        self.stop_following()
        self._drop_all("this server became a replica")
        self.app.core.readonly = True
        self.link = link
        link.start()
        self.log.warning("following primary %s:%d", link.host, link.port)

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
