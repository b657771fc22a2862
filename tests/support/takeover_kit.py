"""A stand-in new process for the takeover tests: the handover's messages
(src/fastlimit/takeover/wire.py) sent by hand on a server's
takeover-socket."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

from fastlimit.takeover import wire as handover


def hello_answer(path: str) -> dict:
    """What the server on the takeover-socket answers a compatible hello
    (descriptors passed with an offer are closed)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        handover.send(s, handover.encode("hello", **handover.versions(), pid=0))
        answer, fds = handover.receive(s, handover.Reader(), 10)
    handover.close_fds(fds)
    return answer


@contextlib.contextmanager
def paused_stand_in(path: str) -> Iterator[tuple[socket.socket, handover.Reader]]:
    """A stand-in new process that said hello (the offer's descriptors
    closed) and ready: the server on path has paused its clients.  Yields
    its socket and reader; the server sees it go when the block ends."""
    with socket.socket(socket.AF_UNIX) as heir:
        heir.connect(path)
        reader = handover.Reader()
        handover.send(heir, handover.encode("hello", **handover.versions(), pid=0))
        handover.close_fds(handover.receive(heir, reader, 10)[1])
        handover.send(heir, handover.encode("ready", offset=0))
        assert handover.receive(heir, reader, 10)[0]["kind"] == "paused"
        yield heir, reader
