"""Replication between real processes: full copy, then the stream of
changed states, for every kind of bucket and for the rules; the replica's
read-only face; ROLE, INFO and REPLICAOF; authentication.

Both servers run on manual clocks set to the same time, so a replica's
bucket can be compared with the primary's by a peek (COST 0) on each.
"""

from __future__ import annotations

import json
import random
import socket
import time
from contextlib import closing

import pytest
import redis

from servers import wait_caught_up
from wire import Wire, command, wait_until

READONLY = "READONLY You can't write against a read only replica."
# redis-py raises ReadOnlyError for it and keeps the text after the code
READONLY_TEXT = READONLY.partition(" ")[2]
T0 = 1_000_000
WAIT = 20.0


def start_pair(make_server, *primary_args, replica_args=()):
    primary = make_server("--manual-clock", *primary_args)
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port),
                          *replica_args)
    p, r = primary.client(), replica.client()
    for c in (p, r):
        c.execute_command("DEBUG", "CLOCK", "SET", T0)
    wait_link_up(r)
    return primary, replica, p, r


def wait_link_up(r) -> None:
    wait_until(lambda: r.info("replication").get("master_link_status") == "up", WAIT,
               "replica link never came up")


def peek(c, key, capacity=10, refill=1):
    return c.execute_command("CL.CHECK", key, capacity, refill, "COST", 0)


def wait_equal(p, r, keys, capacity=10, refill=1) -> None:
    """The replica shows every key as the primary does (peeks on both)."""
    def same():
        return all(peek(p, k, capacity, refill) == peek(r, k, capacity, refill) for k in keys)
    wait_until(same, WAIT, "replica never caught up")


# ---- full copy and stream -----------------------------------------------------------------

def test_full_copy_then_stream_of_token_buckets(make_server):
    primary = make_server("--manual-clock")
    p = primary.client()
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    rng = random.Random(7)
    before = [f"before:{i}" for i in range(2000)]
    for k in before:
        p.execute_command("CL.CHECK", k, 10, 1, "COST", rng.randint(1, 10))
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port))
    r = replica.client()
    r.execute_command("DEBUG", "CLOCK", "SET", T0)
    wait_link_up(r)
    wait_equal(p, r, before)

    after = [f"after:{i}" for i in range(500)]
    pipe = p.pipeline(transaction=False)
    for _ in range(3000):      # repeats: one key written many times per batch
        pipe.execute_command("CL.CHECK", rng.choice(after + before), 10, 1)
    pipe.execute()
    for k in before[:100]:
        p.execute_command("CL.RESET", k)
    wait_caught_up(p, r)
    assert r.dbsize() == p.dbsize()
    wait_equal(p, r, before + after)
    # and the states go on refilling alike: times are absolute
    for c in (p, r):
        c.execute_command("DEBUG", "CLOCK", "ADVANCE", 3500)
    wait_equal(p, r, before + after)


def test_named_rules_and_their_buckets_replicate(make_server):
    primary, replica, p, r = start_pair(make_server)
    rules = {
        "tb": {"match": {"resource": "GET /a"}, "capacity": 5, "refill_per_second": 1},
        "fw": {"match": {"resource": "GET /a"}, "algorithm": "fixed_window", "limit": 7,
               "window_ms": 60000},
        "sw": {"match": {"resource": "GET /b"}, "algorithm": "sliding_window", "limit": 4,
               "window_ms": 10000},
        "gc": {"match": {"resource": "GET /c"}, "algorithm": "gcra", "count": 3,
               "period_ms": 1000, "burst": 2},
    }
    for rule_id, rule in rules.items():
        p.execute_command("CL.RULE", "SET", rule_id, json.dumps(rule))
    for i in range(30):
        for resource in ("GET /a", "GET /b", "GET /c"):
            p.execute_command("CL.LIMIT", f"user:{i % 5}", resource)
    for i in range(12):
        p.execute_command("CL.THROTTLE", f"cell:{i % 3}", 5, 10, 60)
    wait_caught_up(p, r)
    assert sorted(r.execute_command("CL.RULE", "LIST")) == sorted(x.encode() for x in rules)
    for i in range(5):
        for resource in ("GET /a", "GET /b", "GET /c"):
            args = ("CL.LIMIT", f"user:{i}", resource, "COST", 0, "DETAIL")
            assert r.execute_command(*args) == p.execute_command(*args)

    # a changed rule and a deleted one reach the replica, in order with the buckets
    p.execute_command("CL.RULE", "SET", "tb", json.dumps(
        {"match": {"resource": "GET /a"}, "capacity": 9, "refill_per_second": 1}))
    p.execute_command("CL.RULE", "DEL", "sw")
    p.execute_command("CL.LIMIT", "user:0", "GET /a")
    wait_caught_up(p, r)
    assert json.loads(r.execute_command("CL.RULE", "GET", "tb"))["capacity"] == 9
    assert r.execute_command("CL.RULE", "GET", "sw") is None
    args = ("CL.LIMIT", "user:0", "GET /a", "COST", 0, "DETAIL")
    assert r.execute_command(*args) == p.execute_command(*args)
    # CL.THROTTLE's buckets: a replica refuses even quantity 0, so compare
    # after promotion
    r.execute_command("REPLICAOF", "NO", "ONE")
    for i in range(3):
        args = ("CL.THROTTLE", f"cell:{i}", 5, 10, 60, 0)
        assert r.execute_command(*args) == p.execute_command(*args)


