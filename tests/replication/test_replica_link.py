"""What a connection may do once it is a replication link, and what a
replica refuses inside MULTI, against real servers.

After CL.SYNC a connection carries the replication stream and takes only
REPLCONF ACKs: anything else is refused as Redis refuses it ("Replica
can't interact with the keyspace"), without a reply spliced into the
stream, and the link is closed.  On a replica, a CL.CHECK or CL.LIMIT that
would spend tokens is refused when MULTI queues it, so EXEC gives
EXECABORT, as redis-server answers a SET queued on a replica.
"""

from __future__ import annotations

import time

import pytest

from wire import TIMEOUT, Wire, command, free_port, wait_until

T0 = 1_000_000


def peek(client, key):
    return client.execute_command("CL.CHECK", key, 10, 1, "COST", 0)


def open_link(port: int) -> Wire:
    w = Wire.to(port)
    w.send(command("CL.SYNC"))
    assert w.read_line().startswith(b"+FULLSYNC ")
    time.sleep(0.3)                 # let the full copy start flowing
    w.fill(time.monotonic() + 0.2)
    w.buf = b""
    return w


REFUSED = [
    ("spend", command("CL.CHECK", "victim", 10, 1, "COST", 10)),
    ("reset", command("CL.RESET", "other")),
    ("flushall", command("FLUSHALL")),
    ("ping", command("PING")),
    ("inline", b"PING\r\n"),
    ("multi", command("MULTI") + command("CL.RESET", "other") + command("EXEC")),
    ("unknown", command("NOSUCH")),
    ("replconf that answers", command("REPLCONF", "listening-port", "1")),
    ("protocol error", b"*1\r\n$x\r\n"),
]


@pytest.mark.parametrize("data", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_replication_link_takes_no_commands(make_server, data):
    srv = make_server("--manual-clock")
    c = srv.client()
    c.execute_command("DEBUG", "CLOCK", "SET", T0)
    c.execute_command("CL.CHECK", "other", 10, 1, "COST", 3)
    w = open_link(srv.port)
    w.send(data + command("CL.RESET", "other") + command("FLUSHALL"))
    rest = w.read_until_closed()
    # no RESP reply inside the frame stream (before: +PONG, +OK, :1 ...)
    for reply in (b"+PONG", b"+OK", b"+QUEUED", b"-ERR", b"*5\r\n:1\r\n"):
        assert reply not in rest, rest[-200:]
    assert c.dbsize() == 1
    assert peek(c, "other") == [1, 10, 7, 0, 3000]
    # one warning per link; a protocol error is logged at verbose only
    warned = srv.log().count("which a replication link does not take")
    assert warned == (0 if data.startswith(b"*1\r\n$x") else 1), srv.log()
    assert c.info("replication")["connected_slaves"] == 0


def test_a_replication_link_keeps_taking_acks(make_server):
    srv = make_server()
    w = open_link(srv.port)
    w.send(command("REPLCONF", "ACK", "0") * 3)
    assert w.is_open(0.3)
    assert srv.client().info("replication")["connected_slaves"] == 1
    w.close()


def transaction(port: int, queued: bytes) -> list[bytes]:
    w = Wire.to(port)
    w.send(command("MULTI") + queued + command("EXEC"))
    replies = [w.read_reply() for _ in range(3)]
    w.close()
    return replies


@pytest.fixture
def replica(make_server):
    """A fastlimit replica (of a primary that is not there: still read-only)."""
    srv = make_server()
    srv.client().execute_command("REPLICAOF", "127.0.0.1", free_port())
    return srv


@pytest.fixture
def redis_replica(redis_server):
    c = redis_server.client()
    c.execute_command("REPLICAOF", "127.0.0.1", free_port())
    yield redis_server
    c.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize("queued", [
    command("CL.CHECK", "k", 5, 1),
    command("CL.CHECK", "k", 5, 1, "COST", 2),
    command("CL.CHECK", "k", 5, 1, "COST", 0, "COST", 1),
    command("CL.LIMIT", "c", "GET /"),
    command("CL.LIMIT", "c", "GET /", "DETAIL", "COST", 3),
], ids=repr)
def test_a_replica_refuses_a_spending_check_when_multi_queues_it(replica, redis_replica, queued):
    expected = transaction(redis_replica.port, command("SET", "k", "v"))
    assert expected[1].startswith(b"-READONLY") and expected[2].startswith(b"-EXECABORT")
    assert transaction(replica.port, queued) == expected


@pytest.mark.parametrize("queued", [
    command("CL.CHECK", "k", 5, 1, "COST", 0),
    command("CL.CHECK", "k", 5, 1, "PERIOD", 1000, "cost", 0),
    command("CL.LIMIT", "c", "GET /", "COST", 0, "DETAIL"),
], ids=repr)
def test_a_replica_queues_a_peek_in_multi(replica, queued):
    replies = transaction(replica.port, queued)
    assert replies[:2] == [b"+OK\r\n", b"+QUEUED\r\n"]
    assert replies[2].startswith(b"*1\r\n*")


def test_a_link_refused_in_the_same_read_as_its_cl_sync_never_forks_a_copy(make_server):
    server = make_server("--manual-clock")
    client = server.client()
    client.execute_command("CL.CHECK", "k", 10, 1)
    with Wire.to(server.port) as w:
        w.send(command("CL.SYNC") + command("PING"))
        assert w.read_line().startswith(b"+FULLSYNC ")
        wait_until(lambda: client.info("clients")["connected_clients"] == 1)
    assert client.info("replication")["repl_full_copies_written"] == 0
