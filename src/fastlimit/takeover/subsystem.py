"""Takeover as a subsystem: every listener of the server opens through it
(so a heir finds the inherited sockets, and a donor knows what to hand
over), the takeover-socket where a heir asks, and the heir's takeover
itself ("copy, pause, flip", as cluster/reshard.py moves slots):

1. Copy.  ``--takeover <socket>``: the heir takes the donor's offer
   before anything else starts (heir.ask_to_take_over), opens its
   listeners on the inherited sockets without accepting, and follows the
   donor as a replica (heir.HandoverLink): the full copy, then the stream,
   while the donor serves.
2. Pause.  Once in sync it says ready; the donor pauses every client at
   a command boundary, flushes its last changes down the link, lets go of
   rules-db (one process holds it) and says up to which offset (donor.py).
3. Flip.  The heir applies the stream to that offset, opens rules-db,
   takes a cluster node's routing as the donor had it (the paused
   message's cluster: Cluster.handover_state), promotes itself keeping
   the donor's replication id and offset (the same data set at the same
   offset, as Redis keeps them across a restart that loads them), starts
   accepting on every listener, and says flipped; the donor then passes
   its client connections, each at a command boundary with its state
   (connections.py), closes the others after their last complete reply
   and exits 0.

The pause lasts from the donor's pause to the heir's accepting; it is
measured (INFO server, takeover_pause_ms).  Before the flip, a failure
anywhere leaves the donor serving (donor.Donation.end) and the heir exits
with the reason.  The client connections pass only after the flip, to
a process committed to serving.  The HTTP and gRPC connections are held
at the pause too (donor.hold_http_and_grpc) and closed unanswered at the
donor's exit, a gRPC one with a GOAWAY: a client that retries on a closed
connection reaches the heir.  What the hold misses (a connection accepted
during the pause) finds the donor read-only, so that a check it spends is
refused (READONLY) rather than made where the heir would never see it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastlimit.cluster.slot_map import MapError
from fastlimit.rules.model import RuleError
from fastlimit.server.subsystem import Subsystem, start_accepting
from fastlimit.takeover import connections, wire
from fastlimit.takeover.donor import PAUSE_TIMEOUT_S, Donation
from fastlimit.takeover.heir import (
    HandoverLink,
    Inheritance,
    ListenerKey,
    TakeoverError,
    ask_to_take_over,
)

TAKEOVER_FRONT = "takeover"      # the takeover-socket's own key among the listeners
# The heir gives up on the donor's last changes well before the donor would
# kill it for not flipping (PAUSE_TIMEOUT_S): a takeover that fails there
# ends with its reason, not a kill.
CATCH_UP_TIMEOUT_S = PAUSE_TIMEOUT_S / 2
# A shutdown asked for (SIGTERM sets no event the takeover waits on) is
# noticed within this long.
STOP_CHECK_S = 0.1
# A failed takeover: how long the heir waits to see whether the donor is
# exiting (then it serves) before it exits itself.
DONOR_EXIT_WAIT_S = 2.0


@dataclass
class Listener:
    key: ListenerKey
    server: asyncio.Server


class Takeover(Subsystem):
    def __init__(self, app, log):
        self.app = app
        self.log = log
        self.listeners: list[Listener] = []     # every listener opened, closed ones too
        self.unix_server: asyncio.Server | None = None
        self.donation: Donation | None = None
        # The heir's: what the donor handed over, until the flip.
        self.inheritance: Inheritance | None = None
        self.inherited: dict[ListenerKey, list[socket.socket]] = {}
        self.from_pid = 0
        self.pause_ms: float | None = None
        self.total_ms: float | None = None
        self.connections = (0, 0)      # client connections passed here, closed by the donor
        if app.settings.takeover_from:
            self.inheritance = ask_to_take_over(app.settings.takeover_from)
            self.inherited = self.inheritance.sockets

    @property
    def inheriting(self) -> bool:
        """A heir before its flip: it accepts on no listener yet."""
        return self.inheritance is not None

    # ---- the listeners ------------------------------------------------------------------

    async def listen(self, loop: asyncio.AbstractEventLoop, factory: Callable, front: str,
                     host: str, port: int, tls: bool, serve: bool) -> list[asyncio.Server]:
        """A front's listeners on host:port: on the sockets a donor handed
        over for them, else bound here; accepting when serve, unless a
        takeover is under way (its flip starts them)."""
        socks = self.inherited.pop((front, host, port, tls), None)
        if socks:
            servers = [await loop.create_server(factory, sock=sock, backlog=511,
                                                start_serving=False) for sock in socks]
        else:
            servers = [await loop.create_server(factory, host, port, reuse_address=True,
                                                backlog=511, start_serving=False)]
        for server in servers:
            self.noted(front, host, tls, server)
            if serve and not self.inheriting:
                await start_accepting(server)
        return servers

    def noted(self, front: str, host: str, tls: bool, server: asyncio.Server) -> None:
        """A listener to hand over in a takeover (and to start at the flip)."""
        port = server.sockets[0].getsockname()[1] if server.sockets else 0
        self.listeners.append(Listener((front, host, port, tls), server))

    def open_listeners(self) -> list[tuple[ListenerKey, int]]:
        """Every listening socket still open, with the takeover-socket's
        last: (whose, descriptor)."""
        self.listeners = [lst for lst in self.listeners if lst.server.sockets]
        out = [(lst.key, sock.fileno()) for lst in self.listeners for sock in lst.server.sockets]
        if self.unix_server is not None:
            path = self.app.settings.takeover_socket
            out += [((TAKEOVER_FRONT, path, 0, False), sock.fileno())
                    for sock in self.unix_server.sockets]
        return out

    def stop_accepting(self) -> None:
        """This process's listeners close (the sockets live on in the
        heir's, which accepts on them)."""
        for listener in self.listeners:
            listener.server.close()
        if self.unix_server is not None:
            self.unix_server.close()

    # ---- the donor's side ---------------------------------------------------------------

    async def start(self) -> None:
        if self.inheritance is not None:
            await self._take_over(self.inheritance)
        await self._listen_for_heirs()
        self._close_unclaimed()

    async def _listen_for_heirs(self) -> None:
        path = self.app.settings.takeover_socket
        if not path:
            return
        socks = self.inherited.pop((TAKEOVER_FRONT, path, 0, False), None)
        sock = socks[0] if socks else _bound_unix_socket(path)
        self.unix_server = await asyncio.get_running_loop().create_unix_server(
            lambda: Donation(self), sock=sock)
        self.log.info("takeover socket %s: a new process may take over from this one", path)

    def refusal(self, donation: Donation) -> str | None:
        """Why this server cannot hand over now, or None: then donation
        is the takeover under way."""
        if self.donation is not None:
            return f"a takeover by pid {self.donation.heir_pid} is under way"
        why = self.cannot_hand_over()
        if why is None:
            self.donation = donation
        return why

    def cannot_hand_over(self) -> str | None:
        """Why this server cannot be taken over now, or None: asked at the
        hello, and again at the pause (either may have begun since)."""
        if self.app.replication.link is not None:
            return "this server is a replica: a takeover hands over a primary"
        if self.app.reshard.task is not None:
            return "a slot move is under way (CL.CLUSTER MOVE): take over once it ends"
        return None

    def donation_ended(self, donation: Donation) -> None:
        if self.donation is donation:
            self.donation = None

    # ---- the heir's side ----------------------------------------------------------------

    async def _take_over(self, inheritance: Inheritance) -> None:
        """Copy, pause, flip (see the module docstring); TakeoverError, the
        donor serving on, if it fails before the flip."""
        loop = asyncio.get_running_loop()
        control = Control(inheritance.reader)
        await loop.create_unix_connection(lambda: control, sock=inheritance.control)
        progress = asyncio.Event()
        link = HandoverLink(self.app.replication, inheritance.donor_pid, inheritance.link,
                            progress)
        control.progress = progress
        self.app.replication.follow_link(link)
        try:
            paused_at = await self._copy_pause_flip(link, control)
        except TakeoverError as e:
            control.send("failed", reason=str(e))
            control.close()
            await self._serve_if_donor_gone(inheritance.donor_pid, e)
        else:
            self.pause_ms = round((time.monotonic() - paused_at) * 1000, 3)
            # The client connections come next, with descriptors, which the
            # loop's transport cannot receive: it reads no more.
            control.stop_reading()
            control.send("flipped", pause_ms=self.pause_ms)
            await self._adopt_connections(control)
            control.close()
        self._served(inheritance)

    async def _adopt_connections(self, control: Control) -> None:
        """The donor's client connections, passed once this process serves."""
        try:
            sock = control.socket()
        except OSError as e:
            self.log.error("takeover: no client connections passed: %s", e)
            return
        with sock:
            self.connections = await connections.adopt_connections(self.app, sock,
                                                                   control.reader, self.log)

    async def _copy_pause_flip(self, link: HandoverLink, control: Control) -> float:
        """The takeover proper, up to accepting; when the donor's pause
        began (its monotonic clock, which is this machine's)."""
        await self._until(lambda: link.state == "connected", link, control, None,
                          "the full copy")
        control.send("ready", offset=link.offset)
        paused = await self._until(lambda: control.message("paused"), link, control, None,
                                   "the pause")
        await self._until(lambda: link.offset >= paused["offset"], link, control,
                          CATCH_UP_TIMEOUT_S, "the stream's last offset")
        self._take_rules_db()
        self._take_cluster_state(paused.get("cluster"))
        replid = link.master_replid
        self.app.replication.promote()
        # The same data set at the same offset: the donor's replication id
        # goes on, as Redis keeps it across a restart that loads its data.
        self.app.replication.replid = replid
        await self._accept()
        return paused["paused_at"]

    async def _serve_if_donor_gone(self, donor_pid: int, why: TakeoverError) -> None:
        """A takeover that failed before the flip: the heir exits (raises
        why) while the donor lives, which serves on; if the donor is gone
        (it died, or was stopped, during the takeover), the heir serves
        what it has, since it holds the listeners: never neither."""
        if not await _gone(donor_pid, DONOR_EXIT_WAIT_S):
            raise why
        self.log.error("the running server (pid %d) is gone before the flip (%s): serving the "
                       "buckets replicated so far", donor_pid, why)
        self._take_rules_db()
        self.app.replication.promote()      # data of its own now: a new replication id
        await self._accept()

    async def _accept(self) -> None:
        for listener in self.listeners:
            await start_accepting(listener.server)

    def _served(self, inheritance: Inheritance) -> None:
        """The heir serves: what INFO server says of its takeover from now on."""
        self.total_ms = round((time.monotonic() - inheritance.asked_at) * 1000, 3)
        self.from_pid, self.inheritance = inheritance.donor_pid, None
        self.log.warning("took over from pid %d: pause %s ms, %.1f ms in all, %d buckets, "
                         "%d client connections passed, %d closed", self.from_pid,
                         self.pause_ms, self.total_ms, self.app.bucket_count(), *self.connections)

    async def _until(self, done: Callable, link: HandoverLink, control: Control,
                     timeout: float | None, what: str):
        """Waits for done() to be true (its value), as frames and messages
        arrive; TakeoverError if the link or the donor fails first, this
        process is asked to stop (SIGTERM: the donor serves on), or after
        timeout seconds."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not (value := done()):
            failure = link.broken or control.failure or (
                "this process was asked to stop" if self.app.stopping else None)
            if failure is not None:
                raise TakeoverError(f"waiting for {what}: {failure}")
            left = STOP_CHECK_S if deadline is None else min(deadline - loop.time(), STOP_CHECK_S)
            try:
                async with asyncio.timeout(max(left, 0)):
                    await link.progress.wait()
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    raise TakeoverError(f"{what} did not come within {timeout:g} s") from None
            link.progress.clear()
        return value

    def _take_cluster_state(self, doc: dict | None) -> None:
        """A cluster node's routing as the donor had it at its pause."""
        try:
            self.app.cluster.take_handover_state(doc)
        except MapError as e:
            raise TakeoverError(f"the slot map the running server installed: {e}") from None

    def _take_rules_db(self) -> None:
        """rules-db, which the donor let go at its pause (holding the same
        rules as the stream brought here)."""
        try:
            self.app.rules.store = self.app.open_rules_db()
        except RuleError as e:
            raise TakeoverError(str(e)) from None

    def _close_unclaimed(self) -> None:
        """The sockets handed over that no listener here took (a front
        this configuration turns off): closed, nobody accepts on them."""
        for socks in self.inherited.values():
            for sock in socks:
                sock.close()
        self.inherited = {}

    async def stop(self) -> None:
        if self.donation is not None:
            self.donation.end("this server is shutting down")
        if self.unix_server is not None:
            self.unix_server.close()

    def info_sections(self, sections, named):
        if "server" not in sections:
            return {}
        started_ms = (time.time() - (time.monotonic() - self.app.started)) * 1000
        return {"server": {
            "process_started_ms": int(started_ms),
            "takeover_from_pid": self.from_pid,
            "takeover_pause_ms": self.pause_ms if self.pause_ms is not None else -1,
            "takeover_total_ms": self.total_ms if self.total_ms is not None else -1,
            "takeover_connections_passed": self.connections[0],
            "takeover_connections_closed": self.connections[1],
            # a new process answers nothing before its flip: only a donor's shows
            "takeover_handing_over": int(self.donation is not None)}}


