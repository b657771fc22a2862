"""The handover's messages (src/fastlimit/takeover/wire.py): framing, the
version check, descriptors passed alongside, over a real socket pair."""

from __future__ import annotations

import json
import os
import socket
import threading

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


STATE = {"proto": 3, "authenticated": True, "user": "app", "name": b"n\xff", "lib_name": None,
         "lib_ver": b"1.0", "reply_mode": 0, "priority": 2, "channels": [b"a", b"\x00b"],
         "patterns": [], "input": b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nEC"}


def test_a_connection_s_state_comes_back_as_it_was_bytes_included():
    text = wire.encode_state(STATE)
    assert wire.decode_state(json.loads(text)) == STATE


def test_a_state_over_its_bound_is_not_encoded():
    assert wire.encode_state({**STATE, "input": b"x" * wire.MAX_STATE}) is None


def test_connections_are_batched_by_descriptors_and_bytes_with_their_order_kept():
    text = wire.encode_state(STATE)
    big = wire.encode_state({**STATE, "input": b"x" * 300_000})     # three exceed a message
    passed = [(i, text) for i in range(wire.MAX_FDS + 1)] + [(1000 + i, big) for i in range(3)]
    batches = list(wire.connection_batches(passed))
    assert [fds for _, fds in batches] == [list(range(wire.MAX_FDS)),
                                          [wire.MAX_FDS, 1000, 1001], [1002]]
    for message, fds in batches:
        reader = wire.Reader()
        reader.feed(message)
        decoded = reader.next()
        assert decoded["kind"] == "connections" and len(decoded["states"]) == len(fds)
        assert all(wire.decode_state(doc)["proto"] == 3 for doc in decoded["states"])


def test_an_unreadable_state_is_an_error():
    with pytest.raises(wire.WireError):
        wire.decode_state({"input": {"b64": "not base64!"}})


def test_each_message_takes_its_own_descriptors_when_one_read_brings_the_next_one_s():
    """A message longer than a read ends in the read that brings the next
    message's descriptors: each takes as many as it names."""
    left, right = socket.socketpair()
    pipes = [os.pipe() for _ in range(3)]
    long = wire.encode_state({**STATE, "input": b"x" * 40_000})     # two: longer than a read
    text = wire.encode_state(STATE)
    batches = [*wire.connection_batches([(w, long) for _, w in pipes[:2]]),
               *wire.connection_batches([(pipes[2][1], text)])]
    sender = threading.Thread(target=lambda: [wire.send(left, *batch) for batch in batches])
    try:
        sender.start()
        sender.join(5)          # both in the socket's buffer before any read
        reader = wire.Reader()
        got = [wire.receive(right, reader, 5) for _ in batches]
        assert [len(fds) for _, fds in got] == [2, 1]
        os.write(got[1][1][0], b"z")            # the third pipe, with the second message
        assert os.read(pipes[2][0], 1) == b"z"
        wire.close_fds(got[0][1] + got[1][1])
    finally:
        sender.join(10)
        for r, w in pipes:
            os.close(r)
            os.close(w)
        left.close()
        right.close()
