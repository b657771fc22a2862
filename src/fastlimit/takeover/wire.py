"""The handover's messages between the running server (the donor) and the
process taking over from it (the heir), on the donor's takeover-socket:
framing, the compatibility check and the passing of descriptors; no
asyncio.

A message is ``<u32 length><JSON object>`` whose ``kind`` says what it is;
descriptors passed with SCM_RIGHTS ride with the message that names them.
In order:

    hello     heir -> donor   its protocol and snapshot format versions, pid
    refused   donor -> heir   why not (an incompatible version, a takeover
                              already running...); nothing moved
    offer     donor -> heir   its versions and pid, and descriptors: its
                              listening sockets (``listeners`` says whose,
                              in the descriptors' order) and, last, one end
                              of a socket pair on which the heir follows it
                              as a replica (replication/)
    ready     heir -> donor   the full copy is loaded, the stream followed
    paused    donor -> heir   no client command runs here any more; the
                              stream's last offset, when the pause began
                              and ``cluster``: a cluster node's routing
                              (Cluster.handover_state; None otherwise)
    flipped   heir -> donor   it serves (from here on the heir is the server)
    connections donor -> heir  a batch of client connections, each at a
                              command boundary: their sockets as
                              descriptors and, in the same order,
                              ``states`` (encode_state: what the client
                              set, its subscriptions, the input it sent
                              that did not run)
    connections_end donor -> heir  no more; ``closed``: the client
                              connections it closed rather than passed
    failed    either          why the takeover stops (before the flip)

A kind that a side does not know is an error that stops the takeover,
which the version check rules out beforehand (protocol 1 had no
connections: the donor closed its clients at the flip).
"""

from __future__ import annotations

import base64
import json
import socket
import struct
from collections.abc import Iterator, Sequence

from fastlimit.server import snapshot

# The version of this handover protocol; a heir and a donor hand over only
# when they speak the same one.
PROTOCOL = 2
KINDS = frozenset({"hello", "refused", "offer", "ready", "paused", "flipped", "connections",
                   "connections_end", "failed"})
HEADER = struct.Struct("<I")
MAX_MESSAGE = 1 << 20
MAX_FDS = 253            # the kernel's SCM_MAX_FD
# A connection's state, encoded, fits in half a message, so that a batch of
# them always fits; a larger one (a client whose unrun input or
# subscriptions are that large) is closed, not passed.
MAX_STATE = MAX_MESSAGE // 2


class WireError(Exception):
    """A message that cannot be read, or a peer that went away."""


def versions() -> dict[str, int]:
    """What this build speaks: the handover protocol, and the snapshot
    format its full copies are written in."""
    return {"protocol": PROTOCOL, "snapshot_format": snapshot.READABLE[snapshot.MAGIC]}


def incompatibility(theirs: dict) -> str | None:
    """Why a peer with these versions cannot hand over with this one, or
    None when it can: the same handover protocol, and a snapshot format
    this build reads."""
    mine = versions()
    if theirs.get("protocol") != mine["protocol"]:
        return (f"handover protocol version {theirs.get('protocol')!r} on the other side, "
                f"{mine['protocol']} here")
    if theirs.get("snapshot_format") not in snapshot.READABLE.values():
        return (f"snapshot format version {theirs.get('snapshot_format')!r} on the other "
                f"side; this build reads {sorted(snapshot.READABLE.values())}")
    return None


def encode(kind: str, **fields) -> bytes:
    assert kind in KINDS, kind
    body = json.dumps({"kind": kind, **fields}).encode()
    return HEADER.pack(len(body)) + body


def encode_state(state: dict) -> str | None:
    """A connection's state (Connection.export_state()) as JSON, its
    bytes in base64; None when it is over MAX_STATE."""
    text = json.dumps({field: _jsonable(value) for field, value in state.items()})
    return text if len(text) <= MAX_STATE else None


def decode_state(doc: dict) -> dict:
    """encode_state()'s JSON, decoded, as Connection.restore_state() takes it."""
    try:
        return {field: _from_jsonable(value) for field, value in doc.items()}
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise WireError(f"unreadable connection state: {e}") from None


