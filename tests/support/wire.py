"""RESP by hand, for tests that check the exact bytes on the wire.

``command(*args)`` encodes one command as a RESP multibulk frame.
``Wire`` is a raw client connection that splits what the server sends
into whole RESP2/RESP3 replies, returned as the raw bytes (decoding them
is up to the test).  Every read has a deadline.

tests/support/ is on sys.path (pyproject.toml's pytest ``pythonpath``), so
every test can ``from wire import command, Wire``.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
import struct
import threading
import time

TIMEOUT = 10.0       # default deadline, in seconds, for a read and for connecting

# Reply types by their first byte.
_BLOB = b"$=!"       # <length>\r\n<bytes>\r\n; a length of -1 is the RESP2 null
_ARRAY = b"*~>"      # <count>\r\n then count replies
_PAIRS = b"%|"       # <count>\r\n then 2 * count replies
_LINE = b"+-:_#,("   # the first line is the whole reply


def _ports_of_this_worker() -> list[int]:
    """The ports this process hands out, in turn from a random one.

    Below the kernel's ephemeral range: a bind to port 0 (every test
    server's RESP port, every outgoing connection) never takes a port a
    test picked before the test's server binds it.  Each pytest-xdist
    worker has a slice of its own: two tests running at once never pick
    the same port."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    size = (ephemeral_low - LOWEST_PICKED_PORT) // workers
    first = LOWEST_PICKED_PORT + worker * size
    start = random.randrange(size)
    return [*range(first + start, first + size), *range(first, first + start)]


LOWEST_PICKED_PORT = 10_000
_slice = _ports_of_this_worker()
_picked = itertools.cycle(_slice)
_picking = threading.Lock()


