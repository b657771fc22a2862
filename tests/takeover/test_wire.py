"""The handover's messages (src/fastlimit/takeover/wire.py): framing, the
version check, descriptors passed alongside, over a real socket pair."""

from __future__ import annotations

import os
import socket

import pytest

from fastlimit.server import snapshot
from fastlimit.takeover import wire


def test_a_message_read_in_pieces_comes_out_whole_and_once():
    data = wire.encode("ready", offset=7) + wire.encode("failed", reason="x")
    reader = wire.Reader()
    for i in range(len(data)):
        reader.feed(data[i:i + 1])
    assert reader.next() == {"kind": "ready", "offset": 7}
    assert reader.next() == {"kind": "failed", "reason": "x"}
    assert reader.next() is None


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"kind": "sessions"}'])
def test_an_unreadable_or_unknown_message_is_an_error(body):
    reader = wire.Reader()
    reader.feed(wire.HEADER.pack(len(body)) + body)
    with pytest.raises(wire.WireError):
        reader.next()


def test_an_oversized_message_is_refused_from_its_header():
    reader = wire.Reader()
    reader.feed(wire.HEADER.pack(wire.MAX_MESSAGE + 1))
    with pytest.raises(wire.WireError, match="over the limit"):
        reader.next()


def test_the_versions_this_build_speaks_are_compatible_with_themselves():
    assert wire.incompatibility(wire.versions()) is None
    assert wire.versions()["snapshot_format"] == snapshot.READABLE[snapshot.MAGIC]


@pytest.mark.parametrize("theirs, said", [
    ({"protocol": wire.PROTOCOL + 1, "snapshot_format": 2}, "handover protocol version"),
    ({"snapshot_format": 2}, "handover protocol version None"),
    ({"protocol": wire.PROTOCOL, "snapshot_format": 99}, "snapshot format version 99"),
])
def test_another_version_is_named_in_the_refusal(theirs, said):
    assert said in wire.incompatibility(theirs)


def test_descriptors_ride_with_their_message():
    left, right = socket.socketpair()
    r, w = os.pipe()
    try:
        wire.send(left, wire.encode("offer", listeners=[]), [w])
        message, fds = wire.receive(right, wire.Reader(), 5)
        assert message == {"kind": "offer", "listeners": []} and len(fds) == 1
        os.write(fds[0], b"x")          # the same pipe, through another descriptor
        assert os.read(r, 1) == b"x"
        wire.close_fds(fds)
    finally:
        for fd in (r, w):
            os.close(fd)
        left.close()
        right.close()


def test_a_peer_that_closes_or_stays_silent_is_an_error():
    left, right = socket.socketpair()
    with right:
        with pytest.raises(wire.WireError, match="no answer within"):
            wire.receive(right, wire.Reader(), 0.05)
        left.close()
        with pytest.raises(wire.WireError, match="closed the takeover socket"):
            wire.receive(right, wire.Reader(), 5)
