"""One connection budget for every front: ``maxclients`` counts the RESP,
HTTP and gRPC connections together (``ServerCore.full``), TLS ones from
their accept, and is fitted at start to the file descriptors the process
may open, as Redis's adjustOpenFilesLimit fits it.

A front's connection_made turns a plain connection away with its own
words (``-ERR max number of clients reached``, 503, GOAWAY).  A TLS
connection is judged at accept, before its handshake, since the loop
makes its protocol then but calls connection_made only after the
handshake: over the budget it is closed at once, with no handshake (Redis
drops it the same way); let in, it counts in ``core.handshaking`` until
its handshake ends, whether it succeeded, failed or timed out.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from typing import Any

from fastlimit._tls import TlsConnection

# Descriptors kept for what is not a client (listeners, the rules
# database, snapshots, the loop's own): Redis's CONFIG_MIN_RESERVED_FDS.
RESERVED_FDS = 32
# How much lower each try to raise the limit asks for (Redis's decr_step).
RAISE_STEP = 16


def fit_open_files(maxclients: int, log) -> int:
    """Raises the process's open file limit toward maxclients +
    RESERVED_FDS, as far as the system lets it, and returns the maxclients
    the limit leaves room for (logged when lower, in Redis's words)."""
    wanted = maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return maxclients
    best, error = wanted, None
    while best > soft:
        try:     # above the hard limit, raising both needs privilege
            resource.setrlimit(resource.RLIMIT_NOFILE, (best, _at_least(hard, best)))
            break
        except (OSError, ValueError) as e:
            error = e
        if best < RAISE_STEP:
            best = soft
            break
        best -= RAISE_STEP
    best = max(best, soft)
    if best >= wanted:
        log.info("Increased maximum number of open files to %d (it was originally set to %d).",
                 wanted, soft)
        return maxclients
    if best <= RESERVED_FDS:
        raise OSError(f"the open file limit ('ulimit -n') of {soft} is not enough for the "
                      f"server to start: raise it to at least {wanted}")
    fitted = best - RESERVED_FDS
    reason = getattr(error, "strerror", None) or str(error)
    log.warning("You requested maxclients of %d requiring at least %d max file descriptors.",
                maxclients, wanted)
    log.warning("Server can't set maximum open files to %d because of OS error: %s.",
                wanted, reason)
    log.warning("Current maximum open files is %d. maxclients has been reduced to %d to "
                "compensate for low ulimit. If you need higher maxclients increase "
                "'ulimit -n'.", best, fitted)
    return fitted


def _at_least(limit: int, n: int) -> int:
    return limit if limit == resource.RLIM_INFINITY or limit >= n else n


def protocol_factory(loop: asyncio.AbstractEventLoop, make: Callable[[], Any], core,
                     counters, tls: dict) -> Callable[[], Any]:
    """The protocol factory of a listener: make() for a plain one; for a
    TLS one (tls: the TLS options of Tls.listener_options), the TLS layer
    around make()'s protocol, or, over the budget, a protocol that closes
    the connection.  counters is the front's object with
    rejected_connections (the core, HttpShared, GrpcShared)."""
    if not tls:
        return make

    def handshake_ended(waiter: asyncio.Future) -> None:
        core.handshaking -= 1
        if not waiter.cancelled():
            waiter.exception()     # retrieved: TlsConnection counts failed handshakes

    def factory():
        if core.full():
            counters.rejected_connections += 1
            return Refused()
        core.handshaking += 1
        waiter = loop.create_future()
        waiter.add_done_callback(handshake_ended)
        return TlsConnection(loop, make(), tls["ssl"], waiter, tls["ssl_handshake_timeout"])

    return factory


class Refused(asyncio.Protocol):
    """A TLS connection over maxclients: closed as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
