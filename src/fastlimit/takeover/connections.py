"""Client connections passed at the flip (wire.py's connections and
connections_end): after the heir said flipped, so that they go only to a
process committed to serving, the donor passes each RESP connection that
stands at a command boundary, with what its client set and the input it
sent that did not run (the pause kept it unread); the heir adopts each
one, restores it, and runs that input first: the client's TCP connection
just goes on, every reply once and in order.

Not passed, but closed after their last complete reply as before
(why_not_passed): a connection in MULTI or WATCHing keys, one whose reply
is being made (sliced or awaited), a replica link, MONITOR, a TLS
connection (its session keys stay in this process), one whose replies
are not all written within DRAIN_TIMEOUT_S, one whose state is over
wire.MAX_STATE; and the HTTP and gRPC fronts' connections, which are not
RESP connections.

If the heir dies while connections pass, those it had received die with
it (their clients see the connection close, as after any crash) and the
donor closes the rest: after the flip nothing else can serve them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import cast

from fastlimit._protocol import Connection
from fastlimit.takeover import wire

# A connection's replies are all written out to its socket before it
# passes; one whose client does not read them within this long is closed.
DRAIN_TIMEOUT_S = 1.0
DRAIN_POLL_S = 0.001
# The longest wait for one message of connections, on either side.
SEND_TIMEOUT_S = 5.0


def why_not_passed(conn: Connection) -> str | None:
    """Why this RESP connection cannot be passed, or None when it can."""
    transport = conn.transport
    if conn.is_closed or transport is None:
        return "closing"
    if conn.replica is not None:
        return "a replica link"
    if conn.monitoring:
        return "MONITOR"
    if conn.in_multi or conn.watched_count:
        return "a transaction (MULTI or WATCH)"
    if conn.reply_pending:
        return "a reply being made"
    if transport.get_extra_info("sslcontext") is not None:
        return "TLS"
    return None


# ---- the donor's side -------------------------------------------------------------------

async def pass_connections(app, control: socket.socket, link: Connection | None,
                           log) -> tuple[int, int]:
    """Passes every client connection that can be passed to the heir on
    control (the takeover-socket); (passed, closed).  The others are left
    to the shutdown, which closes them after their last reply, as it does
    link (the heir's replication link: not a client)."""
    clients = [conn for conn in app.core.clients.values() if conn is not link]
    candidates = [conn for conn in clients if why_not_passed(conn) is None]
    drained = await _drained(candidates, DRAIN_TIMEOUT_S)
    # From here to the end nothing yields to the loop: no connection reads
    # or runs anything between the export of its state and its passing.
    passed = [(conn, text) for conn in drained
              if why_not_passed(conn) is None
              and (text := wire.encode_state(conn.export_state())) is not None]
    fds = [_socket_fd(conn) for conn, _ in passed]
    sent = 0
    control.settimeout(SEND_TIMEOUT_S)
    try:
        for message, batch in wire.connection_batches(
                [(fd, text) for fd, (_, text) in zip(fds, passed, strict=True)]):
            wire.send(control, message, batch)
            # Its socket on its way, the connection ends here: the
            # descriptor in the message keeps it open (no FIN, no reset).
            for conn, _ in passed[sent:sent + len(batch)]:
                conn.abort()
            sent += len(batch)
        wire.send(control, wire.encode("connections_end", closed=len(clients) - sent))
    except (OSError, wire.WireError) as e:
        log.error("takeover: passing the client connections failed after %d of %d (%s); "
                  "the rest are closed", sent, len(passed), e)
    finally:
        wire.close_fds(fds)
    return sent, len(clients) - sent


async def _drained(conns: list[Connection], within: float) -> list[Connection]:
    """Those of conns whose replies are all written to their sockets
    within that many seconds."""
    deadline = time.monotonic() + within
    while True:
        waiting = [conn for conn in conns if conn.output_buffer_len]
        if not waiting or time.monotonic() >= deadline:
            return [conn for conn in conns if not conn.output_buffer_len]
        await asyncio.sleep(DRAIN_POLL_S)


def _socket_fd(conn: Connection) -> int:
    """A descriptor of the connection's socket of its own, to pass."""
    return os.dup(cast(asyncio.Transport, conn.transport).get_extra_info("socket").fileno())


# ---- the heir's side ----------------------------------------------------------------------

async def adopt_connections(app, control: socket.socket, reader: wire.Reader,
                            log) -> tuple[int, int]:
    """Takes the connections the donor passes on control until it says
    connections_end, each a client connection here from then on;
    (adopted, closed: by the donor, or here when it could not be
    restored).  A failure of the takeover-socket ends it: what came
    before it stays adopted."""
    adopted = closed = 0
    while True:
        try:
            message, fds = await asyncio.to_thread(wire.receive, control, reader,
                                                   SEND_TIMEOUT_S)
        except wire.WireError as e:
            log.error("takeover: the client connections stopped coming (%s); %d adopted",
                      e, adopted)
            return adopted, closed
        if message["kind"] == "connections_end":
            wire.close_fds(fds)
            return adopted, closed + int(message.get("closed", 0))
        states = message.get("states") if message["kind"] == "connections" else None
        if not isinstance(states, list) or len(states) != len(fds):
            wire.close_fds(fds)
            log.error("takeover: a %s message with %d descriptors where connections were "
                      "expected; the rest are not adopted", message["kind"], len(fds))
            return adopted, closed
        for doc, fd in zip(states, fds, strict=True):
            if await _adopt(app, doc, fd, log):
                adopted += 1
            else:
                closed += 1


async def _adopt(app, doc: dict, fd: int, log) -> bool:
    """One passed connection, restored and served here; False (and the
    socket closed) when it cannot be (a user this configuration lacks,
    maxclients...)."""
    sock = socket.socket(fileno=fd)
    conn = Connection(app.core)
    try:
        state = wire.decode_state(doc)
        conn.restore_state(state, _user(app, state["user"]))
    except (wire.WireError, LookupError, TypeError) as e:
        log.warning("takeover: a client connection could not be restored (%s); closed", e)
        sock.close()
        return False
    await asyncio.get_running_loop().connect_accepted_socket(
        lambda: cast(asyncio.BaseProtocol, conn), sock)
    if conn.is_closed:       # turned away, as a new connection would be (maxclients)
        return False
    app.pubsub.restore(conn, state["channels"], state["patterns"])
    asyncio.get_running_loop().call_soon(conn.next_turn)     # the input it sent first
    return True


def _user(app, name: str | None):
    """The ACL user of that name here (LookupError if there is none)."""
    if name is None:
        return None
    user = app.acl.users.get(name)
    if user is None:
        raise LookupError(f"no ACL user {name!r} here")
    return user
