"""redis-cli 7.0, unmodified: one-shot commands (raw and formatted output,
RESP2 and RESP3), stdin and --pipe modes, and an interactive session in a
pseudo-terminal, where redis-cli asks COMMAND DOCS at start and uses the
answer for its hints and HELP."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time

import pytest

TIMEOUT = 10
ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")



def cli_env() -> dict:
    # No history or rc file from the machine running the tests.
    return dict(os.environ, REDISCLI_HISTFILE="/dev/null", REDISCLI_RCFILE="/dev/null",
                TERM="xterm")


def cli(server, *args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(["redis-cli", "-p", str(server.port), *args], input=stdin,
                          capture_output=True, timeout=TIMEOUT, env=cli_env())
    return proc


def out(server, *args) -> bytes:
    proc = cli(server, *args)
    assert proc.returncode == 0, proc
    assert proc.stderr == b"", proc.stderr
    return proc.stdout


# ---- one-shot ------------------------------------------------------------------------------

def test_ping(server, r):
    assert out(server, "ping") == b"PONG\n"
    assert out(server, "--no-raw", "PING", "hi there") == b'"hi there"\n'


def test_cl_check_raw_output(server, r):
    # stdout is not a terminal: redis-cli prints raw replies, one per line
    assert out(server, "CL.CHECK", "k", "5", "2") == b"1\n5\n4\n0\n500\n"
    assert out(server, "--raw", "CL.CHECK", "k", "5", "2") == b"1\n5\n3\n0\n1000\n"
    assert out(server, "--raw", "CL.CHECK", "k", "5", "2", "COST", "3") == b"1\n5\n0\n0\n2500\n"
    assert out(server, "CL.CHECK", "k", "5", "2") == b"0\n5\n0\n500\n2500\n"


def test_cl_check_formatted_output(server, r):
    assert out(server, "--no-raw", "CL.CHECK", "k", "5", "2") == (
        b"1) (integer) 1\n2) (integer) 5\n3) (integer) 4\n4) (integer) 0\n5) (integer) 500\n")
    assert out(server, "--no-raw", "CL.CHECK", "k", "5", "2", "COST", "9") == (
        b"1) (integer) 0\n2) (integer) 5\n3) (integer) 4\n4) (integer) -1\n5) (integer) 500\n")
    assert out(server, "--no-raw", "CL.CHECK", "k", "0", "2") == (
        b"(error) ERR capacity must be an integer from 1 to 10^15\n")
    assert out(server, "--no-raw", "NOPE", "x") == (
        b"(error) ERR unknown command 'NOPE', with args beginning with: 'x' \n")


def test_resp3_mode(server, r):
    assert out(server, "-3", "CL.CHECK", "k3", "5", "2") == b"1\n5\n4\n0\n500\n"
    assert out(server, "-3", "--no-raw", "CL.CHECK", "k3", "5", "2") == (
        b"1) (integer) 1\n2) (integer) 5\n3) (integer) 3\n4) (integer) 0\n5) (integer) 1000\n")
    assert out(server, "-3", "--no-raw", "CLIENT", "GETNAME") == b"(nil)\n"
    assert out(server, "-3", "--no-raw", "CONFIG", "GET", "save") == b'1# "save" => ""\n'
    hello = out(server, "-3", "--no-raw", "HELLO", "3")
    assert b'3# "proto" => (integer) 3\n' in hello
    assert b'5# "mode" => "standalone"\n' in hello
    assert b'7# "modules" => (empty array)\n' in hello
    assert out(server, "-2", "--no-raw", "CLIENT", "GETNAME") == b"(nil)\n"


def test_info(server, r):
    text = out(server, "info")
    assert text.startswith(b"# Server\r\nredis_version:7.0.0\r\n")
    assert b"\r\ntcp_port:%d\r\n" % server.port in text
    for header in (b"# Clients\r\n", b"# Memory\r\n", b"# Stats\r\n", b"# Keyspace\r\n"):
        assert header in text
    out(server, "CL.CHECK", "a", "5", "2")
    assert out(server, "info", "keyspace") == b"# Keyspace\r\ndb0:keys=1,expires=1,avg_ttl=0\r\n"


def test_other_commands(server, r):
    assert out(server, "DEBUG", "CLOCK", "SET", "1234567") == b"1234567\n"
    assert out(server, "--no-raw", "TIME") == b'1) "1234"\n2) "567000"\n'
    out(server, "CL.CHECK", "x", "5", "2")
    assert out(server, "--no-raw", "DBSIZE") == b"(integer) 1\n"
    assert out(server, "FLUSHALL") == b"OK\n"
    assert out(server, "--no-raw", "DBSIZE") == b"(integer) 0\n"
    assert out(server, "--no-raw", "CONFIG", "GET", "appendonly") == b'1) "appendonly"\n2) "no"\n'
    assert out(server, "--no-raw", "SELECT", "1") == b"(error) ERR DB index is out of range\n"


def test_help_uses_command_docs(server, r):
    text = ANSI.sub(b"", out(server, "help", "CL.CHECK"))
    assert b"CL.CHECK key capacity refill_per_sec [COST cost] [PERIOD period]" in text
    assert b"summary: Spends COST tokens" in text
    assert b"group: ratelimit" in text


def test_commands_from_stdin(server, r):
    proc = cli(server, stdin=b"CL.CHECK s 2 1\nCL.CHECK s 2 1\nCL.CHECK s 2 1\nPING\n")
    assert proc.returncode == 0 and proc.stderr == b""
    assert proc.stdout == b"1\n2\n1\n0\n1000\n1\n2\n0\n0\n2000\n0\n2\n0\n1000\n2000\nPONG\n"


def test_pipe_mode(server, r):
    # --pipe streams raw RESP and ends with an ECHO of a random marker.
    frames = b"".join(b"*4\r\n$8\r\nCL.CHECK\r\n$%d\r\n%s\r\n$1\r\n5\r\n$1\r\n2\r\n"
                      % (len(k), k) for k in (b"p%d" % (i % 40) for i in range(1000)))
    proc = cli(server, "--pipe", stdin=frames)
    assert proc.returncode == 0, proc
    report = proc.stdout + proc.stderr
    assert b"errors: 0, replies: 1000" in report, report
    assert r.dbsize() == 40
    assert r.execute_command("CL.CHECK", "p0", 5, 2, "COST", 0) == [1, 5, 0, 0, 2500]


# ---- interactive, in a pseudo-terminal ---------------------------------------------------------

class Terminal:
    """redis-cli with a pty for stdin/stdout/stderr, as a person runs it."""

    def __init__(self, *args: str):
        self.master, slave = os.openpty()
        # A window size, so linenoise never has to ask the terminal for one.
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
        self.proc = subprocess.Popen(["redis-cli", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=cli_env(), close_fds=True,
                                     start_new_session=True)
        os.close(slave)
        self.buf = b""
        self.transcript = b""

    def expect(self, marker: bytes, timeout: float = TIMEOUT) -> bytes:
        """Everything up to and including marker; fails on timeout or EOF."""
        deadline = time.monotonic() + timeout
        while marker not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {marker!r}; got {self.buf!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:   # EIO: the other side is gone
                    data = b""
                assert data, f"redis-cli ended while waiting for {marker!r}; got {self.buf!r}"
                self.buf += data
                self.transcript += data
        end = self.buf.index(marker) + len(marker)
        seen, self.buf = self.buf[:end], self.buf[end:]
        return seen

    def type(self, text: bytes):
        os.write(self.master, text)

    def wait(self, timeout: float = TIMEOUT) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.transcript += os.read(self.master, 65536)
                except OSError:
                    pass
        return self.proc.wait(max(0.1, deadline - time.monotonic()))

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


@pytest.fixture
def terminal():
    opened = []

    def start(*args: str) -> Terminal:
        t = Terminal(*args)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


def test_interactive_session(server, r, terminal):
    r.config_resetstat()
    prompt = b"127.0.0.1:%d> " % server.port
    t = terminal("-p", str(server.port))
    t.expect(prompt)
    t.type(b"PING\r")
    t.expect(b"\r\nPONG\r\n" + prompt)
    # The hint for CL.CHECK comes from the server's COMMAND DOCS reply.
    t.type(b"CL.CHECK ")
    shown = ANSI.sub(b"", t.expect(b"[PERIOD period]"))
    assert b"CL.CHECK key capacity refill_per_sec [COST cost] [PERIOD period]" in shown
    t.type(b"k 5 2\r")
    t.expect(b"\r\n1) (integer) 1\r\n2) (integer) 5\r\n3) (integer) 4\r\n"
             b"4) (integer) 0\r\n5) (integer) 500\r\n" + prompt)
    t.type(b"CL.CHECK k x 2\r")
    t.expect(b"\r\n(error) ERR capacity is not an integer or out of range\r\n" + prompt)
    t.type(b"help CL.CHECK\r")
    assert b"group: ratelimit" in ANSI.sub(b"", t.expect(b"ratelimit\r"))
    t.expect(prompt)
    t.type(b"quit\r")
    assert t.wait() == 0, t.transcript
    assert b"Traceback" not in t.transcript
    assert server.alive(), server.log()
    docs = r.info("commandstats")["cmdstat_command|docs"]
    assert docs["calls"] >= 1 and docs["failed_calls"] == 0
    assert r.execute_command("CL.CHECK", "k", 5, 2) == [1, 5, 3, 0, 1000]
    assert "Traceback" not in server.log()


def test_interactive_resp3(server, r, terminal):
    prompt = b"127.0.0.1:%d> " % server.port
    t = terminal("-p", str(server.port), "-3")
    t.expect(prompt)
    t.type(b"CLIENT GETNAME\r")
    t.expect(b"\r\n(nil)\r\n" + prompt)
    t.type(b"CL.CHECK k3 5 2\r")
    t.expect(b"\r\n1) (integer) 1\r\n2) (integer) 5\r\n3) (integer) 4\r\n"
             b"4) (integer) 0\r\n5) (integer) 500\r\n" + prompt)
    t.type(b"CONFIG GET save\r")
    t.expect(b'\r\n1# "save" => ""\r\n' + prompt)
    t.type(b"quit\r")
    assert t.wait() == 0, t.transcript
    assert server.alive(), server.log()
    assert "Traceback" not in server.log()
