"""This tier's links to the other regions' tiers (README, "Regions"): each
sends its peer the batches of spends of global rules (wire.py) as
``CL.REGIONSYNC`` commands over RESP, as a replica's link does: AUTH as
region-user, TLS with tls-regions, backoff while down (FailureLog).

A batch stays queued until the peer acknowledges its sequence number, and
is sent again after a reconnect; the peer applies each number once per
run of this server, so nothing is counted twice.  The queue is bounded by
region-buffer-limit: past it the oldest batches are dropped and counted.
A PING while nothing is outstanding keeps the link's last reply fresh, so
a peer that went silent is seen within region-partition-ms.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

import hiredis

from fastlimit.regions.shares import PeerAddress
from fastlimit.regions.wire import encode_batches
from fastlimit.replication.replica import FailureLog, RetryingLink, resp_command
from fastlimit.server.subsystem import info_text

PING = resp_command([b"PING"])
SENTINEL_TIMEOUT_S = 2.0      # each sentinel asked, before the next one
# A batch the peer could not read: resent, it would be refused again.
UNREADABLE = "ERR CL.REGIONSYNC: "


class PeerLink(RetryingLink):
    def __init__(self, owner, name: str, address: PeerAddress, incarnation: int):
        self.owner = owner              # the RegionsSubsystem
        self.app = owner.app
        # what the peer applies each sequence number once per (run): this
        # server's run id and this link's incarnation (a link made again,
        # after a change of its address, numbers its batches from 1 again)
        self.incarnation = incarnation
        self.name, self.address = name, address
        # where the link goes: the address's, or the primary its sentinels
        # named at the last connect
        self.host, self.port = address.host, address.port
        self.state = "connect"
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()
        self.failures = FailureLog(owner.log)
        self.seq = 0
        self.queue: deque[tuple[int, bytes, float]] = deque()   # (seq, batch, sent at)
        self.queued_bytes = 0
        self.unsent = 0                 # the queue's tail not yet written on this connection
        # what each outstanding reply answers: a batch's seq, 0 (AUTH, PING),
        # or a call()'s function
        self.expect: deque = deque()
        # the peer's last answer (reachability); at first the link's making,
        # a grace of region-partition-ms before the peer counts as unreachable
        self.last_reply = time.monotonic()
        self.connected_at = 0.0
        self.up_since: float | None = None
        self.bytes_sent = 0
        self.batches_acked = 0
        self.batches_dropped = 0
        self.lag_ms = 0.0               # the last acknowledged batch's round trip
        self.lag_max_ms = 0.0           # the longest one
        self.last_error = ""
        self._stopped = False
        self._retry: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    # ---- connecting ------------------------------------------------------------------

    async def _connect(self) -> None:
        self.state = "connecting"
        timeout = self.app.settings.repl_timeout
        tls = self.app.tls.client if self.app.settings.tls_regions else None
        try:
            if self.address.service is not None:
                async with asyncio.timeout(timeout):
                    self.host, self.port = await self._ask_sentinels()
            options = {"ssl": tls, "server_hostname": self.host} if tls is not None else {}
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().create_connection(
                    lambda: self, self.host, self.port, **options)
        except TimeoutError:
            self._failed("connect timed out")
        except (OSError, LookupError) as e:
            self._failed(str(getattr(e, "strerror", None) or e))
        except Exception as e:      # a bad host name, say: retried like any failure
            self._failed(repr(e))

    async def _ask_sentinels(self) -> tuple[str, int]:
        """The peer's primary, as the first sentinel that knows its service
        says (SENTINEL GET-MASTER-ADDR-BY-NAME); LookupError if none does."""
        service = self.address.service
        assert service is not None
        for host, port in self.address.sentinels:
            try:
                async with asyncio.timeout(SENTINEL_TIMEOUT_S):
                    reader, writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                continue
            try:
                writer.write(resp_command([b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME",
                                           service.encode()]))
                parser = hiredis.Reader()
                reply = False
                while reply is False:
                    async with asyncio.timeout(SENTINEL_TIMEOUT_S):
                        data = await reader.read(4096)
                    if not data:
                        break
                    parser.feed(data)
                    reply = parser.gets()
                if isinstance(reply, list) and len(reply) == 2 and reply[1].isdigit():
                    return reply[0].decode(), int(reply[1])
            except (OSError, TimeoutError, hiredis.ProtocolError):
                pass
            finally:
                writer.close()
        raise LookupError(f"no sentinel of {self.address} names the primary of '{service}'")

    def _failed(self, why: str) -> None:
        self.last_error = info_text(why)
        self.failures.failed(logging.WARNING, f"region link to {self.name} "
                                              f"({self.host}:{self.port}): {why}")
        if self.transport is not None:
            self.state = "failed"        # connection_lost keeps this error, not its own
            self.transport.abort()
        else:
            self._later()

    # ---- asyncio callbacks -------------------------------------------------------------

    def connection_made(self, transport) -> None:
        if self._stopped:
            transport.abort()
            return
        self.transport = transport
        self.state = "handshake"
        self.reader = hiredis.Reader()
        self.expect.clear()
        self.unsent = len(self.queue)       # every unacknowledged batch goes again
        auth = self._auth()
        if auth:
            self.expect.append(0)
            transport.write(auth)
        self.state = "up"
        self.connected_at = time.monotonic()     # silence counts from here (tick)
        self.flush()

    def _auth(self) -> bytes:
        s = self.app.settings
        if not s.region_password:
            return b""
        user = [s.region_user.encode("utf-8", "surrogateescape")] if s.region_user else []
        return resp_command([b"AUTH", *user, s.region_password])

    def connection_lost(self, exc) -> None:
        self.transport = None
        pending, self.expect = self.expect, deque()
        for expected in pending:       # calls that will have no answer
            if callable(expected):
                expected(None)
        if self.state == "up" and not self._stopped:
            why = info_text(str(exc)) if exc is not None else "closed by the peer"
            self.last_error = why
            if self.up_since is None:       # closed before it ever answered: back off
                self.failures.failed(logging.WARNING, f"region link to {self.name} "
                                     f"({self.host}:{self.port}) closed before the peer "
                                     f"answered: {why}")
            else:
                self.owner.log.warning("lost the region link to %s (%s:%d): %s", self.name,
                                       self.host, self.port, why)
        self.up_since = None
        if not self._stopped:
            self._later()

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while self.state == "up" and (reply := self.reader.gets()) is not False:
                self._answered(reply)
        except (hiredis.ProtocolError, IndexError) as e:
            self._failed(f"unreadable reply: {e}")

    def _answered(self, reply) -> None:
        expected = self.expect.popleft()
        if callable(expected):        # a call()'s answer, whatever it is
            self.last_reply = time.monotonic()
            expected(reply)
            return
        if isinstance(reply, hiredis.ReplyError):
            if expected and str(reply).startswith(UNREADABLE):
                self._drop(expected, str(reply))     # sent again, it would be refused again
                return
            self._failed(f"the peer refused: {info_text(str(reply))}")
            return
        self.last_reply = now = time.monotonic()
        if self.up_since is None:
            self.up_since = now
            self.owner.log.warning("region link to %s (%s:%d) is up", self.name, self.host,
                                   self.port)
        if reply != b"OK":           # a batch's acknowledgement or PING's: working
            self.failures.recovered()
        if expected and isinstance(reply, int):
            while self.queue and self.queue[0][0] <= reply:
                _, batch, sent_at = self.queue.popleft()
                self.queued_bytes -= len(batch)
                self.batches_acked += 1
                self.lag_ms = (now - sent_at) * 1000
                self.lag_max_ms = max(self.lag_max_ms, self.lag_ms)
            self.unsent = min(self.unsent, len(self.queue))

    def _drop(self, seq: int, why: str) -> None:
        """Drops a batch the peer cannot read (counted), so that the batches
        behind it go on."""
        for i, (queued, batch, _) in enumerate(self.queue):
            if queued == seq:
                del self.queue[i]
                self.queued_bytes -= len(batch)
                self.batches_dropped += 1
                self.unsent = min(self.unsent, len(self.queue))
                self.last_error = info_text(why)
                self.owner.log.warning("region link to %s dropped batch %d: %s", self.name,
                                       seq, info_text(why))
                return

    # ---- sending ---------------------------------------------------------------------------

    def enqueue(self, batch: bytes) -> None:
        """Queues a batch (sent at once when the link is up); drops the
        oldest past region-buffer-limit."""
        self.seq += 1
        self.queue.append((self.seq, batch, 0.0))
        self.queued_bytes += len(batch)
        self.unsent += 1
        limit = self.app.settings.region_buffer_limit
        while self.queued_bytes > limit and len(self.queue) > 1:
            _, dropped, _ = self.queue.popleft()
            self.queued_bytes -= len(dropped)
            self.batches_dropped += 1
            self.unsent = min(self.unsent, len(self.queue))
        self.flush()

    def flush(self) -> None:
        """Writes the batches not yet written on this connection."""
        if self.transport is None or self.state != "up" or not self.unsent:
            return
        origin = self.owner.origin
        run = b"%s.%d" % (self.app.run_id.encode(), self.incarnation)
        now = time.monotonic()
        first = len(self.queue) - self.unsent
        for i in range(first, len(self.queue)):
            seq, batch, _ = self.queue[i]
            self.queue[i] = (seq, batch, now)
            data = resp_command([b"CL.REGIONSYNC", origin, run, b"%d" % seq, batch])
            self.transport.write(data)
            self.bytes_sent += len(data)
            self.expect.append(seq)
        self.unsent = 0

    def send_spends(self, spends: Mapping[tuple[int, bytes], int], names: Mapping[int, str],
                    route: Callable[[int, bytes], bytes]) -> int:
        """The spends, cut into batches (wire.py) and queued; how many.
        (route is a cluster's: cluster_peer.py.)"""
        queued = 0
        for batch in encode_batches(spends, names):
            self.enqueue(batch)
            queued += 1
        return queued

    def call(self, args: list[bytes], answered, route_key: bytes | None = None) -> None:
        """Sends a command whose answer goes to answered(reply) (a reply
        error included); answered(None) at once if the link is not up.
        Not sent again after a reconnect: the caller's round ends.
        (route_key is a cluster's: cluster_peer.py.)"""
        if self.transport is None or self.state != "up":
            answered(None)
            return
        data = resp_command(args)
        self.transport.write(data)
        self.bytes_sent += len(data)
        self.expect.append(answered)

    def tick(self) -> None:
        """A PING when nothing is outstanding, so silence shows; a link
        whose replies stopped for repl-timeout is dropped."""
        if self.transport is None or self.state != "up":
            return
        if time.monotonic() - max(self.last_reply, self.connected_at) > \
                self.app.settings.repl_timeout:
            self._failed(f"silent for {self.app.settings.repl_timeout} s")
        elif not self.expect:
            self.expect.append(0)
            self.transport.write(PING)

    # ---- what it shows ---------------------------------------------------------------------

    def reachable(self, within_s: float) -> bool:
        """Whether the peer answered within the last within_s seconds (or
        the link started that recently)."""
        return time.monotonic() - self.last_reply <= within_s

    @property
    def shown_state(self) -> str:
        """up once the peer answered on this connection; before, how far
        the link got (connect, connecting, handshake)."""
        if self.up_since is not None:
            return "up"
        return "handshake" if self.state == "up" else self.state

    def info(self) -> str:
        via = f"via=sentinel:{self.address.service}," if self.address.service else ""
        return (f"name={self.name},host={self.host},port={self.port},{via}"
                f"state={self.shown_state},"
                f"last_reply_ms={int((time.monotonic() - self.last_reply) * 1000)},"
                f"lag_ms={self.lag_ms:.1f},lag_max_ms={self.lag_max_ms:.1f},"
                f"queued_batches={len(self.queue)},"
                f"queued_bytes={self.queued_bytes},bytes_sent={self.bytes_sent},"
                f"batches_acked={self.batches_acked},batches_dropped={self.batches_dropped},"
                f"failures={self.failures.run},last_error={self.last_error}")