def test_concurrency_leases_replicate_with_their_generation(make_server):
    primary, replica, p, r = start_pair(make_server)
    p.execute_command("CL.RULE", "SET", "conc", json.dumps(
        {"match": {"resource": "jobs"}, "algorithm": "concurrency", "limit": 3,
         "lease_ms": 60000}))
    leases = [p.execute_command("CL.ACQUIRE", "conc", "worker") for _ in range(3)]
    assert all(lease[0] == 1 for lease in leases)
    p.execute_command("CL.RELEASE", "conc", "worker", leases[0][4])
    wait_caught_up(p, r)
    r.execute_command("REPLICAOF", "NO", "ONE")
    # the promoted replica holds the two leases still out, and new lease ids
    # are not the ones the primary gave
    again = r.execute_command("CL.ACQUIRE", "conc", "worker")
    assert again[0] == 1
    assert r.execute_command("CL.ACQUIRE", "conc", "worker")[0] == 0
    assert again[4] not in [lease[4] for lease in leases]
    assert r.execute_command("CL.RELEASE", "conc", "worker", leases[1][4]) == 1


def test_flushall_replicates(make_server):
    primary, replica, p, r = start_pair(make_server)
    for i in range(50):
        p.execute_command("CL.CHECK", f"k{i}", 10, 1)
    wait_caught_up(p, r)
    assert r.dbsize() == 50
    p.flushall()
    p.execute_command("CL.CHECK", "after", 10, 1)
    wait_caught_up(p, r)
    assert r.dbsize() == 1
    assert peek(r, "after") == peek(p, "after")


# ---- the replica's face ------------------------------------------------------------------------

WRITES = [
    ("CL.CHECK", "k", 10, 1),
    ("CL.CHECK", "k", 10, 1, "COST", 2),
    ("CL.LIMIT", "client", "resource"),
    ("CL.RESET", "k"),
    ("CL.THROTTLE", "k", 5, 10, 60),
    ("CL.RULE", "SET", "x", '{"capacity": 1, "refill_per_second": 1}'),
    ("CL.RULE", "DEL", "x"),
    ("CL.ACQUIRE", "x", "c"),
    ("FLUSHALL",),
    ("FLUSHDB",),
]


def test_replica_refuses_writes(make_server):
    primary, replica, p, r = start_pair(make_server)
    for args in WRITES:
        with pytest.raises(redis.exceptions.ReadOnlyError) as e:
            r.execute_command(*args)
        assert str(e.value) == READONLY_TEXT, args


