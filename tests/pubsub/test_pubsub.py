"""Pub/Sub on a real server: delivery across many connections, the
pubsub output-buffer class for subscribers that do not read, CLIENT
LIST/KILL and INFO for subscribers, clients that vanish, the glob's time
bound, and client-output-buffer-limit's class syntax.  What Redis does
byte for byte is in test_pubsub_differential.py."""

from __future__ import annotations

import socket
import time

import pytest
from wire import Wire, command, wait_until

from fastlimit._protocol import glob


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100     # utime + stime, in ticks of 10 ms


def subscribe(port: int, *channels: str, rcvbuf: int | None = None) -> Wire:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)   # before connect: the window
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    w = Wire(s)
    w.send(command("SUBSCRIBE", *channels))
    for _ in channels:
        w.read_reply()
    return w


def message(channel: bytes, payload: bytes) -> bytes:
    return b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(channel), channel, len(payload), payload)


def info(client) -> dict:
    return client.info("all")


def test_a_publish_reaches_each_of_1000_subscribers_of_a_channel(server):
    subscribers = [subscribe(server.port, "fanout") for _ in range(1000)]
    try:
        with Wire.to(server.port) as publisher:
            assert publisher.call("PUBLISH", "fanout", "hi") == b":1000\r\n"
        deadline = time.monotonic() + 30
        for w in subscribers:
            assert w.read_reply(deadline) == message(b"fanout", b"hi")
    finally:
        for w in subscribers:
            w.close()


def test_a_subscriber_that_never_reads_is_dropped_at_the_pubsub_limit_and_nobody_waits(
        make_server):
    s = make_server("--client-output-buffer-limit", "pubsub", "256kb", "0", "0")
    payload = b"x" * 16384
    n = 1000        # 16 MB: past the kernel's socket buffers and the 256 KB limit
    stuck = subscribe(s.port, "news", rcvbuf=4096)
    reader = subscribe(s.port, "news")
    counts = []
    with Wire.to(s.port) as publisher, stuck, reader:
        for _ in range(n):
            reply = publisher.call("PUBLISH", "news", payload)
            counts.append(int(reply[1:-2]))
            assert reader.read_reply() == message(b"news", payload)
        # every PUBLISH was answered and the reader got every message, while
        # the stuck subscriber was cut off once its output passed the limit
        assert counts[0] == 2 and counts[-1] == 1, counts
        assert counts == sorted(counts, reverse=True)
        assert publisher.call("PUBSUB", "NUMSUB", "news") == b"*2\r\n$4\r\nnews\r\n:1\r\n"
    assert "closing subscriber id=" in s.log() and "over the hard limit" in s.log()


def test_a_normal_client_keeps_the_normal_limit_when_pubsub_is_lower(make_server):
    s = make_server("--client-output-buffer-limit", "pubsub", "1kb", "0", "0")
    with Wire.to(s.port) as w:
        w.send(command("CONFIG", "GET", "*") * 50)      # ~50 KB of replies, unread for now
        time.sleep(0.2)
        for _ in range(50):
            w.read_reply()
        assert w.call("PING") == b"+PONG\r\n"


def test_client_list_shows_subscriptions_and_the_pubsub_type(server):
    client = server.client(protocol=2)
    with subscribe(server.port, "a", "b") as sub, Wire.to(server.port) as plain:
        sub.send(command("PSUBSCRIBE", "p*"))
        sub.read_reply()
        plain.call("PING")
        me = client.client_id()
        line = next(c for c in client.client_list() if int(c["id"]) not in (me,)
                    and c["sub"] == "2")
        assert (line["flags"], line["psub"]) == ("P", "1")
        pubsub = client.client_list(_type="pubsub")
        assert [c["sub"] for c in pubsub] == ["2"]
        assert all(c["flags"] != "P" for c in client.client_list(_type="normal"))


def test_client_kill_type_pubsub_closes_subscribers_but_not_the_caller_or_normal_clients(
        make_server):
    server = make_server()
    with subscribe(server.port, "k1") as first, subscribe(server.port, "k2") as second, \
            Wire.to(server.port) as plain, Wire.to(server.port) as caller:
        caller.send(command("HELLO", "3"))
        caller.read_reply()
        caller.send(command("SUBSCRIBE", "mine"))
        caller.read_reply()
        assert plain.call("CLIENT", "KILL", "TYPE", "normal") == b":0\r\n"   # all others subscribe
        assert first.is_open() and second.is_open()
        assert caller.call("CLIENT", "KILL", "TYPE", "pubsub") == b":2\r\n"
        first.read_until_closed()
        second.read_until_closed()
        assert caller.call("PING") == b"+PONG\r\n"
        assert plain.call("PING") == b"+PONG\r\n"


