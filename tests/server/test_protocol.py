"""The wire protocol against real server processes, over raw sockets.

Malformed input gets Redis's exact error line and then that connection
closes; every other client keeps getting correct answers.  Limits
(proto-max-bulk-len, client-query-buffer-limit, client-output-buffer-limit,
maxclients, requirepass) are checked on servers started with those flags.
Where Redis defines the answer, it is compared byte for byte with a real
redis-server (the ``redis_server`` fixture).

Everything is bounded: socket reads have deadlines (at most 10 s), loops
have counts, random input is seeded.  Rate-limit time never sleeps: the
servers run ``--manual-clock`` and move with DEBUG CLOCK SET.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import time

import pytest

from wire import TIMEOUT, Wire, command, wait_until

PE = b"-ERR Protocol error: "
# CL.CHECK <fresh key> 5 2 -> allowed, limit 5, 4 left, no wait, full in 500 ms
FRESH_CHECK = b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n"
_keys = itertools.count()
_run = os.urandom(4).hex()


def fresh_key(prefix: str = "k") -> bytes:
    return f"{prefix}:{_run}:{next(_keys)}".encode()


def check(n: int, allowed: int, remaining: int, retry: int, reset: int) -> bytes:
    return b"*5\r\n:%d\r\n:%d\r\n:%d\r\n:%d\r\n:%d\r\n" % (allowed, n, remaining, retry, reset)


def drain(w: Wire, wait: float) -> None:
    """Reads whatever arrives until nothing has come for wait seconds."""
    while w.fill(time.monotonic() + wait):
        pass


class Observer:
    """A client connected for the whole test that must keep working."""

    def __init__(self, srv, auth: bytes | None = None):
        self.srv = srv
        self.w = Wire.to(srv.port)
        if auth is not None:
            assert self.w.call("AUTH", auth) == b"+OK\r\n"
        self.assert_ok()

    def assert_ok(self) -> None:
        assert self.srv.alive(), self.srv.log()
        assert self.w.call_raw(b"PING\r\n") == b"+PONG\r\n"
        assert self.w.call("CL.CHECK", fresh_key("obs"), 5, 2) == FRESH_CHECK
        assert self.w.call("ECHO", b"still here") == b"$10\r\nstill here\r\n"

    def info_clients(self) -> int:
        reply = self.w.call("INFO", "clients")
        for line in reply.split(b"\r\n"):
            if line.startswith(b"connected_clients:"):
                return int(line.split(b":")[1])
        raise AssertionError(reply)

    def client_list(self) -> list[bytes]:
        reply = self.w.call("CLIENT", "LIST")
        body = reply.split(b"\r\n", 1)[1][:-2]
        return [line for line in body.split(b"\n") if line]

    def wait_clients(self, n: int) -> None:
        wait_until(lambda: self.info_clients() == n, what=f"connected_clients == {n}")
        assert len(self.client_list()) == n

    def close(self) -> None:
        self.w.close()


@pytest.fixture
def obs(server, r):
    """An observer on the shared manual-clock server (clock 0, flushed)."""
    o = Observer(server)
    yield o
    o.assert_ok()
    o.close()


# ---- malformed input: error line, close, others unaffected --------------------

MALFORMED = [
    ("mbulk letters", b"*abc\r\n", b"invalid multibulk length"),
    ("mbulk empty", b"*\r\n", b"invalid multibulk length"),
    ("mbulk minus", b"*-\r\n", b"invalid multibulk length"),
    ("mbulk plus sign", b"*+1\r\n$4\r\nPING\r\n", b"invalid multibulk length"),
    ("mbulk leading zero", b"*01\r\n$4\r\nPING\r\n", b"invalid multibulk length"),
    ("mbulk space", b"* 1\r\n", b"invalid multibulk length"),
    ("mbulk overflow", b"*99999999999999999999\r\n", b"invalid multibulk length"),
    ("mbulk INT64_MAX+1", b"*9223372036854775808\r\n", b"invalid multibulk length"),
    ("mbulk over INT_MAX", b"*2147483648\r\n", b"invalid multibulk length"),
    ("bulk letters", b"*1\r\n$abc\r\n", b"invalid bulk length"),
    ("bulk empty", b"*1\r\n$\r\n", b"invalid bulk length"),
    ("bulk -1", b"*1\r\n$-1\r\n", b"invalid bulk length"),
    ("bulk negative", b"*2\r\n$4\r\nECHO\r\n$-7\r\n", b"invalid bulk length"),
    ("bulk plus sign", b"*1\r\n$+4\r\nPING\r\n", b"invalid bulk length"),
    ("bulk leading zero", b"*1\r\n$04\r\nPING\r\n", b"invalid bulk length"),
    ("bulk overflow", b"*1\r\n$99999999999999999999\r\n", b"invalid bulk length"),
    ("bulk 2000000000 over the 512MB default", b"*3\r\n$2000000000\r\n",
     b"invalid bulk length"),
    ("bulk 512MB+1", b"*1\r\n$536870913\r\n", b"invalid bulk length"),
    ("expected $ got x", b"*1\r\nx\r\n", b"expected '$', got 'x'"),
    ("expected $ got colon", b"*2\r\n$4\r\nECHO\r\n:1\r\n", b"expected '$', got ':'"),
    ("expected $ got CR (shown as a space)", b"*1\r\n\r\n", b"expected '$', got ' '"),
    ("too big inline", b"x" * 65537, b"too big inline request"),
    ("too big mbulk count", b"*" + b"1" * 65536, b"too big mbulk count string"),
    ("too big bulk count", b"*1\r\n$" + b"1" * 65536, b"too big bulk count string"),
    ("unbalanced double quote", b'ECHO "abc\r\n', b"unbalanced quotes in request"),
    ("unbalanced single quote", b"ECHO 'abc\r\n", b"unbalanced quotes in request"),
    ("text after closing quote", b'ECHO "a"b\r\n', b"unbalanced quotes in request"),
    ("bulk not ended by CRLF", b"*2\r\n$4\r\nECHO\r\n$3\r\nabcde",
     b"expected CRLF after bulk data"),
]


@pytest.mark.parametrize("data, error", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_input_gets_the_redis_error_and_is_closed(server, obs, data, error):
    baseline = obs.info_clients()
    bad = Wire.to(server.port)
    assert bad.call_raw(b"PING\r\n") == b"+PONG\r\n"
    obs.wait_clients(baseline + 1)
    bad.send(data)
    assert bad.read_until_closed() == PE + error + b"\r\n"
    bad.close()
    obs.assert_ok()
    obs.wait_clients(baseline)


def test_commands_before_the_bad_frame_get_their_replies(server, obs):
    key = fresh_key()
    w = Wire.to(server.port)
    w.send(b"PING\r\n" + command("CL.CHECK", key, 5, 2) + b"ECHO hi\r\n"
           + command("CL.CHECK", key, 5, 2) + b"*1\r\n$x\r\n" + b"PING\r\n"
           + command("ECHO", "late"))
    assert w.read_until_closed() == (
        b"+PONG\r\n" + FRESH_CHECK + b"$2\r\nhi\r\n" + check(5, 1, 3, 0, 1000)
        + PE + b"invalid bulk length\r\n")
    w.close()
    # the commands after the bad frame never ran
    assert obs.w.call("CL.CHECK", key, 5, 2) == check(5, 1, 2, 0, 1500)


def test_error_in_a_later_read_after_good_reads(server, obs):
    w = Wire.to(server.port)
    for i in range(5):
        assert w.call("ECHO", i) == b"$1\r\n%d\r\n" % i
    w.send(b"*2\r\n$4\r\nECHO\r\n")          # half a command ...
    assert w.is_open()
    w.send(b"?3\r\nabc\r\n")                 # ... and a bad second half
    assert w.read_until_closed() == PE + b"expected '$', got '?'\r\n"
    w.close()


# ---- inline commands and pipelines -----------------------------------------------

def test_inline_commands(server, obs):
    w = Wire.to(server.port)
    assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
    assert w.call_raw(b"ping\n") == b"+PONG\r\n"
    assert w.call_raw(b"CL.CHECK " + fresh_key() + b" 5 2\r\n") == FRESH_CHECK
    assert w.call_raw(b'ECHO "a b"\r\n') == b"$3\r\na b\r\n"
    assert w.call_raw(b"ECHO 'c d'\r\n") == b"$3\r\nc d\r\n"
    assert w.call_raw(b'ECHO "\\x41\\x42\\n"\r\n') == b"$3\r\nAB\n\r\n"
    assert w.call_raw(b"PING hello\r\n") == b"$5\r\nhello\r\n"
    # bare CRLF, blank lines, *0 and *-1 are ignored: the next reply is PING's
    assert w.call_raw(b"\r\n\r\n   \r\n\n*0\r\n*-1\r\nPING\r\n") == b"+PONG\r\n"
    assert w.is_open(0.1) and w.buf == b""
    w.close()


def test_inline_and_multibulk_pipelined_in_one_write(server, obs):
    key = fresh_key()
    w = Wire.to(server.port)
    w.send(b"PING\r\n" + command("PING") + b"CL.CHECK " + key + b" 5 2\r\n"
           + command("CL.CHECK", key, 5, 2) + b"\r\n" + command("ECHO", b"\x00\r\n\xff")
           + b"ECHO x\n")
    expected = [b"+PONG\r\n", b"+PONG\r\n", FRESH_CHECK, check(5, 1, 3, 0, 1000),
                b"$4\r\n\x00\r\n\xff\r\n", b"$1\r\nx\r\n"]
    assert [w.read_reply() for _ in expected] == expected
    w.close()


def one_byte_pipeline():
    """A pipeline of many commands (multibulk and inline) and its replies,
    on fresh keys at a fixed clock."""
    data, replies = [], []
    a, b = fresh_key(), fresh_key()
    for i in range(6):      # the brief's worked example at t=0: 5 allowed, then denied
        data.append(command("CL.CHECK", a, 5, 2) if i % 2 else b"CL.CHECK " + a + b" 5 2\r\n")
    replies += [check(5, 1, 4 - i, 0, 500 * (i + 1)) for i in range(5)]
    replies.append(check(5, 0, 0, 500, 2500))
    data += [command("CL.CHECK", b, 10, 1, "COST", 4), b"CL.CHECK " + b + b" 10 1 COST 7\r\n"]
    replies += [check(10, 1, 6, 0, 4000), check(10, 0, 6, 1000, 4000)]
    data += [b"PING\r\n", command("PING", b"pi\r\nng"), b"\r\n", b"*0\r\n", command("ECHO", b""),
             b'ECHO "q \\"x\\""\r\n', command("ECHO", bytes(range(256)))]
    replies += [b"+PONG\r\n", b"$6\r\npi\r\nng\r\n", b"$0\r\n\r\n", b'$5\r\nq "x"\r\n',
                b"$256\r\n" + bytes(range(256)) + b"\r\n"]
    for i in range(20):
        data.append(command("ECHO", f"n{i}"))
        replies.append(b"$%d\r\nn%d\r\n" % (len(str(i)) + 1, i))
    return b"".join(data), b"".join(replies)


def test_pipeline_fed_one_byte_at_a_time(server, obs):
    data, expected = one_byte_pipeline()
    w = Wire.to(server.port)
    for i in range(len(data)):
        w.send(data[i:i + 1])
    assert w.read_exact(len(expected)) == expected
    assert w.is_open(0.1) and w.buf == b""
    w.close()


def test_pipeline_in_random_chunks(server, obs):
    rng = random.Random(77)
    w = Wire.to(server.port)
    for _ in range(10):
        data, expected = one_byte_pipeline()
        i = 0
        while i < len(data):
            n = rng.choice((1, 2, 3, 5, 13, 64, 500))
            w.send(data[i:i + n])
            i += n
            if rng.random() < 0.1:
                time.sleep(0.001)
        assert w.read_exact(len(expected)) == expected
    w.close()


@pytest.mark.untraced  # 20,000 commands
def test_big_pipeline_in_one_write(server, obs):
    key = fresh_key()
    w = Wire.to(server.port)
    n = 20000
    w.send(command("CL.CHECK", key, 100000, 1) * n)
    expected = b"".join(check(100000, 1, 100000 - i - 1, 0, (i + 1) * 1000) for i in range(n))
    assert w.read_exact(len(expected)) == expected
    w.close()


def test_clock_set_in_a_pipeline_applies_to_the_commands_after_it(server, obs):
    # The brief's worked example, capacity 5, refill 2/s, in ONE write:
    # t=0 x6 -> allowed x5 then denied; 500 -> allowed; 500 -> denied;
    # 1500, 1500 -> allowed, allowed; 1500 -> denied.
    key = fresh_key()
    w = Wire.to(server.port)
    c = command("CL.CHECK", key, 5, 2)
    w.send(command("DEBUG", "CLOCK", "SET", 0) + c * 6
           + command("DEBUG", "CLOCK", "SET", 500) + c * 2
           + command("DEBUG", "CLOCK", "SET", 1500) + c * 3)
    replies = [w.read_reply() for _ in range(14)]
    allowed = [int(r.split(b"\r\n")[1][1:]) for r in replies if r.startswith(b"*5")]
    assert allowed == [1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0]
    assert replies[7] == b":500\r\n" and replies[10] == b":1500\r\n"
    assert replies[8] == check(5, 1, 0, 0, 2500)      # t=500
    assert replies[11] == check(5, 1, 1, 0, 2000)     # t=1500
    w.close()


def test_clock_set_in_separate_round_trips(server, obs):
    # the same worked example, one command per round trip
    key = fresh_key()
    w = Wire.to(server.port)
    got = []
    for t, n in ((0, 6), (500, 2), (1500, 3)):
        assert w.call("DEBUG", "CLOCK", "SET", t) == b":%d\r\n" % t
        got += [w.call("CL.CHECK", key, 5, 2) for _ in range(n)]
    assert got == [check(5, 1, 4, 0, 500), check(5, 1, 3, 0, 1000), check(5, 1, 2, 0, 1500),
                   check(5, 1, 1, 0, 2000), check(5, 1, 0, 0, 2500), check(5, 0, 0, 500, 2500),
                   check(5, 1, 0, 0, 2500), check(5, 0, 0, 500, 2500),
                   check(5, 1, 1, 0, 2000), check(5, 1, 0, 0, 2500), check(5, 0, 0, 500, 2500)]
    w.close()


# ---- hostile and vanishing clients ---------------------------------------------

ALPHABET = b"*$\r\n\r\n0123456789-+ \"'\\xPINGECHO\x00\xff\t"


@pytest.fixture
def fuzzsrv(make_server):
    """A server of its own for hostile input, so that whatever it does
    cannot leak into the shared server other tests use."""
    srv = make_server("--manual-clock")
    o = Observer(srv)
    yield srv, o
    o.assert_ok()
    assert srv.alive(), srv.log()
    assert "Traceback" not in srv.log(), srv.log()


def test_random_bytes_never_hurt_other_clients(fuzzsrv):
    srv, obs = fuzzsrv
    rng = random.Random(4242)
    baseline = obs.info_clients()
    closed_by_server = 0
    for round_ in range(40):
        w = Wire.to(srv.port)
        n = rng.randrange(1, 600)
        if round_ % 2:
            data = rng.randbytes(n)
        else:
            data = bytes(rng.choice(ALPHABET) for _ in range(n))
        try:
            for i in range(0, len(data), 37):
                w.send(data[i:i + 37])
        except (BrokenPipeError, ConnectionResetError):
            pass
        drain(w, 0.05)
        closed_by_server += w.eof
        (w.rst if round_ % 3 == 0 else w.close)()
        obs.assert_ok()
    obs.wait_clients(baseline)
    assert closed_by_server > 5      # the garbage really hit protocol errors


def test_mutated_frames_never_hurt_other_clients(fuzzsrv):
    srv, obs = fuzzsrv
    rng = random.Random(99)
    baseline = obs.info_clients()
    frames = [command("CL.CHECK", "fuzz:a", 5, 2), command("ECHO", "hello"), b"PING\r\n",
              b"CL.CHECK fuzz:b 5 2 COST 2\r\n", command("PING", "x")]
    for round_ in range(60):
        data = bytearray(b"".join(rng.choice(frames) for _ in range(5)))
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[i] = rng.choice(ALPHABET)
            elif op == 1:
                del data[i]
            else:
                data[i:i] = bytes([rng.choice(ALPHABET)])
        w = Wire.to(srv.port)
        try:
            w.send(bytes(data))
        except (BrokenPipeError, ConnectionResetError):
            pass
        drain(w, 0.02)
        w.close()
        if round_ % 4 == 0:
            obs.assert_ok()
    obs.wait_clients(baseline)


@pytest.mark.parametrize("byte", [b"\x80", b"\xe9", b"\xff"])
def test_protocol_error_naming_a_non_ascii_byte(make_server, redis_server, byte):
    # Redis names the offending byte as is; the replies before it still
    # arrive, and nothing of this client's output reaches another client.
    # (A server of its own: a failure here could leak into later tests.)
    srv = make_server("--manual-clock")
    data = b"PING\r\nECHO only-for-a\r\n*1\r\n" + byte + b"x\r\n"
    expected = (b"+PONG\r\n$10\r\nonly-for-a\r\n"
                + PE + b"expected '$', got '" + byte + b"'\r\n")
    a = Wire.to(redis_server.port)
    a.send(data)
    assert a.read_until_closed() == expected
    a.close()
    b = Wire.to(srv.port)
    assert b.call_raw(b"PING\r\n") == b"+PONG\r\n"
    a = Wire.to(srv.port)
    a.send(data)
    got_a = a.read_until_closed()
    assert (got_a, b.call_raw(b"ECHO b\r\n")) == (expected, b"$1\r\nb\r\n")
    drain(b, 0.1)
    assert b.buf == b""                  # and nothing more
    assert "Traceback" not in srv.log(), srv.log()


@pytest.mark.parametrize("how", ["close", "rst"])
def test_client_vanishing_mid_frame_leaves_nothing_behind(server, obs, how):
    baseline = obs.info_clients()
    partial = b"*3\r\n$8\r\nCL.CHECK\r\n$3\r\nab"
    w = Wire.to(server.port)
    port = w.sock.getsockname()[1]
    w.send(partial)
    addr = f"addr=127.0.0.1:{port} ".encode()
    mine = wait_until(
        lambda: [c for c in obs.client_list() if addr in c and b" qbuf=%d " % len(partial) in c],
        what="the half-sent frame to show in CLIENT LIST")
    assert len(mine) == 1
    (w.rst if how == "rst" else w.close)()
    obs.wait_clients(baseline)
    assert not [c for c in obs.client_list() if addr in c]
    obs.assert_ok()


def bad_frames(srv, n: int) -> None:
    for _ in range(n):
        w = Wire.to(srv.port)
        w.send(b"*x\r\n")
        assert w.read_until_closed() == PE + b"invalid multibulk length\r\n"
        w.close()


def test_protocol_errors_write_no_log_lines_at_the_default_level(make_server):
    srv = make_server()
    lines = len(srv.log().splitlines())
    bad_frames(srv, 200)
    # before: one INFO line per connection, as fast as a client can connect
    assert len(srv.log().splitlines()) == lines, srv.log()[-500:]
    assert srv.client().info("clients")["protocol_error_disconnections"] == 200


def test_protocol_errors_are_logged_at_verbose(make_server):
    srv = make_server("--loglevel", "verbose")
    bad_frames(srv, 3)
    wait_until(lambda: srv.log().count("Protocol error: invalid multibulk length; closing") == 3,
               what="three verbose log lines")


def test_huge_declared_bulk_allocates_nothing(server, obs):
    # 512MB is allowed by default: the server waits for the data, and the
    # declared size is not allocated up front
    rss_before = server.rss_bytes()
    ws = [Wire.to(server.port) for _ in range(4)]
    for w in ws:
        w.send(b"*2\r\n$4\r\nECHO\r\n$536870912\r\n" + b"x" * 1000)
    for w in ws:
        assert w.is_open(0.1) and w.buf == b""
    obs.assert_ok()
    assert server.rss_bytes() - rss_before < 64 * 1024 * 1024
    for w in ws:
        w.close()


# ---- limits on servers started with flags ------------------------------------------

def test_proto_max_bulk_len(make_server):
    srv = make_server("--manual-clock", "--proto-max-bulk-len", "1kb")
    o = Observer(srv)
    ok = Wire.to(srv.port)
    assert ok.call("ECHO", b"a" * 1024) == b"$1024\r\n" + b"a" * 1024 + b"\r\n"
    bad = Wire.to(srv.port)
    bad.send(command("ECHO", b"b" * 2000))
    assert bad.read_until_closed() == PE + b"invalid bulk length\r\n"
    assert ok.call_raw(b"PING\r\n") == b"+PONG\r\n"
    o.assert_ok()


def test_query_buffer_limit_disconnects_a_streaming_client(make_server):
    srv = make_server("--manual-clock", "--client-query-buffer-limit", "64kb")
    o = Observer(srv)
    baseline = o.info_clients()
    # a complete command under the limit is fine
    assert o.w.call("ECHO", b"e" * 60000) == b"$60000\r\n" + b"e" * 60000 + b"\r\n"
    w = Wire.to(srv.port)
    w.send(b"*2\r\n$4\r\nECHO\r\n$1048576\r\n")
    sent, chunk, closed = 0, b"z" * 4096, False
    deadline = time.monotonic() + TIMEOUT
    try:
        while sent < 1024 * 1024 and time.monotonic() < deadline:
            w.send(chunk)
            sent += len(chunk)
            if sent % (64 * 1024) == 0 and not w.is_open(0.01):
                closed = True
                break
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    assert closed, f"still connected after streaming {sent} bytes into a 64kb query buffer"
    wait_until(lambda: "max query buffer" in srv.log(), what="the log line")
    w.close()
    o.wait_clients(baseline)
    o.assert_ok()


def test_output_buffer_limit_disconnects_a_client_that_never_reads(make_server):
    srv = make_server("--manual-clock", "--client-output-buffer-limit", "256kb", "128kb", "1")
    o = Observer(srv)
    baseline = o.info_clients()
    rss_before = srv.rss_bytes()
    w = Wire.to(srv.port)
    w.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
    o.wait_clients(baseline + 1)
    cmd = command("PING", b"p" * 1000)
    deadline = time.monotonic() + TIMEOUT
    sent = 0
    try:
        # at most 50 MB of replies; kernel buffers take a few MB, then the
        # 256kb hard limit must hit
        while sent < 50000 and time.monotonic() < deadline:
            w.send(cmd * 100)
            sent += 100
            if sent % 1000 == 0 and o.info_clients() == baseline:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    o.wait_clients(baseline)
    assert "over the hard limit" in srv.log() or "over the soft limit" in srv.log()
    assert srv.rss_bytes() - rss_before < 64 * 1024 * 1024
    w.close()
    o.assert_ok()


def test_maxclients(make_server):
    srv = make_server("--manual-clock", "--maxclients", "3")
    ws = [Wire.to(srv.port) for _ in range(3)]
    for w in ws:
        assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
    extra = Wire.to(srv.port)
    assert extra.read_until_closed() == b"-ERR max number of clients reached\r\n"
    extra.close()
    # the three are untouched
    for w in ws:
        assert w.call("CL.CHECK", fresh_key(), 5, 2) == FRESH_CHECK
    # a slot frees up when one leaves
    ws.pop().close()

    def reconnect():
        w = Wire.to(srv.port)
        w.send(b"PING\r\n")
        reply = w.read_line()
        if reply == b"+PONG\r\n":
            return w
        w.close()
        return None

    w = wait_until(reconnect, what="a free client slot")
    stats = w.call("INFO", "stats").decode()
    assert int(stats.split("rejected_connections:")[1].split()[0]) >= 1
    ws.append(w)
    for w in ws:
        assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
        w.close()


# ---- requirepass -------------------------------------------------------------------

NOAUTH = b"-NOAUTH Authentication required.\r\n"
WRONGPASS = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"


@pytest.fixture
def authsrv(make_server):
    return make_server("--manual-clock", "--requirepass", "secret")


def test_noauth_before_auth(authsrv):
    o = Observer(authsrv, auth=b"secret")
    w = Wire.to(authsrv.port)
    for cmd in (b"PING\r\n", command("PING"), b"CL.CHECK k 5 2\r\n", command("ECHO", "a"),
                b"INFO\r\n", b"CLIENT LIST\r\n", b"DEBUG CLOCK GET\r\n", b"CONFIG GET *\r\n",
                b"DBSIZE\r\n", b"MULTI\r\n", b"EXEC\r\n", b"CL.RESET k\r\n"):
        assert w.call_raw(cmd) == NOAUTH, cmd
    # as Redis: unknown commands and wrong arity are reported before NOAUTH
    assert w.call_raw(b"foo a\r\n") == (
        b"-ERR unknown command 'foo', with args beginning with: 'a' \r\n")
    assert w.call_raw(b"ECHO\r\n") == b"-ERR wrong number of arguments for 'echo' command\r\n"
    # nothing ran: the key is still fresh for an authenticated client
    assert o.w.call_raw(b"CL.CHECK k 5 2\r\n") == FRESH_CHECK
    o.assert_ok()


def test_auth_wrong_then_right(authsrv):
    w = Wire.to(authsrv.port)
    assert w.call_raw(b"AUTH wrong\r\n") == WRONGPASS
    assert w.call_raw(b"AUTH default wrong\r\n") == WRONGPASS
    assert w.call_raw(b"AUTH someone secret\r\n") == WRONGPASS
    assert w.call_raw(b"PING\r\n") == NOAUTH
    assert w.call_raw(b"AUTH secret\r\n") == b"+OK\r\n"
    assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
    assert w.call("CL.CHECK", fresh_key(), 5, 2) == FRESH_CHECK
    w2 = Wire.to(authsrv.port)
    assert w2.call("AUTH", "default", "secret") == b"+OK\r\n"
    assert w2.call_raw(b"PING\r\n") == b"+PONG\r\n"
    # RESET forgets the authentication
    assert w2.call_raw(b"RESET\r\n") == b"+RESET\r\n"
    assert w2.call_raw(b"PING\r\n") == NOAUTH


def test_hello_auth(authsrv):
    w = Wire.to(authsrv.port)
    assert w.call_raw(b"HELLO 3 AUTH default wrong\r\n") == WRONGPASS
    refused = w.call_raw(b"HELLO 3\r\n")
    assert refused.startswith(b"-NOAUTH HELLO must be called with the client already "
                              b"authenticated")
    assert w.call_raw(b"PING\r\n") == NOAUTH
    hello = w.call("HELLO", 3, "AUTH", "default", "secret")
    assert hello.startswith(b"%")
    assert b"$5\r\nproto\r\n:3\r\n" in hello
    assert w.call_raw(b"PING\r\n") == b"+PONG\r\n"
    assert w.call("CL.CHECK", fresh_key(), 5, 2) == FRESH_CHECK
    assert w.call("HELLO", 2).startswith(b"*")


def test_quit_before_auth(authsrv):
    w = Wire.to(authsrv.port)
    w.send(b"QUIT\r\n")
    assert w.read_until_closed() == b"+OK\r\n"


@pytest.mark.parametrize("data, error", [
    (command(*["x"] * 11), b"unauthenticated multibulk length"),
    (b"*11\r\n", b"unauthenticated multibulk length"),
    (b"*2\r\n$4\r\nAUTH\r\n$16385\r\n", b"unauthenticated bulk length"),
])
def test_unauthenticated_limits(authsrv, data, error):
    o = Observer(authsrv, auth=b"secret")
    w = Wire.to(authsrv.port)
    w.send(data)
    assert w.read_until_closed() == PE + error + b"\r\n"
    o.assert_ok()


def test_limits_lift_after_auth_in_the_same_write(authsrv):
    w = Wire.to(authsrv.port)
    big = command("ECHO", b"v" * 20000)
    w.send(b"AUTH secret\r\n" + command("foo", *["x"] * 10) + big)
    assert w.read_reply() == b"+OK\r\n"
    assert w.read_reply().startswith(b"-ERR unknown command 'foo', with args beginning with: 'x'")
    assert w.read_reply() == b"$20000\r\n" + b"v" * 20000 + b"\r\n"
    # and come back after RESET
    w.send(b"RESET\r\n" + command("foo", *["x"] * 10))
    assert w.read_until_closed() == b"+RESET\r\n" + PE + b"unauthenticated multibulk length\r\n"


# ---- byte for byte with redis-server ---------------------------------------------

def reply_and_close(srv, data: bytes) -> tuple[bytes, bool]:
    """One RESP reply to data (or whatever came before a close), and
    whether the server then closed the connection."""
    w = Wire.to(srv.port)
    w.send(data)
    try:
        reply = w.read_reply()
    except (EOFError, TimeoutError):
        reply, w.buf = w.buf, b""
    closed = not w.is_open(0.05)
    w.close()
    return reply, closed


SAME_AS_REDIS = [
    ("unknown command", b"foo a b\r\n"),
    ("unknown command, multibulk", command("foo", "a", "b")),
    ("unknown command, no args", command("nosuchcommand")),
    ("unknown command, empty arg", command("foo", "")),
    ("unknown command, long name", command("x" * 300, "a")),
    ("unknown command, one long arg", command("foo", "a" * 300)),
    ("unknown command, CRLF in an arg", command("foo", b"a\r\nb")),
    ("unknown command, empty name", command("")),
    ("unknown command, many short args", command("foo", *["x"] * 50)),
    ("unknown command, two long args", command("foo", "a" * 100, "b" * 100)),
    ("unknown command, bytes that are not UTF-8", command(b"\xff\xfeabc", b"\xe9t\xe9")),
    ("echo without args", b"ECHO\r\n"),
    ("echo with two args", command("ECHO", "a", "b")),
    ("ping with two args", command("PING", "a", "b")),
    ("ping with a message", command("PING", "msg")),
    ("unknown subcommand", command("CONFIG", "nosuch")),
    ("unknown client subcommand", command("CLIENT", "nosuch", "x")),
    ("config get arity", command("CONFIG", "GET")),
    ("auth without password set", command("AUTH", "x")),
    ("select out of range", command("SELECT", "16")),
    ("exec without multi", command("EXEC")),
    ("discard without multi", command("DISCARD")),
]


@pytest.mark.parametrize("data", [c[1] for c in SAME_AS_REDIS], ids=[c[0] for c in SAME_AS_REDIS])
def test_error_texts_match_redis(server, r, redis_server, data):
    assert reply_and_close(server, data) == reply_and_close(redis_server, data)


def test_nested_multi_matches_redis(server, r, redis_server):
    got = []
    for srv in (server, redis_server):
        w = Wire.to(srv.port)
        w.send(b"MULTI\r\nMULTI\r\nPING\r\nEXEC\r\n")
        got.append([w.read_reply() for _ in range(4)])
        w.close()
    assert got[0] == got[1]


PROTOCOL_SAME_AS_REDIS = [
    b"*abc\r\n", b"*\r\n", b"*+1\r\n", b"*01\r\n", b"* 1\r\n", b"*99999999999999999999\r\n",
    b"*2147483648\r\n", b"*-9223372036854775809\r\n",
    b"*1\r\n$abc\r\n", b"*1\r\n$-1\r\n", b"*1\r\n$+1\r\n", b"*1\r\n$01\r\na\r\n",
    b"*1\r\n$\r\n", b"*3\r\n$2000000000\r\n", b"*1\r\n$536870913\r\n",
    b"*1\r\nx\r\n", b"*1\r\n:1\r\n", b"*1\r\n\r\n",
    b'PING "abc\r\n', b"PING 'abc\r\n", b'PING "a"b\r\n',
    b"x" * 65537, b"*" + b"1" * 65536, b"*1\r\n$" + b"1" * 65536,
    b"*1\r\n$4\r\nPING\r\n*0\r\n*-1\r\n\r\n\r\nPING\r\n",
    b"*-9223372036854775808\r\nPING\r\n",
    b"PING\rPING\r\n",
]


@pytest.mark.parametrize("data", PROTOCOL_SAME_AS_REDIS, ids=lambda d: repr(d[:30]))
def test_protocol_errors_match_redis(server, r, redis_server, data):
    got = []
    for srv in (server, redis_server):
        w = Wire.to(srv.port)
        w.send(data)
        w.fill(time.monotonic() + TIMEOUT)
        drain(w, 0.1)
        got.append((w.buf, w.eof))
        w.close()
    assert got[0] == got[1]


INLINE_SAME_AS_REDIS = [
    b'ECHO "a b"', b"ECHO 'a b'", b'ECHO "\\x41\\x4a"', b'ECHO "a\\x4"', b'ECHO "\\xZZ"',
    b'ECHO "\\n\\r\\t\\b\\a"', b'ECHO "\\q"', b"ECHO 'it\\'s'", b"ECHO 'a\\nb'",
    b'ECHO ""', b"ECHO ''", b"ECHO   spaced  ", b"ECHO \t tabbed",
    b'ECHO a"b c"', b"ECHO a'b c'", b"ECHO a\x0bb", b"ECHO 'a\\\\'",
]


@pytest.mark.parametrize("line", INLINE_SAME_AS_REDIS, ids=repr)
def test_inline_splitting_matches_redis(server, r, redis_server, line):
    data = line + b"\r\n"
    assert reply_and_close(server, data) == reply_and_close(redis_server, data)
