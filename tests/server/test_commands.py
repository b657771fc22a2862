"""Every command's exact reply, over raw sockets (and redis-py where it is
the natural client).  Replies that Redis 7.0 also gives (unknown command,
wrong arity, transactions, ...) are compared byte for byte with a real
redis-server."""

from __future__ import annotations

import asyncio
import time

import hiredis
import pytest
import redis
import redis.asyncio as aredis
from redis._parsers import CommandsParser
from redis._parsers.commands import AsyncCommandsParser

from wire import Wire, command


# ---- a raw RESP2/RESP3 client --------------------------------------------------------

class Simple(str):
    """+simple string"""


class Err(str):
    """-error"""


class RSet(list):
    """~set (RESP3); a plain array in RESP2"""


class Verbatim(bytes):
    """=verbatim string (RESP3)"""


class Raw(Wire):
    """A raw connection that can also decode a reply into Python values."""

    def value(self, *args):
        return decode(self.call(*args))


def decode(data: bytes):
    value, pos = _decode(data, 0)
    assert pos == len(data), f"trailing bytes after a reply: {data[pos:]!r}"
    return value


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _decode(data: bytes, pos: int):
    eol = data.index(b"\r\n", pos)
    kind, head, nxt = data[pos:pos + 1], data[pos + 1:eol], eol + 2
    if kind == b"+":
        return Simple(head.decode()), nxt
    if kind == b"-":
        return Err(head.decode()), nxt
    if kind == b":":
        return int(head), nxt
    if kind == b"_":
        assert head == b""
        return None, nxt
    if kind == b"#":
        assert head in (b"t", b"f")
        return head == b"t", nxt
    if kind in b"$=":
        n = int(head)
        if n < 0:
            assert kind == b"$" and n == -1
            return None, nxt
        body = data[nxt:nxt + n]
        assert data[nxt + n:nxt + n + 2] == b"\r\n", "bulk not followed by CRLF"
        return (Verbatim(body) if kind == b"=" else body), nxt + n + 2
    if kind in b"*~":
        n = int(head)
        if n < 0:
            assert kind == b"*" and n == -1
            return None, nxt
        items = []
        for _ in range(n):
            item, nxt = _decode(data, nxt)
            items.append(item)
        return (RSet(items) if kind == b"~" else items), nxt
    if kind == b"%":
        out = {}
        for _ in range(int(head)):
            k, nxt = _decode(data, nxt)
            v, nxt = _decode(data, nxt)
            out[_hashable(k)] = v
        return out, nxt
    raise AssertionError(f"unexpected RESP type {kind!r} in {data!r}")


def pairs(flat: list) -> dict:
    """A RESP2 flattened map as a dict."""
    assert len(flat) % 2 == 0, flat
    return dict(zip(flat[0::2], flat[1::2]))


def as_map(value, proto: int) -> dict:
    if proto == 3:
        assert isinstance(value, dict), value
        return value
    assert isinstance(value, list), value
    return pairs(value)


def well_formed(data: bytes):
    """hiredis, the parser redis-cli and redis-py use, reads exactly one reply."""
    reader = hiredis.Reader()
    reader.feed(data)
    value = reader.gets()
    assert value is not False, "incomplete reply"
    assert reader.gets() is False, "more than one reply"
    return value


# ---- fixtures ------------------------------------------------------------------------

@pytest.fixture
def raw(server, r):
    """A raw connection to the flushed manual-clock server (clock 0)."""
    with Raw.to(server.port) as conn:
        yield conn


def run_sequence(port: int, commands) -> list[bytes]:
    """Each command's raw reply on one fresh connection; b'<closed>' once
    the server hangs up."""
    out = []
    with Raw.to(port) as conn:
        for cmd in commands:
            try:
                conn.send(cmd if isinstance(cmd, bytes) else command(*cmd))
                out.append(conn.read_reply())
            except (EOFError, ConnectionResetError, BrokenPipeError):
                out.append(b"<closed>")
                break
    return out


# ---- exact replies -------------------------------------------------------------------

