"""Every command of the one table (server/commands/table.py), by its
exact reply over raw sockets; the replies that Redis 7.0 also gives
(unknown command, wrong arity, commands refused in MULTI, ...) are
compared byte for byte with a real redis-server."""

from __future__ import annotations

import pytest
from resp_values import run_sequence

from fastlimit.server.commands.table import build_table

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


def test_every_block_and_oneof_argument_documents_its_arguments():
    """redis-cli reads COMMAND DOCS at its start and crashes on a block or
    oneof argument without arguments (it did, on HOTKEYS START)."""
    def walk(arguments, where):
        for arg in arguments:
            options = arg[2] if len(arg) > 2 else {}
            if arg[1] in ("block", "oneof"):
                assert options.get("arguments"), f"{where} {arg[0]}"
            walk(options.get("arguments", ()), f"{where} {arg[0]}")

    def commands(table):
        for cmd in table.values():
            yield cmd
            yield from cmd.subcommands.values()
    for cmd in commands(build_table()):
        walk(cmd.doc.get("arguments", ()), cmd.name)
