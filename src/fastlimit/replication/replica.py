"""Asynchronous replication, the replica's side: a replica follows one
primary (PrimaryLink: handshake, full copy, then batches) and refuses
writes until promoted; it reconnects while its primary is down, backing
off.  The primary's side is primary.py, the format stream.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from fastlimit.replication import stream as rs
from fastlimit.replication.stream import wall_ms
from fastlimit.rules.registry import SOURCE_RESERVED
from fastlimit.server import snapshot
from fastlimit.server.snapshot import SnapshotError

if TYPE_CHECKING:
    from fastlimit.replication.primary import Replication

RECONNECT_S = 0.5          # a replica retries its primary after this long...
RECONNECT_MAX_S = 4.0      # ...doubled on each failure in a row, up to this
FAILURE_LOG_S = 60.0       # a run of link failures is logged at most this often


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


class RetryingLink(asyncio.Protocol):
    """A link to another server that connects in a task of its own
    (`_connect`, the subclass's) and, while down, tries again after its
    FailureLog's backoff; stop() ends it for good.  A replica's link to its
    primary, and a region's link to a peer region (regions/links.py)."""

    state: str
    failures: FailureLog
    transport: asyncio.Transport | None
    _stopped: bool
    _retry: asyncio.TimerHandle | None
    _task: asyncio.Task[None] | None

    def start(self) -> None:
        self._retry = None
        self._task = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        raise NotImplementedError

    def _later(self) -> None:
        """A connect again after the backoff (none once stopped)."""
        self.state = "connect"
        if not self._stopped and self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(
                self.failures.retry_after, self.start)

    def stop(self) -> asyncio.Task[None] | None:
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


class PrimaryLink(RetryingLink):
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

    async def _connect(self) -> None:
        self.state = "connecting"
        try:
            # A primary that drops SYNs would otherwise hold this for the
            # kernel's connect timeout (minutes).
            async with asyncio.timeout(self.app.settings.repl_timeout):
                await asyncio.get_running_loop().create_connection(
                    lambda: self, self.host, self.port, **self._tls_options())
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
        transport.write(b"".join(resp_command(c) for c in commands + [self._announce()]))

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
            if app.rules_store is None:     # else the replica follows the store itself
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
            snapshot.load_sections(copy.sections, app.store, app.rule_engine, renumber,
                                   windows=app.windows.store)
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
                                   deletes=True, windows=app.windows.store)
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
            self.transport.write(resp_command(
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


def resp_command(args: list[bytes]) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