EXACT = {
    "ping": ([("PING",)], [b"+PONG\r\n"]),
    "ping-message": ([("PING", "hello world")], [b"$11\r\nhello world\r\n"]),
    "ping-inline": ([b"PING\r\n", b"ping  \"a b\"\r\n"], [b"+PONG\r\n", b"$3\r\na b\r\n"]),
    "echo": ([("ECHO", "x y"), ("ECHO", ""), ("echo", b"\x00\r\n")],
             [b"$3\r\nx y\r\n", b"$0\r\n\r\n", b"$3\r\n\x00\r\n\r\n"]),
    "select-0": ([("SELECT", "0")], [b"+OK\r\n"]),
    "select-1": ([("SELECT", "1")], [b"-ERR DB index is out of range\r\n"]),
    "select-nan": ([("SELECT", "x")], [b"-ERR value is not an integer or out of range\r\n"]),
    "hello-4": ([("HELLO", "4")], [b"-NOPROTO unsupported protocol version\r\n"]),
    "client-names": ([("CLIENT", "GETNAME"), ("CLIENT", "SETNAME", "n1"), ("CLIENT", "GETNAME"),
                      ("CLIENT", "SETNAME", ""), ("CLIENT", "GETNAME"),
                      ("CLIENT", "SETNAME", "a b")],
                     [b"$-1\r\n", b"+OK\r\n", b"$2\r\nn1\r\n", b"+OK\r\n", b"$-1\r\n",
                      b"-ERR Client names cannot contain spaces, newlines or special "
                      b"characters.\r\n"]),
    "client-setinfo": ([("CLIENT", "SETINFO", "LIB-NAME", "x"),
                        ("CLIENT", "SETINFO", "lib-ver", "1.2"),
                        ("CLIENT", "SETINFO", "FOO", "x")],
                       [b"+OK\r\n", b"+OK\r\n", b"-ERR Unrecognized option 'FOO'\r\n"]),
    "command-getkeys": ([("COMMAND", "GETKEYS", "CL.CHECK", "k", "5", "2"),
                         ("COMMAND", "GETKEYS", "cl.check", "mykey", "5", "2", "COST", "3",
                          "PERIOD", "60000"),
                         ("COMMAND", "GETKEYS", "CL.RESET", "x"),
                         ("COMMAND", "GETKEYS", "CL.CHECK", "k"),
                         ("COMMAND", "GETKEYS", "NOPE", "k"),
                         ("COMMAND", "GETKEYS", "PING", "x")],
                        [b"*1\r\n$1\r\nk\r\n", b"*1\r\n$5\r\nmykey\r\n", b"*1\r\n$1\r\nx\r\n",
                         b"-ERR Invalid number of arguments specified for command\r\n",
                         b"-ERR Invalid command specified\r\n",
                         b"-ERR The command has no key arguments\r\n"]),
    "config-get": ([("CONFIG", "GET", "save"), ("CONFIG", "GET", "appendonly"),
                    ("config", "get", "nosuch")],
                   [b"*2\r\n$4\r\nsave\r\n$0\r\n\r\n",
                    b"*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n", b"*0\r\n"]),
    "config-set-unknown": ([("CONFIG", "SET", "nosuch", "1")],
                           [b"-ERR Unknown option or number of arguments for CONFIG SET - "
                            b"'nosuch'\r\n"]),
    "dbsize": ([("DBSIZE",), ("CL.CHECK", "a", "5", "2"), ("CL.CHECK", "b", "5", "2"),
                ("CL.CHECK", "b", "5", "2"), ("CL.CHECK", "c", "5", "2", "COST", "0"),
                ("DBSIZE",)],
               [b":0\r\n", b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n",
                b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n",
                b"*5\r\n:1\r\n:5\r\n:3\r\n:0\r\n:1000\r\n",
                b"*5\r\n:1\r\n:5\r\n:5\r\n:0\r\n:0\r\n", b":2\r\n"]),
    "flushall": ([("CL.CHECK", "a", "5", "2"), ("FLUSHALL",), ("DBSIZE",),
                  ("CL.CHECK", "a", "5", "2"), ("FLUSHALL", "SYNC"), ("FLUSHALL", "x")],
                 [b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n", b"+OK\r\n", b":0\r\n",
                  b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n", b"+OK\r\n",
                  b"-ERR syntax error\r\n"]),
    "time": ([("TIME",), ("DEBUG", "CLOCK", "SET", "1234567"), ("TIME",),
              ("DEBUG", "CLOCK", "SET", "5"), ("TIME",)],
             [b"*2\r\n$1\r\n0\r\n$1\r\n0\r\n", b":1234567\r\n",
              b"*2\r\n$4\r\n1234\r\n$6\r\n567000\r\n", b":5\r\n",
              b"*2\r\n$1\r\n0\r\n$4\r\n5000\r\n"]),
    "debug-clock": ([("DEBUG", "CLOCK", "GET"), ("DEBUG", "CLOCK", "ADVANCE", "433"),
                     ("DEBUG", "CLOCK", "GET"), ("DEBUG", "CLOCK", "SET", "10000"),
                     ("DEBUG", "CLOCK", "ADVANCE", "1"), ("DEBUG", "CLOCK", "SET", "-1"),
                     ("DEBUG", "CLOCK", "SET", "soon"), ("DEBUG", "CLOCK", "GET")],
                    [b":0\r\n", b":433\r\n", b":433\r\n", b":10000\r\n", b":10001\r\n",
                     b"-ERR clock value out of range\r\n",
                     b"-ERR milliseconds is not an integer or out of range\r\n",
                     b":10001\r\n"]),
    "clock-drives-refill": ([("CL.CHECK", "w", "1", "2"), ("CL.CHECK", "w", "1", "2"),
                             ("DEBUG", "CLOCK", "ADVANCE", "499"), ("CL.CHECK", "w", "1", "2"),
                             ("DEBUG", "CLOCK", "ADVANCE", "1"), ("CL.CHECK", "w", "1", "2")],
                            [b"*5\r\n:1\r\n:1\r\n:0\r\n:0\r\n:500\r\n",
                             b"*5\r\n:0\r\n:1\r\n:0\r\n:500\r\n:500\r\n", b":499\r\n",
                             b"*5\r\n:0\r\n:1\r\n:0\r\n:1\r\n:1\r\n", b":500\r\n",
                             b"*5\r\n:1\r\n:1\r\n:0\r\n:0\r\n:500\r\n"]),
    "multi-exec": ([("MULTI",), ("CL.CHECK", "t", "2", "1"), ("CL.CHECK", "t", "2", "1"),
                    ("CL.CHECK", "t", "2", "1"), ("PING",), ("ECHO", "e"), ("DBSIZE",), ("EXEC",)],
                   [b"+OK\r\n"] + [b"+QUEUED\r\n"] * 6 +
                   [b"*6\r\n*5\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n"
                    b"*5\r\n:1\r\n:2\r\n:0\r\n:0\r\n:2000\r\n"
                    b"*5\r\n:0\r\n:2\r\n:0\r\n:1000\r\n:2000\r\n"
                    b"+PONG\r\n$1\r\ne\r\n:1\r\n"]),
    "multi-runtime-error": ([("MULTI",), ("CL.CHECK", "t", "0", "1"), ("CL.CHECK", "t", "2", "1"),
                             ("EXEC",)],
                            [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n",
                             b"*2\r\n-ERR capacity must be an integer from 1 to 10^15\r\n"
                             b"*5\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n"]),
    "discard": ([("MULTI",), ("CL.CHECK", "d", "2", "1"), ("DISCARD",), ("DBSIZE",), ("EXEC",)],
                [b"+OK\r\n", b"+QUEUED\r\n", b"+OK\r\n", b":0\r\n",
                 b"-ERR EXEC without MULTI\r\n"]),
    "exec-without-multi": ([("EXEC",), ("DISCARD",)],
                           [b"-ERR EXEC without MULTI\r\n", b"-ERR DISCARD without MULTI\r\n"]),
    "multi-nested": ([("MULTI",), ("MULTI",), ("PING",), ("EXEC",)],
                     [b"+OK\r\n", b"-ERR MULTI calls can not be nested\r\n", b"+QUEUED\r\n",
                      b"*1\r\n+PONG\r\n"]),
    "execabort-arity": ([("MULTI",), ("CL.CHECK", "x", "5", "2"), ("CL.CHECK", "x"), ("PING",),
                         ("EXEC",), ("DBSIZE",)],
                        [b"+OK\r\n", b"+QUEUED\r\n",
                         b"-ERR wrong number of arguments for 'cl.check' command\r\n",
                         b"+QUEUED\r\n",
                         b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                         b":0\r\n"]),
    "execabort-unknown": ([("MULTI",), ("NOPE",), ("EXEC",)],
                          [b"+OK\r\n",
                           b"-ERR unknown command 'NOPE', with args beginning with: \r\n",
                           b"-EXECABORT Transaction discarded because of previous errors.\r\n"]),
    "quit": ([("QUIT",), ("PING",)], [b"+OK\r\n", b"<closed>"]),
    "quit-pipelined": ([b"*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n"], [b"+OK\r\n"]),
    "reset": ([("HELLO", "3", "SETNAME", "before"), ("MULTI",), ("RESET",), ("CLIENT", "GETNAME"),
               ("EXEC",), ("CL.CHECK", "after", "3", "1")],
              [None, b"+OK\r\n", b"+RESET\r\n", b"$-1\r\n", b"-ERR EXEC without MULTI\r\n",
               b"*5\r\n:1\r\n:3\r\n:2\r\n:0\r\n:1000\r\n"]),
    "resp3-replies": ([("HELLO", "3"), ("CLIENT", "GETNAME"), ("CL.CHECK", "r3", "5", "2"),
                       ("CONFIG", "GET", "save"), ("TIME",), ("PING",)],
                      [None, b"_\r\n", b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n",
                       b"%1\r\n$4\r\nsave\r\n$0\r\n\r\n", b"*2\r\n$1\r\n0\r\n$1\r\n0\r\n",
                       b"+PONG\r\n"]),
}