def test_replica_answers_reads_and_peeks(make_server):
    primary, replica, p, r = start_pair(make_server)
    p.execute_command("CL.CHECK", "k", 10, 1, "COST", 4)
    wait_caught_up(p, r)
    assert r.ping()
    assert peek(r, "k") == [1, 10, 6, 0, 4000]
    assert peek(r, "k") == [1, 10, 6, 0, 4000]      # a peek changes nothing
    assert r.dbsize() == 1
    assert r.execute_command("CL.RULE", "LIST") == []
    assert r.info("server")["tcp_port"] == replica.port
    # Inside MULTI a write command is refused when queued, as Redis does,
    # and EXEC aborts; so is a check that would spend tokens (COST 0 is a
    # peek, allowed).
    refused = b"-" + READONLY.encode() + b"\r\n"
    with Wire.to(replica.port) as w:
        w.send(command("MULTI") + command("CL.RESET", "k") + command("EXEC"))
        assert w.read_reply() == b"+OK\r\n"
        assert w.read_reply() == refused
        assert w.read_reply().startswith(b"-EXECABORT")
        w.send(command("MULTI") + command("CL.CHECK", "k", 10, 1) +
               command("CL.CHECK", "k", 10, 1, "COST", 0) + command("EXEC"))
        assert [w.read_reply() for _ in range(3)] == [b"+OK\r\n", refused, b"+QUEUED\r\n"]
        assert w.read_reply().startswith(b"-EXECABORT")
        w.send(command("MULTI") + command("CL.CHECK", "k", 10, 1, "COST", 0) + command("EXEC"))
        assert [w.read_reply() for _ in range(2)] == [b"+OK\r\n", b"+QUEUED\r\n"]
        assert w.read_reply() == b"*1\r\n*5\r\n:1\r\n:10\r\n:6\r\n:0\r\n:4000\r\n"


def test_role_info_and_promotion(make_server):
    primary, replica, p, r = start_pair(make_server)
    p.execute_command("CL.CHECK", "k", 10, 1)
    wait_caught_up(p, r)
    role = r.execute_command("ROLE")
    assert role[:4] == [b"slave", b"127.0.0.1", primary.port, b"connected"]
    assert role[4] == p.info("replication")["master_repl_offset"]
    info = r.info("replication")
    assert info["role"] == "slave" and info["master_port"] == primary.port
    assert info["master_link_status"] == "up" and info["slave_read_only"] == 1
    assert "master_link_down_since_seconds" not in info     # only while down, as Redis
    wait_until(lambda: p.info("replication")["slave0"]["offset"] >= info["slave_repl_offset"],
               WAIT, "the replica's ACK never reached the primary")
    pinfo = p.info("replication")
    assert pinfo["role"] == "master" and pinfo["connected_slaves"] == 1
    assert pinfo["slave0"]["port"] == replica.port and pinfo["slave0"]["state"] == "online"
    prole = p.execute_command("ROLE")
    assert prole[0] == b"master" and [row[:2] for row in prole[2]] == [
        [b"127.0.0.1", str(replica.port).encode()]]
    assert int(prole[2][0][2]) >= info["slave_repl_offset"]
    assert r.execute_command("HELLO", 3)[b"role"] == b"replica"

    assert r.execute_command("REPLICAOF", "127.0.0.1", primary.port) == \
        b"OK Already connected to specified master"
    assert r.execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    role = r.execute_command("ROLE")
    # the offset goes on from the replica's (heartbeats may have moved it)
    assert role[0] == b"master" and role[1] >= info["slave_repl_offset"] > 0
    # after promotion it serves from the state it had, and writes work
    assert r.execute_command("CL.CHECK", "k", 10, 1) == [1, 10, 8, 0, 2000]
    wait_until(lambda: p.info("replication")["connected_slaves"] == 0, WAIT,
               "the primary never noticed the replica leaving")


def test_slaveof_turns_a_primary_into_a_replica(make_server):
    a = make_server("--manual-clock")
    b = make_server("--manual-clock")
    ca, cb = a.client(), b.client()
    for c in (ca, cb):
        c.execute_command("DEBUG", "CLOCK", "SET", T0)
    ca.execute_command("CL.CHECK", "from-a", 10, 1, "COST", 3)
    cb.execute_command("CL.CHECK", "only-b", 10, 1, "COST", 3)
    assert cb.execute_command("SLAVEOF", "127.0.0.1", a.port) is True   # redis-py: +OK
    wait_link_up(cb)
    # a full copy replaces everything the replica had
    assert peek(cb, "from-a") == peek(ca, "from-a")
    assert peek(cb, "only-b") == [1, 10, 10, 0, 0]
    assert cb.dbsize() == 1


@pytest.mark.parametrize("args, error", [
    (("REPLICAOF", "127.0.0.1", "nope"), b"-ERR port is not an integer or out of range"),
    (("REPLICAOF", "127.0.0.1", "70000"), b"-ERR Invalid master port"),
    (("REPLICAOF", "x"), b"-ERR wrong number of arguments for 'replicaof' command"),
    (("REPLCONF", "listening-port"), b"-ERR syntax error"),
    (("REPLCONF", "bogus", "1"), b"-ERR Unrecognized REPLCONF option: bogus"),
])
def test_replication_command_errors(server, args, error):
    with Wire.to(server.port) as w:
        assert w.call(*args) == error + b"\r\n"