def free_ports(n: int) -> list[int]:
    """n loopback ports nothing is bound to, none handed out before in this
    run (until the worker's slice wraps around)."""
    ports: list[int] = []
    with _picking:
        for port in itertools.islice(_picked, len(_slice)):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            ports.append(port)
            if len(ports) == n:
                break
    if len(ports) < n:
        raise RuntimeError(f"fewer than {n} free ports in {_slice[0]}..{_slice[-1]}")
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def command(*args) -> bytes:
    """One command as a RESP multibulk frame; args that are not bytes are
    sent as their str()."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Wire:
    """A raw connection with a read buffer and RESP framing for replies.

    A read that cannot complete raises EOFError if the server closed (or
    reset) the connection first and TimeoutError if its deadline passed
    first; whatever did arrive stays in ``buf``.  ``eof`` and ``reset``
    say how the server ended the connection.
    """

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.eof = False
        self.reset = False

    @classmethod
    def to(cls, port: int) -> Wire:
        """A new connection to a server on 127.0.0.1."""
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(s)

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def fill(self, deadline: float) -> bool:
        """Reads once into buf; False on EOF, reset or deadline."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return False
        except ConnectionResetError:
            self.eof = self.reset = True
            return False
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True

    def _more(self, deadline: float, wanted: str) -> None:
        if not self.fill(deadline):
            shown = self.buf if len(self.buf) <= 400 else self.buf[:200] + b"..." + self.buf[-200:]
            got = (f"got {len(self.buf)} bytes {shown!r} (eof={self.eof}, "
                   f"reset={self.reset})")
            if self.eof:
                raise EOFError(f"connection closed before {wanted}; {got}")
            raise TimeoutError(f"deadline passed before {wanted}; {got}")

    @staticmethod
    def _deadline(deadline: float | None) -> float:
        return deadline or time.monotonic() + TIMEOUT

    def read_exact(self, n: int, deadline: float | None = None) -> bytes:
        deadline = self._deadline(deadline)
        while len(self.buf) < n:
            self._more(deadline, f"{n} bytes")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_line(self, deadline: float | None = None) -> bytes:
        """One line, CRLF included."""
        deadline = self._deadline(deadline)
        while (eol := self.buf.find(b"\r\n")) < 0:
            self._more(deadline, "a whole line")
        out, self.buf = self.buf[:eol + 2], self.buf[eol + 2:]
        return out

    def _reply_end(self, pos: int, deadline: float) -> int:
        """Where the reply starting at buf[pos] ends, reading until it has."""
        while (eol := self.buf.find(b"\r\n", pos)) < 0:
            self._more(deadline, "a whole reply")
        kind, head, end = self.buf[pos:pos + 1], self.buf[pos + 1:eol], eol + 2
        if kind in _BLOB:
            n = int(head)
            if n >= 0:
                end += n + 2
                while len(self.buf) < end:
                    self._more(deadline, "a whole reply")
                assert self.buf[end - 2:end] == b"\r\n", f"no CRLF after a blob: {self.buf!r}"
        elif kind in _ARRAY or kind in _PAIRS:
            n = int(head) * (2 if kind in _PAIRS else 1)
            for _ in range(max(n, 0)):
                end = self._reply_end(end, deadline)
        elif kind not in _LINE:
            raise AssertionError(f"not a RESP reply: {self.buf[pos:]!r}")
        return end

    def read_reply(self, deadline: float | None = None) -> bytes:
        """The raw bytes of one complete RESP2/RESP3 reply."""
        end = self._reply_end(0, self._deadline(deadline))
        out, self.buf = self.buf[:end], self.buf[end:]
        return out

    def call(self, *args) -> bytes:
        """Sends one command and returns its raw reply."""
        return self.call_raw(command(*args))

    def call_raw(self, data: bytes) -> bytes:
        """Sends data as it is (inline, malformed, several frames) and
        returns the first reply."""
        self.send(data)
        return self.read_reply()

    def read_until_closed(self, timeout: float = TIMEOUT) -> bytes:
        """Everything the server sends until it closes; fails if it does
        not close within the timeout."""
        deadline = time.monotonic() + timeout
        while self.fill(deadline):
            pass
        assert self.eof, f"connection still open after {timeout} s; got {self.buf!r}"
        out, self.buf = self.buf, b""
        return out

    def is_open(self, wait: float = 0.2) -> bool:
        """True when nothing arrives and no close is seen within wait."""
        self.fill(time.monotonic() + wait)
        return not self.eof

    def close(self) -> None:
        self.sock.close()

    def rst(self) -> None:
        """Closes with a TCP RST instead of a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()




def wait_until(predicate, timeout: float = TIMEOUT, what: str = "the condition",
               interval: float = 0.02):
    """Polls predicate until it returns something true, which it returns;
    AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class RecordingTransport:
    """An asyncio transport stand-in for a protocol object fed by hand in
    the test's process: keeps what is written and whether reading is on."""

    def __init__(self):
        self.out = b""
        self.reading = True
        self.closed = False

    def get_extra_info(self, name, default=None):
        # the addresses only, as a real transport (no ssl_object here)
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

    def write(self, data):
        self.out += data

    def writelines(self, parts):
        for part in parts:
            self.out += part

    def get_write_buffer_size(self):
        return 0

    def is_closing(self):
        return self.closed

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def close(self):
        self.closed = True

    abort = close


class Pinger(threading.Thread):
    """A well-behaved RESP client: a PING every 2 ms, its latencies kept."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port, self.latencies, self.stopped = port, [], False

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as conn:
            while not self.stopped:
                sent = time.perf_counter()
                conn.sendall(b"PING\r\n")
                assert conn.recv(100) == b"+PONG\r\n"
                self.latencies.append(time.perf_counter() - sent)
                time.sleep(0.002)

    def stop(self) -> float:
        """The longest wait."""
        self.stopped = True
        self.join(10)
        return max(self.latencies)


def longest_ping_while(port: int, begin, done, what: str, timeout: float = 60.0) -> float:
    """The longest a well-behaved client's PING waits from begin() until
    done() holds: what the server's other clients notice of that work."""
    pinger = Pinger(port)
    pinger.start()
    time.sleep(0.2)
    begin()
    wait_until(done, timeout, what)
    return pinger.stop()