class Control(asyncio.Protocol):
    """The heir's end of the takeover-socket, after the offer: the
    donor's messages, and whether it went away."""

    def __init__(self, reader: wire.Reader):
        self.reader = reader
        self.transport: asyncio.Transport | None = None
        self.received: dict[str, dict] = {}
        self.failure: str | None = None
        self.progress: asyncio.Event | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.data_received(b"")       # what came with the offer

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (message := self.reader.next()) is not None:
                if message["kind"] == "failed":
                    self.failure = f"the running server gave up: {message.get('reason')}"
                self.received[message["kind"]] = message
        except wire.WireError as e:
            self.failure = str(e)
        self._woken()

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.failure = self.failure or "the running server closed the takeover socket"
        self._woken()

    def _woken(self) -> None:
        if self.progress is not None:
            self.progress.set()

    def message(self, kind: str) -> dict | None:
        return self.received.get(kind)

    def send(self, kind: str, **fields) -> None:
        if self.transport is not None:
            self.transport.write(wire.encode(kind, **fields))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def stop_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def socket(self) -> socket.socket:
        """A duplicate of the connection's socket, to receive descriptors on."""
        if self.transport is None:
            raise OSError("the running server closed the takeover socket")
        return socket.socket(fileno=os.dup(self.transport.get_extra_info("socket").fileno()))


def _bound_unix_socket(path: str) -> socket.socket:
    """A listening Unix socket at path, for this server's owner only: a
    socket left there by a server that is gone is replaced, one that
    answers is not (OSError)."""
    if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)
            else:
                raise OSError(f"takeover-socket {path}: another server listens there")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_mask = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old_mask)
        sock.listen(16)
    except OSError:
        sock.close()
        raise
    return sock


async def _gone(pid: int, within: float) -> bool:
    """Whether process pid has exited (or is a zombie) within that many
    seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