# ---- authentication and abuse ---------------------------------------------------------------------

def test_masterauth(make_server):
    primary = make_server("--manual-clock", "--requirepass", "s3cret")
    wrong = make_server("--replicaof", "127.0.0.1", str(primary.port), "--masterauth", "nope")
    right = make_server("--replicaof", "127.0.0.1", str(primary.port), "--masterauth", "s3cret")
    wait_link_up(right.client())
    assert wrong.client().info("replication")["master_link_status"] == "down"
    wait_until(lambda: "WRONGPASS" in wrong.log(), WAIT, "no log of the refused handshake")
    p = primary.client(password="s3cret")
    assert p.info("replication")["connected_slaves"] == 1


def test_sync_needs_auth_and_never_writes(make_server):
    primary = make_server("--manual-clock", "--requirepass", "pw")
    with Wire.to(primary.port) as w:
        w.send(command("CL.SYNC"))
        assert w.read_reply() == b"-NOAUTH Authentication required.\r\n"
        w.send(command("REPLCONF", "ACK", "999"))
        assert w.read_reply() == b"-NOAUTH Authentication required.\r\n"
    p = primary.client(password="pw")
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    p.execute_command("CL.CHECK", "k", 10, 1, "COST", 5)
    # A client that syncs gets a copy; whatever it sends after cannot
    # change a bucket (the stream only flows from the primary).
    with Wire.to(primary.port) as w:
        w.send(command("AUTH", "pw") + command("CL.SYNC"))
        assert w.read_reply() == b"+OK\r\n"
        assert w.read_reply().startswith(b"+FULLSYNC ")
        w.send(b"\x53" + b"\xff" * 64 + command("CL.RESET", "k"))
    assert peek(p, "k") == [1, 10, 5, 0, 5000]


def test_a_replica_serves_replicas_by_relaying_its_primary(make_server):
    primary = make_server("--manual-clock")
    p = primary.client()
    p.execute_command("DEBUG", "CLOCK", "SET", T0)
    rules = {"tb": {"match": {"resource": "GET /a"}, "capacity": 5, "refill_per_second": 1},
             "gc": {"match": {"resource": "GET /a"}, "algorithm": "gcra", "count": 3,
                    "period_ms": 1000, "burst": 2}}
    for rule_id, rule in rules.items():
        p.execute_command("CL.RULE", "SET", rule_id, json.dumps(rule))
    keys = [f"k{i}" for i in range(200)]
    for k in keys[:100]:
        p.execute_command("CL.CHECK", k, 10, 1, "COST", 3)
        p.execute_command("CL.LIMIT", k, "GET /a")
    # The middle one numbers its rules otherwise (it had rules of its own),
    # so the copy it makes and the stream it relays must not be confused.
    middle = make_server("--manual-clock")
    r = middle.client()
    r.execute_command("DEBUG", "CLOCK", "SET", T0)
    for i in range(3):
        r.execute_command("CL.RULE", "SET", f"own{i}", json.dumps(
            {"match": {"resource": "GET /a"}, "capacity": 1, "refill_per_second": 1}))
    r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    wait_link_up(r)
    sub = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(middle.port))
    s = sub.client()
    s.execute_command("DEBUG", "CLOCK", "SET", T0)
    wait_link_up(s)
    for k in keys[50:]:
        p.execute_command("CL.CHECK", k, 10, 1, "COST", 3)
        p.execute_command("CL.LIMIT", k, "GET /a")
    wait_caught_up(p, s)          # the same offsets down the chain
    assert s.dbsize() == p.dbsize()
    wait_equal(p, s, keys)
    for k in keys[::10]:
        args = ("CL.LIMIT", k, "GET /a", "COST", 0, "DETAIL")
        assert (k, r.execute_command(*args)) == (k, p.execute_command(*args))
        assert (k, s.execute_command(*args)) == (k, p.execute_command(*args))
    assert sorted(s.execute_command("CL.RULE", "LIST")) == [b"gc", b"tb"]
    assert r.info("replication")["connected_slaves"] == 1
    # FLUSHALL and rule changes go down the chain in order
    p.flushall()
    p.execute_command("CL.RULE", "DEL", "gc")
    p.execute_command("CL.CHECK", "after", 10, 1)
    wait_caught_up(p, s)
    assert s.dbsize() == 1 and s.execute_command("CL.RULE", "LIST") == [b"tb"]
    # promoted, the middle one streams its own writes to the one below
    r.execute_command("REPLICAOF", "NO", "ONE")
    r.execute_command("CL.CHECK", "on-r", 10, 1, "COST", 4)
    r.execute_command("CL.LIMIT", "u", "GET /a")
    wait_caught_up(r, s)
    assert peek(s, "on-r") == peek(r, "on-r") == [1, 10, 6, 0, 4000]
    args = ("CL.LIMIT", "u", "GET /a", "COST", 0, "DETAIL")
    assert s.execute_command(*args) == r.execute_command(*args)
    assert r.info("replication")["repl_full_syncs"] == 1    # no resync was needed