def _jsonable(value):
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def _from_jsonable(value):
    if isinstance(value, dict):
        return base64.b64decode(value["b64"], validate=True)
    if isinstance(value, list):
        return [_from_jsonable(v) for v in value]
    return value


def connection_batches(passed: Sequence[tuple[int, str]]) -> Iterator[tuple[bytes, list[int]]]:
    """connections messages carrying these (descriptor, encode_state()
    text) pairs, as few as fit (MAX_FDS descriptors, MAX_MESSAGE bytes
    each), with their descriptors."""
    texts: list[str] = []
    fds: list[int] = []
    size = 0
    for fd, text in passed:
        if texts and (len(fds) == MAX_FDS or size + len(text) + 1 > MAX_MESSAGE - 64):
            yield _batch(texts), fds
            texts, fds, size = [], [], 0
        texts.append(text)
        fds.append(fd)
        size += len(text) + 1
    if texts:
        yield _batch(texts), fds


def _batch(texts: list[str]) -> bytes:
    # the states are JSON already: joined, not encoded again
    body = ('{"kind": "connections", "states": [' + ",".join(texts) + "]}").encode()
    return HEADER.pack(len(body)) + body


class Reader:
    """Splits a byte stream into messages: feed() adds what arrived,
    next() takes the first complete message (None until there is one).
    fds: the descriptors received and not yet taken by their message
    (one read may bring a message's end and the next one's descriptors)."""

    def __init__(self):
        self.buf = bytearray()
        self.fds: list[int] = []

    def feed(self, data: bytes) -> None:
        self.buf += data

    def next(self) -> dict | None:
        if len(self.buf) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self.buf)
        if length > MAX_MESSAGE:
            raise WireError(f"a message of {length} bytes is over the limit")
        if len(self.buf) < HEADER.size + length:
            return None
        body = bytes(self.buf[HEADER.size:HEADER.size + length])
        del self.buf[:HEADER.size + length]
        return decode(body)


def decode(body: bytes) -> dict:
    try:
        message = json.loads(body)
    except ValueError as e:
        raise WireError(f"unreadable message: {e}") from None
    if not isinstance(message, dict) or message.get("kind") not in KINDS:
        raise WireError(f"unknown message {str(message)[:80]!r}")
    return message


# ---- blocking sends and reads, for the socket's two ends ------------------------------

def send(sock: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    """data on sock (blocking or not: a message fits in a Unix socket's
    buffer), with fds passed alongside its first byte."""
    if len(fds) > MAX_FDS:
        raise WireError(f"{len(fds)} descriptors to pass; at most {MAX_FDS} go at once")
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket, reader: Reader, timeout: float) -> tuple[dict, list[int]]:
    """The next message on a blocking sock within timeout seconds, and
    the descriptors that came with it (as many as it names, fewer if
    fewer came); WireError if the peer closes first."""
    sock.settimeout(timeout)
    while True:
        message = reader.next()
        if message is not None:
            n = descriptors_named(message)
            fds, reader.fds = reader.fds[:n], reader.fds[n:]
            return message, fds
        try:
            data, more, flags, _ = socket.recv_fds(sock, 65536, MAX_FDS)
        except TimeoutError:
            _drop_fds(reader)
            raise WireError(f"no answer within {timeout:g} s") from None
        reader.fds += more
        if flags & socket.MSG_CTRUNC:
            _drop_fds(reader)
            raise WireError("descriptors were cut off (the open file limit?)")
        if not data:
            _drop_fds(reader)
            raise WireError("the other side closed the takeover socket")
        reader.feed(data)


def descriptors_named(message: dict) -> int:
    """How many descriptors ride with message: an offer's listeners and
    its socket pair's end, a connections message's connections."""
    named = {"offer": "listeners", "connections": "states"}.get(message["kind"])
    items = message.get(named) if named else None
    if not isinstance(items, list):
        return 0
    return len(items) + (message["kind"] == "offer")


def _drop_fds(reader: Reader) -> None:
    close_fds(reader.fds)
    reader.fds = []


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            socket.close(fd)
        except OSError:
            pass

