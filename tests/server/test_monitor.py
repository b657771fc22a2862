"""MONITOR: Redis's line format, byte for byte against a real
redis-server (but the time and the client's address), its redaction of
AUTH and HELLO credentials, MULTI/EXEC's order, admin commands hidden,
redis-cli monitor, and a monitor that does not read is dropped by the
output-buffer limits as any client (issue 16)."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest

from wire import Wire, command, wait_until

LINE = re.compile(rb"^\+(\d{10})\.(\d{6}) \[0 127\.0\.0\.1:(\d+)\] (.*)\r\n$")


@pytest.fixture(params=["fastlimit", "redis"])
def port(request, server, redis_server):
    return server.port if request.param == "fastlimit" else redis_server.port


def monitor(port: int) -> Wire:
    m = Wire.to(port)
    assert m.call("MONITOR") == b"+OK\r\n"
    return m


def lines(m: Wire, n: int, sender: Wire) -> list[bytes]:
    """The next n lines of the sender's commands (other clients' skipped),
    without the time and address, which differ between the servers."""
    here = sender.sock.getsockname()[1]
    out = []
    while len(out) < n:
        match = LINE.match(m.read_reply())
        assert match, "not a MONITOR line"
        if int(match.group(3)) == here:
            out.append(match.group(4))
    return out


def test_arguments_are_quoted_as_redis_quotes_them(port):
    with monitor(port) as m, Wire.to(port) as c:
        c.call("PING", b'a "b" \\ \r\n\t\x07\x08\x00\xff~')
        c.call("ECHO", "")
        c.call("nosuchcommand", "x")      # refused before it runs: not shown
        c.call("ECHO", 12)
        assert lines(m, 3, c) == [
            b'"PING" "a \\"b\\" \\\\ \\r\\n\\t\\a\\b\\x00\\xff~"', b'"ECHO" ""', b'"ECHO" "12"']


def test_credentials_are_redacted(port):
    with monitor(port) as m, Wire.to(port) as c:
        c.call("AUTH", "secret")
        c.call("AUTH", "user", "secret")
        c.call("HELLO", "2", "AUTH", "user", "secret", "SETNAME", "n")
        c.call("HELLO", "2", "SETNAME", "n", "AUTH", "user", "secret")
        assert lines(m, 4, c) == [
            b'"AUTH" "(redacted)"', b'"AUTH" "(redacted)" "(redacted)"',
            b'"HELLO" "2" "AUTH" "(redacted)" "(redacted)" "SETNAME" "n"',
            b'"HELLO" "2" "SETNAME" "n" "AUTH" "(redacted)" "(redacted)"']


def test_multi_exec_order_and_admin_commands_hidden(port):
    with monitor(port) as m, Wire.to(port) as c:
        c.send(command("MULTI") + command("PING", "in") + command("EXEC"))
        for _ in range(3):
            c.read_reply()
        c.call("CONFIG", "SET", "requirepass", "")   # admin: never shown
        c.call("MULTI")
        c.call("nosuch")
        c.call("EXEC")
        c.call("PING", "last")
        assert lines(m, 6, c) == [b'"MULTI"', b'"PING" "in"', b'"EXEC"', b'"MULTI"',
                                  b'"EXEC"', b'"PING" "last"']


def test_fast_path_commands_are_shown(server):
    with monitor(server.port) as m, Wire.to(server.port) as c:
        c.call("CL.CHECK", "mk", 10, 1, "COST", 2)
        assert lines(m, 1, c) == [b'"CL.CHECK" "mk" "10" "1" "COST" "2"']


def test_redis_cli_monitor(server):
    with Wire.to(server.port) as c:
        def monitors() -> int:
            return c.call("CLIENT", "LIST").count(b"flags=O")
        # an earlier test's monitor, closed by its client, may still count
        wait_until(lambda: monitors() == 0, what="no monitor left from an earlier test")
        cli = subprocess.Popen(["redis-cli", "-p", str(server.port), "monitor"],
                               stdout=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: monitors() == 1, what="redis-cli in MONITOR mode")
            c.call("ECHO", "seen by redis-cli")
            assert cli.stdout.readline() == "OK\n"
            for _ in range(100):
                line = cli.stdout.readline()
                if '"ECHO" "seen by redis-cli"' in line:
                    break
            else:
                raise AssertionError("redis-cli never printed the ECHO")
            assert re.match(r'^\d+\.\d{6} \[0 127\.0\.0\.1:\d+\] "ECHO"', line), line
        finally:
            cli.kill()
            cli.wait()


def test_a_monitor_that_does_not_read_is_dropped(make_server):
    srv = make_server("--client-output-buffer-limit", "normal", "256kb", "0", "0")
    m = monitor(srv.port)
    m.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    with Wire.to(srv.port) as c:
        burst = command("ECHO", "x" * 1000) * 200
        for _ in range(40):           # 8 MB of lines at most, never read
            c.send(burst)
            for _ in range(200):
                c.read_reply()
            if "flags=O" not in c.call("CLIENT", "LIST").decode():
                break
        assert "flags=O" not in c.call("CLIENT", "LIST").decode()
        assert c.call("PING") == b"+PONG\r\n"
    m.close()
    assert srv.alive(), srv.log()