def test_replica_connections_are_listed_and_can_be_killed(make_server):
    primary, replica, p, r = start_pair(make_server)
    listing = p.execute_command("CLIENT", "LIST", "TYPE", "replica")
    lines = listing.splitlines() if isinstance(listing, str) else listing.decode().splitlines()
    assert len(lines) == 1 and " flags=S " in lines[0]
    assert p.execute_command("CLIENT", "KILL", "TYPE", "slave") == 1
    # the replica comes back by itself, with a second full copy
    wait_until(lambda: p.info("replication")["repl_full_syncs"] == 2, WAIT, "no resync")
    wait_link_up(r)
    p.execute_command("CL.CHECK", "after-kill", 10, 1)
    wait_caught_up(p, r)
    assert peek(r, "after-kill") == peek(p, "after-kill")


def read_batches(sock, until, timeout=WAIT) -> int:
    """Reads a replica's stream (after +FULLSYNC) until until(records seen
    in batches) is true; returns that count."""
    from fastlimit.replication import stream as rs
    reader, buf, records, synced = rs.FrameReader(), b"", 0, False
    deadline = time.monotonic() + timeout
    sock.settimeout(0.2)
    while not until(records):
        assert time.monotonic() < deadline, f"only {records} records arrived"
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            continue
        assert data, "the primary closed the stream"
        if not synced:
            buf += data
            if b"+FULLSYNC" not in buf or b"\r\n" not in buf[buf.index(b"+FULLSYNC"):]:
                continue
            start = buf.index(b"+FULLSYNC")
            data, synced = buf[buf.index(b"\r\n", start) + 2:], True
        for kind, payload in reader.feed(data):
            if kind == rs.BATCH:
                records += sum(s.records for s in rs.parse_batch(payload)[2])
    return records


def test_a_replica_attached_as_the_others_are_dropped_still_gets_changes(make_server):
    """The change log overflows (1kb, drained once a second), so attaching
    the second replica drops the first; the second must still be tracked."""
    primary = make_server("--manual-clock", "--repl-flush-ms", "1000",
                          "--repl-buffer-limit", "1kb")
    first = make_server("--replicaof", "127.0.0.1", str(primary.port))
    wait_link_up(first.client())
    with closing(socket.create_connection(("127.0.0.1", primary.port))) as second:
        burst = b"".join(command("CL.CHECK", f"burst:{i:06d}", 10, 1) for i in range(200))
        second.sendall(burst + command("CL.SYNC"))
        p = primary.client()
        wait_until(lambda: p.info("replication")["repl_dropped_replicas"] >= 1, WAIT,
                   "the first replica was never dropped")
        for i in range(5):
            p.execute_command("CL.CHECK", f"after:{i}", 10, 1)
        assert read_batches(second, lambda n: n >= 5) >= 5


def test_exec_of_writes_queued_before_becoming_a_replica_is_aborted(make_server):
    primary = make_server("--manual-clock")
    other = make_server("--manual-clock")
    o = other.client()
    for i in range(10):
        o.execute_command("CL.CHECK", f"k{i}", 10, 1)
    with Wire.to(other.port) as w:
        w.send(command("MULTI") + command("FLUSHALL"))
        assert [w.read_reply() for _ in range(2)] == [b"+OK\r\n", b"+QUEUED\r\n"]
        o.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        wait_link_up(o)
        assert w.call("EXEC") == (b"-ERR Transaction contains write commands but instance is "
                                  b"now a read-only replica. EXEC aborted.\r\n")