def test_client_kill_type_normal_leaves_subscribers(make_server):
    server = make_server()
    with subscribe(server.port, "stay") as sub, Wire.to(server.port) as caller:
        caller.call("CLIENT", "KILL", "TYPE", "normal")
        assert sub.is_open()
        assert caller.call("PUBLISH", "stay", "m") == b":1\r\n"


def test_a_client_vanishing_mid_subscribe_leaves_no_subscription(server):
    client = server.client(protocol=2)
    with Wire.to(server.port) as half:
        half.send(command("SUBSCRIBE", "gone1", "gone2")[:-3])   # the last channel unfinished
        half.rst()
    w = subscribe(server.port, "gone1", "gone3")
    w.send(command("PSUBSCRIBE", "gone*"))
    w.read_reply()
    w.rst()
    wait_until(lambda: client.publish("gone1", "m") == 0, what="the subscriptions to go")
    assert client.pubsub_numsub("gone1", "gone2", "gone3") == [
        (b"gone1", 0), (b"gone2", 0), (b"gone3", 0)]
    assert client.pubsub_numpat() == 0
    stats = info(client)
    assert (stats["pubsub_channels"], stats["pubsub_patterns"], stats["mem_pubsub"]) == (0, 0, 0)
    assert server.alive()


def test_info_counts_channels_patterns_and_their_memory(server):
    client = server.client(protocol=2)
    with subscribe(server.port, *[f"info{i}" for i in range(100)]) as w:
        w.send(command("PSUBSCRIBE", "p1*", "p2*"))
        w.read_reply()
        w.read_reply()
        stats = info(client)
        assert (stats["pubsub_channels"], stats["pubsub_patterns"]) == (100, 2)
        assert stats["mem_pubsub"] > 100 * 5
    wait_until(lambda: info(client)["pubsub_channels"] == 0, what="the channels to go")
    assert info(client)["mem_pubsub"] == 0


@pytest.mark.untraced
def test_hostile_patterns_are_matched_in_bounded_time(server):
    """Patterns that make naive backtracking exponential, a deep one that
    would overflow a recursive matcher's stack, and a long near-match."""
    hostile = [b"*a" * 2000 + b"b", b"*" * 100_000 + b"b", b"*" + b"a" * 1000 + b"b",
               b"[a]*" * 5000 + b"b"]
    channel = b"a" * 10_000
    with Wire.to(server.port) as sub, Wire.to(server.port) as publisher:
        sub.send(command("PSUBSCRIBE", *hostile))
        for _ in hostile:
            sub.read_reply()
        before = cpu_seconds(server.proc.pid)
        for _ in range(10):
            assert publisher.call("PUBLISH", channel, "m") == b":0\r\n"
        assert cpu_seconds(server.proc.pid) - before < 5.0      # generous: about 0.2 s here
        assert publisher.call("PUBLISH", b"a" * 5000 + b"b", "m") == b":4\r\n"


@pytest.mark.untraced
def test_glob_without_recursion_takes_a_million_stars():
    assert glob(b"*" * 1_000_000 + b"a", b"ba")
    assert not glob(b"*a" * 500_000, b"b" * 100)
    assert not glob(b"*", b"")       # as stringmatchlen: only "" matches ""


# ---- client-output-buffer-limit's classes ---------------------------------------------

def config_value(port: int) -> bytes:
    with Wire.to(port) as w:
        reply = w.call("CONFIG", "GET", "client-output-buffer-limit")
    return reply.split(b"\r\n")[-2]


@pytest.mark.parametrize("value", [
    "normal 1mb 512kb 10 slave 64mb 16mb 30 pubsub 2mb 1mb 5",
    "pubsub 1048576 0 0 replica 1gb 0 0 normal 0 0 0",
])
def test_output_limit_classes_are_set_and_shown_as_redis_shows_them(make_server, redis_server,
                                                                    value):
    s = make_server()
    for port in (s.port, redis_server.port):
        with Wire.to(port) as w:
            assert w.call("CONFIG", "SET", "client-output-buffer-limit", value) == b"+OK\r\n"
    assert config_value(s.port) == config_value(redis_server.port)
    with Wire.to(redis_server.port) as w:     # the shared redis-server as it was
        w.call("CONFIG", "SET", "client-output-buffer-limit",
               "normal 0 0 0 slave 256mb 64mb 60 pubsub 32mb 8mb 60")


