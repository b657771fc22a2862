"""The heir's side of a takeover: the process started with ``--takeover
<socket>`` asks the running server (the donor) for its listeners and
buckets (wire.py's hello and offer, blocking, before anything else
starts), follows it as a replica over the socket pair it passed
(HandoverLink), and flips once the donor has paused and the last of its
stream is applied here."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass

from fastlimit.replication.replica import PrimaryLink
from fastlimit.takeover import wire

# The heir's wait for the donor's offer (it is made at once: the full copy
# follows on the replication link).
OFFER_TIMEOUT_S = 10.0

ListenerKey = tuple[str, str, int, bool]     # front, bind host, port, TLS


class TakeoverError(Exception):
    """Why a takeover cannot go on: the heir exits with it, the donor
    serves on."""


@dataclass
class Inheritance:
    """What the donor's offer handed over."""
    donor_pid: int
    control: socket.socket        # the takeover-socket connection, for what follows
    reader: wire.Reader           # with whatever came after the offer
    link: socket.socket           # the heir's end of the replication socket pair
    sockets: dict[ListenerKey, list[socket.socket]]
    asked_at: float               # time.monotonic() of the hello: the takeover's start


def ask_to_take_over(path: str) -> Inheritance:
    """Connects to the donor's takeover-socket, says which versions this
    build speaks and takes the offer; TakeoverError if the donor refuses,
    cannot be reached or speaks an incompatible version (then nothing has
    moved: the donor serves on)."""
    asked_at = time.monotonic()
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        control.settimeout(OFFER_TIMEOUT_S)
        control.connect(path)
        wire.send(control, wire.encode("hello", **wire.versions(), pid=os.getpid()))
        reader = wire.Reader()
        message, fds = wire.receive(control, reader, OFFER_TIMEOUT_S)
    except (OSError, wire.WireError) as e:
        control.close()
        raise TakeoverError(f"cannot take over through {path}: {e}") from None
    try:
        return _accept(message, fds, control, reader, asked_at)
    except (TakeoverError, wire.WireError, OSError):
        wire.close_fds(fds)
        control.close()
        raise


def _accept(message: dict, fds: list[int], control: socket.socket, reader: wire.Reader,
            asked_at: float) -> Inheritance:
    if message["kind"] == "refused":
        raise TakeoverError(f"the running server refused the takeover: {message.get('reason')}")
    if message["kind"] != "offer":
        raise TakeoverError(f"the running server answered {message['kind']!r}, not an offer")
    why = wire.incompatibility(message)
    if why is not None:
        wire.send(control, wire.encode("failed", reason=f"incompatible: {why}"))
        raise TakeoverError(f"the running server is incompatible with this one: {why}")
    listeners = message.get("listeners")
    if not isinstance(listeners, list) or len(fds) != len(listeners) + 1:
        raise TakeoverError(f"the offer named {listeners!r} with {len(fds)} descriptors")
    sockets: dict[ListenerKey, list[socket.socket]] = {}
    for (front, host, port, tls), fd in zip(listeners, fds[:-1], strict=True):
        sockets.setdefault((front, host, port, tls), []).append(socket.socket(fileno=fd))
    return Inheritance(message["pid"], control, reader, socket.socket(fileno=fds[-1]),
                       sockets, asked_at)


class HandoverLink(PrimaryLink):
    """The heir's replication link to the donor, over the socket pair the
    donor passed and authenticated: the full copy, then the stream.  It
    never reconnects: a link that breaks ends the takeover (broken says
    why).  Each frame applied sets progress, which the takeover waits on."""

    def __init__(self, repl, donor_pid: int, sock: socket.socket, progress: asyncio.Event):
        super().__init__(repl, f"takeover-donor-pid-{donor_pid}", 0)
        self.sock = sock
        self.progress = progress
        self.broken: str | None = None

    async def _connect(self) -> None:
        await asyncio.get_running_loop().create_unix_connection(lambda: self, sock=self.sock)

    def _auth(self) -> list[list[bytes]]:
        return []       # the donor's end of the pair is authenticated already

    def _later(self) -> None:
        self.broken = self.broken or "the replication link to the running server closed"
        self.progress.set()

    def _failed(self, level: int, why: str, reach: bool = False) -> None:
        self.broken = why
        super()._failed(level, why, reach)

    def _apply(self, kind: int, payload: memoryview) -> None:
        super()._apply(kind, payload)
        self.progress.set()