@pytest.mark.parametrize("name", list(EXACT))
def test_exact_replies(server, r, name):
    commands, expected = EXACT[name]
    got = run_sequence(server.port, commands)
    # None in the table: a reply checked elsewhere (HELLO's map)
    got = [None if want is None else g for g, want in zip(got, expected)] + got[len(expected):]
    assert got == expected


# ---- the same bytes as Redis 7.0 -----------------------------------------------------

LIKE_REDIS_UNKNOWN = [
    [("FOO", "a", "b")],
    [("FOO",)],
    [("foo", "x" * 200)],
    [("FOO",) + ("abc",) * 40],                 # Redis stops after 128 chars of the quoted list
    [("FOO", "a\r\nb")],
    [("F\r\nOO", "a")],
    [b"FOO a b\r\n"],
    [("CL.NOPE", "k")],
]

LIKE_REDIS_ARITY = [
    [("ECHO",)], [("ECHO", "a", "b")], [("PING", "a", "b")], [("SELECT",)], [("SELECT", "0", "1")],
    [("DBSIZE", "x")], [("TIME", "x")], [("MULTI", "x")], [("DISCARD", "x")], [("RESET", "x")],
    [("AUTH",)], [("CLIENT",)], [("CLIENT", "GETNAME", "x")], [("CLIENT", "SETNAME", "a", "b")],
    [("CLIENT", "ID", "x")], [("CLIENT", "INFO", "x")], [("CONFIG",)], [("CONFIG", "GET")],
    [("CONFIG", "SET", "maxclients")], [("COMMAND", "COUNT", "x")], [("DEBUG",)], [b"ECHO\r\n"],
]

