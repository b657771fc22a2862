"""A replica whose "primary" answers badly: a refused handshake, a reply
that never ends, frames of an unknown kind, over the limit, or a full
copy that is not a snapshot.  Each costs the link (logged, then retried
with back-off), never the replica process, and never a traceback.

The primary here is a plain loopback socket speaking the stream by hand
(tests/support/wire.py frames it), so every answer is exactly the one tested.
"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from wire import wait_until

FRAME = struct.Struct("<BQ")
WAIT = 30.0


class FakePrimary:
    """Accepts replica links on a free loopback port; each link reads the
    handshake (the replica's [AUTH and] CL.SYNC, then REPLCONF
    listening-port on the link) and
    gets `answer` back, then stays open until the replica hangs up."""

    def __init__(self, answer: bytes):
        self.answer = answer
        self.links = 0
        self.handshakes: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                self.links += 1
                conn.settimeout(WAIT)
                got = b""
                while got.count(b"CL.SYNC") == 0:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                self.handshakes.append(got)
                conn.sendall(self.answer)
                try:
                    while conn.recv(4096):
                        pass               # the replica's acks, until it hangs up
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def fake_primary():
    made = []

    def start(answer: bytes) -> FakePrimary:
        made.append(FakePrimary(answer))
        return made[-1]

    yield start
    for p in made:
        p.close()


SYNC_OK = b"+FULLSYNC fakereplid 0\r\n"
MASTERAUTH = ("--masterauth", "pw")


@pytest.mark.parametrize("answer,logged,args", [
    (b"-ERR no replicas here\r\n+FULLSYNC x 0\r\n",
     "the primary refused the handshake: -ERR no replicas here", ()),
    (b"+OK\r\n-NOAUTH Authentication required.\r\n",
     "the primary refused the handshake: -NOAUTH Authentication required.", MASTERAUTH),
    (b"+" + b"x" * 5000, "handshake reply too long", ()),
    (SYNC_OK + FRAME.pack(ord("X"), 3) + b"abc", "unknown frame kind 88", ()),
    (SYNC_OK + FRAME.pack(ord("B"), 1 << 40), f"frame of {1 << 40} bytes is over the limit",
     ()),
    (SYNC_OK + FRAME.pack(ord("S"), 20) + b"\0" * 8 + b"not a snapshot",
     "not a fastlimit snapshot (bad header); resyncing", ()),
    (SYNC_OK + FRAME.pack(ord("R"), 9) + b"not json!", "unreadable rules frame: ", ()),
], ids=["refused", "refused-after-ok", "endless-reply", "unknown-kind", "huge-frame",
        "bad-full-copy", "bad-rules"])
def test_a_bad_primary_costs_the_link_not_the_replica(make_server, fake_primary, answer, logged,
                                                      args):
    primary = fake_primary(answer)
    replica = make_server("--replicaof", "127.0.0.1", str(primary.port), *args)
    # the first link fails, the replica logs why and dials again
    wait_until(lambda: primary.links >= 2, WAIT, "the replica to retry its primary")
    assert b"CL.SYNC" in primary.handshakes[0]
    c = replica.client(decode_responses=True)
    assert c.ping()
    info = c.info("replication")
    assert (info["role"], info["master_link_status"]) == ("slave", "down")
    log = replica.log()
    assert f"replication from primary 127.0.0.1:{primary.port} failed: " in log, log
    assert logged in log, log
    assert "Traceback" not in log, log
    assert replica.alive()
    # a run of failures is one line, not a line per retry
    assert log.count("replication from primary") == 1, log
    assert replica.stop() == 0, replica.log()
