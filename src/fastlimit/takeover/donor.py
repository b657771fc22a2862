"""The donor's side of a takeover: a connection to the running server's
takeover-socket from a heir (wire.py says the messages).

    hello  -> the versions checked; refused, or the offer: every listening
              socket and one end of a socket pair, whose other end becomes
              a replica link here (the full copy, then the stream)
    ready  -> every client paused at a command boundary
              (ServerCore.pause_clients), the last changes flushed down the
              link, and paused says the stream's last offset (and, for
              a cluster node, its routing: Cluster.handover_state)
    flipped-> the heir serves: this server passes it the client
              connections at their command boundary (connections.py),
              closes the others after their last complete reply and exits
              (no snapshot: the heir's state is newer)

Until flipped, whatever ends the takeover (the heir's failed, the heir
gone, a pause not flipped within PAUSE_TIMEOUT_S) resumes the clients,
and this server serves on as if nothing happened; a heir that does not
flip in time is killed first, so that never both serve.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import time
from collections.abc import Sequence
from typing import cast

from fastlimit._protocol import Connection
from fastlimit.rules.model import RuleError
from fastlimit.takeover import connections, wire

# A pause the heir has not ended by flipping within this long ends here:
# the heir is killed and this server serves on.
PAUSE_TIMEOUT_S = 5.0
_PEERCRED = struct.Struct("3i")      # pid, uid, gid


class Donation(asyncio.Protocol):
    """One takeover, as the running server sees it."""

    def __init__(self, takeover):
        self.takeover = takeover      # subsystem.Takeover
        self.app = takeover.app
        self.log = takeover.log
        self.reader = wire.Reader()
        self.transport: asyncio.Transport | None = None
        self.state = "hello"          # then offering, offered, paused; done, or ended
        self.heir_pid = 0
        self.link: Connection | None = None
        self.paused_at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # ---- asyncio callbacks ------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self.heir_pid = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))[0]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (message := self.reader.next()) is not None:
                self._handle(message)
        except wire.WireError as e:
            self.end(str(e))

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.state == "hello":      # nothing began (a probe of the socket, say)
            self.state = "ended"
            return
        self.end("the new process closed the takeover socket (it exited?)")

    # ---- the steps ----------------------------------------------------------------------

    def _handle(self, message: dict) -> None:
        kind = message["kind"]
        if kind == "failed":
            self.end(f"the new process gave up: {message.get('reason')}")
        elif (self.state, kind) == ("hello", "hello"):
            self.state = "offering"
            asyncio.ensure_future(self._answer(message))
        elif (self.state, kind) == ("offered", "ready"):
            why = self.takeover.cannot_hand_over()
            if why is None:
                self._pause()
            else:
                self.end(why)
        elif (self.state, kind) == ("paused", "flipped"):
            self._handed_over(message)
        else:
            self.end(f"a {kind} message came while {self.state}")

    async def _answer(self, hello: dict) -> None:
        why = wire.incompatibility(hello) or self.takeover.refusal(self)
        try:
            if why is None:
                await self._offer()
                return
            self._send(wire.encode("refused", reason=why))
        except (OSError, wire.WireError) as e:
            self.end(f"the offer could not be made: {e}")
            return
        self.state = "ended"
        self.takeover.donation_ended(self)
        self.log.warning("takeover by pid %d refused: %s; serving on", self.heir_pid, why)
        if self.transport is not None:
            self.transport.close()

    async def _offer(self) -> None:
        listeners = self.takeover.open_listeners()
        mine, theirs = socket.socketpair()
        try:
            self.link = await self._replica_link(mine)
            self._send(wire.encode("offer", **wire.versions(), pid=os.getpid(),
                                   listeners=[key for key, _ in listeners]),
                       [fd for _, fd in listeners] + [theirs.fileno()])
        finally:
            theirs.close()
        self.state = "offered"
        self.log.warning("takeover by pid %d: %d listening sockets handed over; it follows "
                         "this server as a replica", self.heir_pid, len(listeners))

    async def _replica_link(self, sock: socket.socket) -> Connection:
        """A client connection on our end of the pair, authenticated as
        replication's user (the takeover-socket's permissions are the
        gate): the heir sends CL.SYNC on it, as a replica does."""
        app = self.app
        conn = Connection(app.core)
        await asyncio.get_running_loop().connect_accepted_socket(
            lambda: cast(asyncio.BaseProtocol, conn), sock)
        settings = app.settings
        user = (app.acl.users.get(settings.repl_user) if settings.repl_password else None)
        conn.set_user(user or app.acl.default, True)
        return conn

    def _pause(self) -> None:
        """No client command runs from here on; the last changes go down
        the link, the rules database is let go (it takes one process at a
        time: the heir opens it next), and the heir is told up to which
        offset to apply."""
        repl = self.app.replication
        self.app.core.pause_clients()
        hold_http_and_grpc(self.app)
        # What the hold does not stop (a connection accepted during the
        # pause, a request read before it that waited for its turn) may read
        # but not spend: READONLY, as on a replica, rather than a change
        # the heir would never see.
        self.app.core.readonly = True
        self.paused_at = time.monotonic()
        self.state = "paused"
        repl.flush()
        self.app.rules.close()
        self.app.rules.store = None
        self._send(wire.encode("paused", offset=repl.offset, paused_at=self.paused_at,
                               cluster=self.app.cluster.handover_state()))
        self._timer = asyncio.get_running_loop().call_later(PAUSE_TIMEOUT_S, self._too_long)

    def _too_long(self) -> None:
        self._timer = None
        try:
            os.kill(self.heir_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.end(f"the new process did not flip within {PAUSE_TIMEOUT_S:g} s of the pause; "
                 f"it was killed")

    def _handed_over(self, message: dict) -> None:
        self._cancel_timer()
        self.state = "done"
        self.takeover.stop_accepting()     # the heir accepts on the same sockets now
        # gRPC clients open their next streams to the heir from now on
        self.app.grpc.announce_shutdown()
        self.log.warning("handed over to pid %d (pause %s ms): passing the client connections, "
                         "then exiting", self.heir_pid, message.get("pause_ms"))
        asyncio.ensure_future(self._pass_connections())

    async def _pass_connections(self) -> None:
        """The client connections to the heir (connections.py), then the
        exit, which closes those not passed after their last reply."""
        try:
            with self._control_socket() as control:
                passed, closed = await connections.pass_connections(self.app, control,
                                                                    self.link, self.log)
            self.log.warning("%d client connections passed to pid %d, %d closed", passed,
                             self.heir_pid, closed)
        except wire.WireError as e:
            self.log.error("takeover: no client connection passed (%s): they are closed", e)
        finally:
            self.app.request_shutdown(save=False)

    def end(self, why: str) -> None:
        """The takeover stops before the flip: clients resume, this
        server serves on."""
        if self.state in ("done", "ended"):
            return
        self._cancel_timer()
        if self.state == "paused":
            self._take_rules_db_back()
            self.app.core.readonly = False
            self.app.core.resume_clients()
            release_http_and_grpc(self.app)
        self.state = "ended"
        if self.link is not None:
            self.link.abort()
        if self.transport is not None:
            self.transport.close()
        self.takeover.donation_ended(self)
        self.log.warning("takeover by pid %d failed before the flip: %s; this server serves on",
                         self.heir_pid, why)

    def _take_rules_db_back(self) -> None:
        try:
            self.app.rules.store = self.app.open_rules_db()
        except RuleError as e:     # the heir, gone, held it: the lock went with it
            self.log.error("takeover: rules-db could not be opened again (%s); rule changes "
                           "are not persisted until a restart", e)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _send(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """A message to the heir, with descriptors."""
        with self._control_socket() as sock:
            wire.send(sock, data, fds)

    def _control_socket(self) -> socket.socket:
        """A duplicate of the connection's socket (the loop's transport
        cannot pass descriptors), which shares its non-blocking mode and
        its order."""
        if self.transport is None:
            raise wire.WireError("the new process is gone")
        return socket.socket(fileno=os.dup(self.transport.get_extra_info("socket").fileno()))


def http_and_grpc_connections(app) -> list:
    return [*app.http.shared.connections, *app.grpc.shared.connections]


def hold_http_and_grpc(app) -> None:
    """The pause for the HTTP and gRPC connections, which cannot be
    passed: each reads nothing more, so a request sent from now on waits
    unread in its socket.  After the flip this process closes them
    unanswered at its exit (a gRPC one with a GOAWAY naming the last
    stream it read): a client that retries on a closed connection reaches
    the heir and is counted once there.  Their flow control's
    pause_writing is the hold (it stops reading until resume_writing)."""
    for conn in http_and_grpc_connections(app):
        conn.pause_writing()


def release_http_and_grpc(app) -> None:
    """A failed takeover's end: they read and answer again."""
    for conn in http_and_grpc_connections(app):
        conn.resume_writing()