LIKE_REDIS_OTHER = [
    [("PING",), ("PING", "x"), ("ECHO", "x"), ("SELECT", "0"), ("SELECT", "x"), ("SELECT", "-1")],
    [("HELLO", "4"), ("HELLO", "x"), ("HELLO", "2", "FOO"), ("HELLO", "2", "AUTH", "a"),
     ("HELLO", "3", "SETNAME", "a b")],
    [("CLIENT", "FOO"), ("CLIENT", "SETNAME", "a b"), ("CLIENT", "GETNAME"),
     ("CLIENT", "SETNAME", "ok"), ("CLIENT", "GETNAME"), ("CLIENT", "KILL", "ID", "999999"),
     ("CLIENT", "KILL", "1.2.3.4:5"), ("CLIENT", "LIST", "TYPE", "foo"),
     ("CLIENT", "LIST", "TYPE", "pubsub"), ("CLIENT", "NO-EVICT", "on"),
     ("CLIENT", "KILL", "TYPE", "FOO"), ("CLIENT", "KILL", "TYPE", "master"),
     ("CLIENT", "LIST", "TYPE", "Bar")],
    [("COMMAND", "FOO"), ("COMMAND", "INFO", "nope"), ("COMMAND", "DOCS", "nope"),
     ("COMMAND", "GETKEYS", "NOPE", "x")],
    [("CONFIG", "GET", "save"), ("CONFIG", "GET", "appendonly"), ("CONFIG", "SET", "foo", "bar"),
     ("CONFIG", "FOO")],
    [("AUTH", "x"), ("AUTH", "a", "b", "c"), ("FLUSHALL", "x"), ("SHUTDOWN", "FOO")],
    [("EXEC",), ("DISCARD",), ("MULTI",), ("MULTI",), ("PING",), ("ECHO", "x"), ("EXEC",)],
    [("MULTI",), ("ECHO",), ("PING",), ("EXEC",)],
    [("MULTI",), ("NOPE", "1"), ("EXEC",), ("PING",)],
    [("MULTI",), ("PING",), ("DISCARD",), ("EXEC",)],
    [("MULTI",), ("PING",), ("RESET",), ("EXEC",), ("PING",)],
    [("MULTI",), ("PING",), ("QUIT",), ("PING",)],
    [("HELLO", "3"), ("RESET",), ("CLIENT", "GETNAME"), ("HELLO", "3"), ("CLIENT", "GETNAME"),
     ("HELLO", "2"), ("QUIT",)],
    [b"\r\n\r\nPING\r\n", b"  ping  \"a\\x41b\"  \r\n"],
]


def _without_hello(commands, replies):
    """HELLO's map names the server and its version: compared elsewhere."""
    return [b"<hello>" if isinstance(c, tuple) and c[0] == "HELLO" and rep[:1] in b"*%"
            else rep for c, rep in zip(commands, replies)]


@pytest.mark.parametrize("commands", LIKE_REDIS_UNKNOWN, ids=lambda c: repr(c[0])[:40])
def test_unknown_command_errors_like_redis(server, redis_server, commands):
    assert run_sequence(server.port, commands) == run_sequence(redis_server.port, commands)


@pytest.mark.parametrize("commands", LIKE_REDIS_ARITY, ids=lambda c: repr(c[0])[:40])
def test_wrong_arity_errors_like_redis(server, redis_server, commands):
    assert run_sequence(server.port, commands) == run_sequence(redis_server.port, commands)


@pytest.mark.parametrize("commands", LIKE_REDIS_OTHER, ids=lambda c: repr(c[0])[:40])
def test_replies_like_redis(server, r, redis_server, commands):
    mine = _without_hello(commands, run_sequence(server.port, commands))
    theirs = _without_hello(commands, run_sequence(redis_server.port, commands))
    assert mine == theirs