def test_output_limit_set_changes_only_the_classes_given(make_server):
    s = make_server("--client-output-buffer-limit", "1mb", "2mb", "3")
    assert config_value(s.port) == (b"normal 1048576 2097152 3 slave 268435456 67108864 60 "
                                    b"pubsub 33554432 8388608 60")
    with Wire.to(s.port) as w:
        assert w.call("CONFIG", "SET", "client-output-buffer-limit", "pubsub 4mb 0 0") == \
            b"+OK\r\n"
        assert w.call("CONFIG", "SET", "client-output-buffer-limit", "5mb 0 0") == b"+OK\r\n"
        assert w.call("CONFIG", "SET", "client-output-buffer-limit", "master 1 1 1") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit')"
            b" - Invalid client class specified in buffer limit configuration.\r\n")
        assert w.call("CONFIG", "SET", "client-output-buffer-limit", "pubsub 1 1") == (
            b"-ERR CONFIG SET failed (possibly related to argument 'client-output-buffer-limit')"
            b" - Wrong number of arguments in buffer limit configuration.\r\n")
    assert config_value(s.port) == (b"normal 5242880 0 0 slave 268435456 67108864 60 "
                                    b"pubsub 4194304 0 0")


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_pubsub_receives_messages_and_pattern_messages(server, protocol):
    client = server.client(protocol=protocol)
    ps = client.pubsub()
    ps.subscribe("rp")
    ps.psubscribe("rp.*")
    confirmations = [ps.get_message(timeout=5)["type"] for _ in range(2)]
    assert confirmations == ["subscribe", "psubscribe"]
    assert client.publish("rp", "one") == 1
    assert client.publish("rp.x", "two") == 1
    got = [ps.get_message(timeout=5) for _ in range(2)]
    assert [(m["type"], m["channel"], m["data"]) for m in got] == [
        ("message", b"rp", b"one"), ("pmessage", b"rp.x", b"two")]
    assert got[1]["pattern"] == b"rp.*"
    ps.close()
    client.close()


def test_a_clients_subscriptions_are_bounded_by_the_pubsub_hard_limit(make_server):
    s = make_server("--client-output-buffer-limit", "pubsub", "64kb", "0", "0")
    client = s.client(protocol=2)
    with Wire.to(s.port) as w:
        names = [b"c%04d" % i for i in range(100)]
        w.send(command("SUBSCRIBE", *names))
        for _ in names:
            w.read_reply()
        big = [b"x%06d" % i + b"y" * 1000 for i in range(100)]      # ~100 KB of names
        reply = w.call("SUBSCRIBE", *big)
        assert reply.startswith(b"-ERR this client's subscriptions would hold "), reply
        assert client.pubsub_numsub(big[0]) == [(big[0], 0)]       # none of it was done
        assert client.publish("c0001", "m") == 1
        assert w.read_reply() == message(b"c0001", b"m")


def test_sentinel_hello_frames_are_exactly_what_hiredis_expects(server):
    with Wire.to(server.port) as sentinel, Wire.to(server.port) as other:
        assert sentinel.call("SUBSCRIBE", "__sentinel__:hello") == \
            b"*3\r\n$9\r\nsubscribe\r\n$18\r\n__sentinel__:hello\r\n:1\r\n"
        hello = b"127.0.0.1,26379,%s,0,mymaster,127.0.0.1,6379,0" % (b"a" * 40)
        assert other.call("PUBLISH", "__sentinel__:hello", hello) == b":1\r\n"
        assert sentinel.read_reply() == message(b"__sentinel__:hello", hello)


def test_client_kill_drops_a_stuck_subscribers_subscriptions_at_once(make_server):
    s = make_server()
    stuck = subscribe(s.port, "jam", rcvbuf=4096)
    with stuck, Wire.to(s.port) as admin:
        for _ in range(300):        # ~5 MB the subscriber never reads
            admin.call("PUBLISH", "jam", b"x" * 16384)
        assert admin.call("CLIENT", "KILL", "TYPE", "pubsub") == b":1\r\n"
        assert admin.call("PUBSUB", "NUMSUB", "jam") == b"*2\r\n$3\r\njam\r\n:0\r\n"
        assert admin.call("PUBLISH", "jam", "m") == b":0\r\n"