def test_client_id_error_texts_like_redis(server, redis_server):
    commands = [("CLIENT", "KILL", "ID", "x"), ("CLIENT", "KILL", "ID", "0"),
                ("CLIENT", "LIST", "ID", "x")]
    assert run_sequence(server.port, commands) == run_sequence(redis_server.port, commands)


def test_commands_not_allowed_in_multi_like_redis(make_server, redis_server):
    # SHUTDOWN is flagged no-multi: Redis refuses to queue it and aborts the
    # transaction.  ABORT keeps the real redis-server up whatever happens.
    s = make_server("--manual-clock")
    commands = [("MULTI",), ("SHUTDOWN", "ABORT"), ("EXEC",), ("PING",)]
    expected = [b"+OK\r\n", b"-ERR Command not allowed inside a transaction\r\n",
                b"-EXECABORT Transaction discarded because of previous errors.\r\n",
                b"+PONG\r\n"]
    assert run_sequence(redis_server.port, commands) == expected
    assert run_sequence(s.port, commands) == expected
    assert s.alive()


# ---- HELLO ---------------------------------------------------------------------------

HELLO_KEYS = {b"server", b"version", b"proto", b"id", b"mode", b"role", b"modules"}


@pytest.mark.parametrize("proto", [2, 3])
def test_hello(raw, proto):
    my_id = raw.value("CLIENT", "ID")
    data = raw.call("HELLO", proto)
    assert data[:1] == (b"%" if proto == 3 else b"*")
    hello = as_map(decode(data), proto)
    assert HELLO_KEYS <= set(hello)
    assert hello[b"proto"] == proto
    assert hello[b"id"] == my_id
    assert hello[b"mode"] == b"standalone"
    assert hello[b"role"] == b"master"
    assert hello[b"modules"] == []
    assert hello[b"version"] == b"7.0.0"
    assert well_formed(data)
    # the connection now speaks that protocol
    assert raw.call("CLIENT", "GETNAME") == (b"_\r\n" if proto == 3 else b"$-1\r\n")
    info = decode(raw.call("CLIENT", "INFO"))
    assert f" resp={proto} ".encode() in info


def test_hello_without_version_keeps_the_protocol(raw):
    assert as_map(raw.value("HELLO"), 2)[b"proto"] == 2
    raw.call("HELLO", "3")
    assert raw.value("HELLO")[b"proto"] == 3


def test_hello_setname_and_auth(raw):
    hello = raw.value("HELLO", "3", "AUTH", "default", "anything", "SETNAME", "hello-name")
    assert hello[b"proto"] == 3
    assert raw.call("CLIENT", "GETNAME") == b"$10\r\nhello-name\r\n"


def test_hello_with_password(make_server):
    s = make_server("--requirepass", "sekret")
    with Raw.to(s.port) as conn:
        assert conn.call("CL.CHECK", "k", "5", "2") == b"-NOAUTH Authentication required.\r\n"
        assert conn.call("HELLO", "3", "AUTH", "default", "nope") == (
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
        assert conn.call("HELLO", "3", "AUTH", "default", "sekret")[:1] == b"%"
        assert conn.call("CL.CHECK", "k", "5", "2") == b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n"
    with Raw.to(s.port) as conn:
        assert conn.call("AUTH", "nope") == (
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
        assert conn.call("AUTH", "sekret") == b"+OK\r\n"
        assert conn.call("PING") == b"+PONG\r\n"
        assert conn.call("RESET") == b"+RESET\r\n"     # RESET logs the connection out
        assert conn.call("PING") == b"-NOAUTH Authentication required.\r\n"


# ---- CLIENT --------------------------------------------------------------------------

def _fields(line: bytes) -> dict:
    return dict(part.split("=", 1) for part in line.decode().split())


def test_client_id_list_info(server, r):
    with Raw.to(server.port) as a, Raw.to(server.port) as b:
        id_a, id_b = a.value("CLIENT", "ID"), b.value("CLIENT", "ID")
        assert isinstance(id_a, int) and id_b > id_a
        assert a.call("CLIENT", "SETNAME", "alpha") == b"+OK\r\n"
        assert a.call("CLIENT", "SETINFO", "LIB-NAME", "mylib") == b"+OK\r\n"
        assert a.call("CLIENT", "SETINFO", "LIB-VER", "9.9") == b"+OK\r\n"
        listing = a.value("CLIENT", "LIST")
        assert isinstance(listing, bytes) and listing.endswith(b"\n")
        rows = {int(f["id"]): f for f in map(_fields, listing.splitlines())}
        assert {id_a, id_b} <= set(rows)
        me = rows[id_a]
        assert (me["name"], me["lib-name"], me["lib-ver"], me["resp"], me["db"]) == (
            "alpha", "mylib", "9.9", "2", "0")
        assert me["addr"] == "%s:%d" % a.sock.getsockname()
        assert me["laddr"] == "127.0.0.1:%d" % server.port
        only_b = a.value("CLIENT", "LIST", "ID", id_b)
        assert [int(_fields(x)["id"]) for x in only_b.splitlines()] == [id_b]
        assert a.value("CLIENT", "LIST", "TYPE", "normal").count(b"\n") == listing.count(b"\n")
        info = a.value("CLIENT", "INFO")
        assert info.endswith(b"\n") and info.count(b"\n") == 1
        assert _fields(info)["id"] == str(id_a)
        assert _fields(info)["name"] == "alpha"
        b.call("HELLO", "3")
        verbatim = b.call("CLIENT", "INFO")
        assert verbatim.startswith(b"=") and b"\r\ntxt:id=%d " % id_b in verbatim
        assert isinstance(decode(verbatim), Verbatim)


def test_client_info_names_the_subcommand_like_redis(server, redis_server):
    # Redis 7 reports cmd=client|info (the full subcommand name).
    def cmd_field(port):
        with Raw.to(port) as conn:
            return _fields(decode(conn.call("CLIENT", "INFO")))["cmd"]
    assert cmd_field(redis_server.port) == "client|info"
    assert cmd_field(server.port) == "client|info"


def test_client_kill_id(server, r):
    with Raw.to(server.port) as killer, Raw.to(server.port) as victim:
        victim_id = victim.value("CLIENT", "ID")
        killer_id = killer.value("CLIENT", "ID")
        assert killer.call("CLIENT", "KILL", "ID", victim_id) == b":1\r\n"
        assert victim.read_until_closed(5) == b""
        assert killer.call("CLIENT", "KILL", "ID", victim_id) == b":0\r\n"
        # SKIPME yes (the default) spares the caller
        assert killer.call("CLIENT", "KILL", "ID", killer_id) == b":0\r\n"
        assert killer.call("PING") == b"+PONG\r\n"
        ids = [int(_fields(x)["id"]) for x in killer.value("CLIENT", "LIST").splitlines()]
        assert victim_id not in ids and killer_id in ids
    assert server.alive()


# ---- COMMAND -------------------------------------------------------------------------

# Key-spec flags as Redis 7 spells them (src/server.c, addReplyFlagsForKeyArgs).
REDIS_KEY_SPEC_FLAGS = {"RO", "RW", "OW", "RM", "access", "update", "insert", "delete",
                        "not_key", "incomplete", "variable_flags"}
REQUIRED_COMMANDS = {"cl.check", "cl.reset", "ping", "echo", "auth", "hello", "select", "client",
                     "command", "info", "config", "dbsize", "flushall", "time", "quit", "reset",
                     "shutdown", "multi", "exec", "discard", "debug"}


def _check_entry(entry, proto: int):
    assert isinstance(entry, list) and len(entry) == 10, entry
    name, arity, flags, first, last, step, acl, tips, specs, subs = entry
    assert isinstance(name, bytes) and isinstance(arity, int)
    assert all(isinstance(f, Simple) for f in flags)
    assert all(isinstance(x, int) for x in (first, last, step))
    assert all(isinstance(c, Simple) and c.startswith("@") for c in acl)
    if proto == 3:
        assert isinstance(flags, RSet) and isinstance(acl, RSet)
    assert isinstance(tips, list) and isinstance(specs, list) and isinstance(subs, list)
    for sub in subs:
        _check_entry(sub, proto)
        assert sub[0].startswith(name + b"|")


@pytest.mark.parametrize("proto", [2, 3])
def test_command_info_cl_check(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND", "INFO", "cl.check")
    well_formed(data)
    (entry,) = decode(data)
    _check_entry(entry, proto)
    name, arity, flags, first, last, step, acl, tips, specs, subs = entry
    assert (name, arity, first, last, step) == (b"cl.check", -4, 1, 1, 1)
    assert {"write", "denyoom", "fast"} <= set(flags)
    assert "@write" in acl
    assert tips == [] and subs == []
    (spec,) = specs
    spec = as_map(spec, proto)
    assert as_map(spec[b"begin_search"], proto)[b"type"] == b"index"
    assert as_map(as_map(spec[b"begin_search"], proto)[b"spec"], proto) == {b"index": 1}
    find_keys = as_map(spec[b"find_keys"], proto)
    assert find_keys[b"type"] == b"range"
    assert as_map(find_keys[b"spec"], proto) == {b"lastkey": 0, b"keystep": 1, b"limit": 0}
    key_flags = set(spec[b"flags"])
    assert "RW" in key_flags
    assert key_flags <= REDIS_KEY_SPEC_FLAGS, key_flags - REDIS_KEY_SPEC_FLAGS


@pytest.mark.parametrize("proto", [2, 3])
def test_command_and_count(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND")
    well_formed(data)
    entries = decode(data)
    for entry in entries:
        _check_entry(entry, proto)
    names = {e[0].decode() for e in entries}
    assert REQUIRED_COMMANDS <= names
    assert raw.value("COMMAND", "COUNT") == len(entries)
    assert sorted(raw.value("COMMAND", "LIST")) == sorted(e[0] for e in entries)
    (client,) = raw.value("COMMAND", "INFO", "client")
    assert {b"client|id", b"client|setname", b"client|getname", b"client|list",
            b"client|info", b"client|kill", b"client|setinfo"} <= {s[0] for s in client[9]}
    info = raw.value("COMMAND", "INFO", "ping", "nope", "CL.CHECK")
    assert info[0][0] == b"ping" and info[1] is None and info[2][0] == b"cl.check"


@pytest.mark.parametrize("proto", [2, 3])
def test_command_docs_cl_check(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND", "DOCS", "cl.check")
    hiredis_view = well_formed(data)
    docs = as_map(decode(data), proto)
    assert list(docs) == [b"cl.check"]
    doc = as_map(docs[b"cl.check"], proto)
    for field in (b"summary", b"since", b"group", b"complexity"):
        assert isinstance(doc[field], bytes) and doc[field], field
    args = [as_map(a, proto) for a in doc[b"arguments"]]
    assert [a[b"name"] for a in args] == [b"key", b"capacity", b"refill_per_sec", b"cost",
                                          b"period"]
    assert args[0][b"type"] == b"key" and args[0][b"key_spec_index"] == 0
    assert [a.get(b"token") for a in args[3:]] == [b"COST", b"PERIOD"]
    assert all("optional" in a[b"flags"] for a in args[3:])
    assert hiredis_view   # hiredis reads it too
    # the whole table, as redis-cli asks for it at start
    everything = raw.call("COMMAND", "DOCS")
    well_formed(everything)
    assert set(as_map(decode(everything), proto)) >= {n.encode() for n in REQUIRED_COMMANDS}


@pytest.mark.parametrize("proto", [2, 3])
def test_cluster_client_finds_the_key(server, proto):
    # RedisCluster routes a command by CommandsParser over the COMMAND reply.
    client = server.client(protocol=proto)
    try:
        parser = CommandsParser(client)
        assert parser.get_keys(client, "CL.CHECK", "mykey", 5, 2) == ["mykey"]
        assert parser.get_keys(client, "CL.CHECK", "{user:1}:k", 5, 2, "COST", 3) == ["{user:1}:k"]
        assert parser.get_keys(client, "CL.RESET", "gone") == ["gone"]
        assert parser.get_keys(client, "PING") is None
        policies = parser.get_command_policies()
        assert policies["cl"]["check"].request_policy.value == "default_keyed"
    finally:
        client.close()
    assert redis.cluster.key_slot(b"{user:1}:k") == redis.cluster.key_slot(b"user:1")


def test_async_cluster_client_finds_the_key(server):
    async def main():
        client = aredis.Redis(host="127.0.0.1", port=server.port)
        try:
            parser = AsyncCommandsParser()
            await parser.initialize(client)
            return await parser.get_keys("CL.CHECK", "mykey", 5, 2)
        finally:
            await client.aclose()
    assert list(asyncio.run(main())) == ["mykey"]


# ---- INFO ----------------------------------------------------------------------------

SECTIONS = ["server", "clients", "memory", "persistence", "stats", "replication", "cpu",
            "keyspace", "commandstats", "errorstats"]
DEFAULT_FIELDS = ["redis_version", "redis_mode", "process_id", "run_id", "tcp_port",
                  "uptime_in_seconds", "connected_clients", "maxclients", "used_memory",
                  "used_memory_human", "used_memory_rss", "used_memory_peak", "maxmemory",
                  "loading", "aof_enabled", "total_connections_received",
                  "total_commands_processed", "instantaneous_ops_per_sec",
                  "total_net_input_bytes", "total_net_output_bytes", "rejected_connections",
                  "expired_keys", "role", "connected_slaves", "used_cpu_sys"]


def _info_fields(text: bytes) -> dict:
    out = {}
    for line in text.decode().split("\r\n"):
        if line and not line.startswith("#"):
            key, _, value = line.partition(":")
            out[key] = value
    return out


@pytest.mark.parametrize("section", SECTIONS)
def test_info_section(raw, server, section):
    text = raw.value("INFO", section)
    assert isinstance(text, bytes)
    lines = text.split(b"\r\n")
    assert lines[0].lower() == b"# " + section.encode()
    assert text.endswith(b"\r\n")
    assert all(b":" in line for line in lines[1:-1]), lines
    assert text.count(b"# ") == 1   # only the section asked for


def test_info_section_headers_like_redis(server, redis_server):
    def headers(port):
        with Raw.to(port) as conn:
            return [decode(conn.call("INFO", s)).split(b"\r\n")[0] for s in SECTIONS]
    assert headers(server.port) == headers(redis_server.port)


def test_info_default(raw, server):
    text = raw.value("INFO")
    fields = _info_fields(text)
    for name in DEFAULT_FIELDS:
        assert name in fields, name
    assert fields["tcp_port"] == str(server.port)
    assert fields["process_id"] == str(server.proc.pid)
    assert fields["role"] == "master"
    assert int(fields["connected_clients"]) >= 2
    headers = [line for line in text.decode().split("\r\n") if line.startswith("# ")]
    for section in ("server", "clients", "memory", "stats", "keyspace"):
        assert f"# {section}" in [h.lower() for h in headers]
    assert _info_fields(raw.value("INFO", "all")).keys() >= fields.keys() - {"db0"}


def test_info_keyspace(raw):
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\n"
    for key in ("k1", "k2", "k3"):
        raw.call("CL.CHECK", key, "5", "2")
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\ndb0:keys=3,expires=3,avg_ttl=0\r\n"
    assert _info_fields(raw.value("INFO"))["db0"] == "keys=3,expires=3,avg_ttl=0"
    raw.call("CL.RESET", "k2")
    assert raw.value("DBSIZE") == 2
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\ndb0:keys=2,expires=2,avg_ttl=0\r\n"


def test_info_stats_count(raw):
    assert raw.call("CONFIG", "RESETSTAT") == b"+OK\r\n"
    for _ in range(3):
        raw.call("CL.CHECK", "s", "5", "2")
    raw.call("NOPE")
    stats = _info_fields(raw.value("INFO", "commandstats"))
    assert stats["cmdstat_cl.check"].startswith("calls=3,")
    assert int(_info_fields(raw.value("INFO", "stats"))["total_error_replies"]) == 1


# ---- CONFIG --------------------------------------------------------------------------

def test_config_get_and_set(make_server):
    s = make_server("--manual-clock")
    maxclients = b"*2\r\n$10\r\nmaxclients\r\n"
    with Raw.to(s.port) as conn:
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$5\r\n10000\r\n"
        assert conn.call("CONFIG", "SET", "maxclients", "50") == b"+OK\r\n"
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$2\r\n50\r\n"
        assert _info_fields(conn.value("INFO", "clients"))["maxclients"] == "50"
        bad = conn.call("CONFIG", "SET", "maxclients", "lots")
        assert bad.startswith(b"-ERR CONFIG SET failed") and b"maxclients" in bad
        assert conn.call("CONFIG", "SET", "nosuch", "1") == (
            b"-ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'\r\n")
        # all or nothing: a bad pair leaves the good one unapplied
        assert conn.call("CONFIG", "SET", "maxclients", "60", "nosuch", "1")[:1] == b"-"
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$2\r\n50\r\n"
        assert conn.call("CONFIG", "SET", "save", "") == b"+OK\r\n"        # what it already is
        assert conn.call("CONFIG", "SET", "appendonly", "yes")[:1] == b"-"  # not possible
        got = pairs(conn.value("CONFIG", "GET", "max*"))
        assert got[b"maxclients"] == b"50" and got[b"maxmemory"] == b"0"
        conn.call("HELLO", "3")
        assert conn.value("CONFIG", "GET", "save", "appendonly") == {b"save": b"",
                                                                     b"appendonly": b"no"}


# ---- manual clock, SHUTDOWN ----------------------------------------------------------

def test_debug_clock_refused_without_manual_clock(make_server):
    s = make_server()
    with Raw.to(s.port) as conn:
        refused = b"-ERR DEBUG CLOCK SET/ADVANCE need the server started with --manual-clock\r\n"
        assert conn.call("DEBUG", "CLOCK", "SET", "5") == refused
        assert conn.call("DEBUG", "CLOCK", "ADVANCE", "5") == refused
        now = conn.value("DEBUG", "CLOCK", "GET")
        assert abs(now - time.time() * 1000) < 60_000    # the wall clock, in ms
        secs, usecs = conn.value("TIME")
        assert abs(int(secs) - time.time()) < 60 and 0 <= int(usecs) < 1_000_000


def test_shutdown(make_server):
    s = make_server("--manual-clock")
    with Raw.to(s.port) as other, Raw.to(s.port) as conn:
        assert other.call("PING") == b"+PONG\r\n"
        conn.send(command("SHUTDOWN"))
        assert conn.read_until_closed() == b""   # as Redis: no reply, the connection closes
        assert other.read_until_closed() == b""
    assert s.proc.wait(10) == 0
    assert "Traceback" not in s.log()


def test_shutdown_bad_option_keeps_running(make_server):
    s = make_server()
    with Raw.to(s.port) as conn:
        assert conn.call("SHUTDOWN", "FOO") == b"-ERR syntax error\r\n"
        assert conn.call("SHUTDOWN", "ABORT") == b"-ERR No shutdown in progress.\r\n"
        assert conn.call("PING") == b"+PONG\r\n"
    assert s.alive()


def test_quit_closes_only_that_connection(raw, server):
    with Raw.to(server.port) as conn:
        assert conn.call("QUIT") == b"+OK\r\n"
        assert conn.read_until_closed(5) == b""
    assert raw.call("PING") == b"+PONG\r\n"
