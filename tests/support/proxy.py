"""A TCP proxy on 127.0.0.1 for fault tests: it forwards every connection
to a target port and can delay, cut, stall or drop the forwarded traffic
on demand.

``Proxy(port, delay=0.04)`` adds a one-way latency: every byte, in each
direction, is written that many seconds after the proxy read it (a round
trip through the proxy takes ``2 * delay`` more), as ``tc netem delay
40ms`` on one link does.  The delay does not accumulate: a chunk read at
time t is written at t + delay, whatever came before it, and the order of
the bytes is kept in each direction (a chunk never overtakes an earlier
one, even after the delay was lowered).  ``set_delay(seconds)`` changes
it at run time, for the bytes read from then on; the end of a connection
(a FIN) travels the delay line after its bytes.  At most ``MAX_IN_FLIGHT``
bytes wait in one direction: beyond that the proxy stops reading that
side until the line drains (TCP pushes back on the sender).  With no delay
(the default, and ``set_delay(0)`` on a connection that never had one)
the bytes are copied straight through, as before the delay existed.

``cut()`` closes every forwarded connection (both ends see a FIN) and
closes each new one as soon as it is accepted, until ``restore()``.
``stall()`` stops moving bytes without closing anything, as a network
partition does: both ends see only silence (new connections are accepted
and connected upstream, but nothing passes) until ``restore()``, and then
get every byte held meanwhile.  ``drop()`` is a partition where the
packets are lost: the proxy keeps reading but discards what it reads, and
what is still in a delay line, until ``restore()``; the connections stay
up, so both ends see silence, and the bytes sent meanwhile never arrive.
``stall()``, ``drop()`` and ``restore()`` switch between these modes.

One thread accepts; one thread per connection and direction reads and
copies bytes; once a direction has a delay, another thread writes out its
delay line as the chunks fall due.  Every blocking call is bounded or
woken by ``close()``, so nothing outlives it.

tests/support/ is on sys.path: ``from proxy import Proxy``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque

ACCEPT_POLL = 0.05     # seconds between checks of close() while accepting
CONNECT_TIMEOUT = 5.0
CHUNK = 65536          # bytes read at a time
MAX_IN_FLIGHT = 64 << 20   # bytes a delay line holds before its reader stops reading


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", delay: float = 0.0):
        self.target = (target_host, target_port)
        self._delay = _seconds(delay)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(ACCEPT_POLL)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._lines: set[_Line] = set()
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._flowing = threading.Event()     # clear while stalled
        self._flowing.set()
        self._dropping = False
        self._closed = False
        self.accepted = 0                     # connections accepted, for tests to wait on
        with self._lock:
            self._start(self._accept_loop)

    # ---- control ---------------------------------------------------------------------

    @property
    def delay(self) -> float:
        return self._delay

    def set_delay(self, seconds: float) -> None:
        """The one-way delay for the bytes read from now on (those already
        read keep theirs, and nothing overtakes them)."""
        self._delay = _seconds(seconds)

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            socks = list(self._socks)
        for s in socks:
            _shut(s)

    def stall(self) -> None:
        self._flowing.clear()
        self._dropping = False

    def drop(self) -> None:
        self._dropping = True     # before waking the copiers held by a stall
        self._flowing.set()

    def restore(self) -> None:
        with self._lock:
            self._cut = False
        self._dropping = False
        self._flowing.set()

    def queued(self) -> int:
        """The most bytes waiting in any one delay line now (for tests)."""
        with self._lock:
            return max((line.size for line in self._lines), default=0)

    def close(self) -> None:
        with self._lock:
            self._closed = self._cut = True       # _start refuses from now on
            socks = list(self._socks)
            lines = list(self._lines)
            threads = list(self._threads)
        self._flowing.set()       # wakes the copiers waiting out a stall
        for s in socks:
            _shut(s)
        for line in lines:
            line.close()          # wakes their writers and the readers waiting for room
        for t in threads:
            t.join(5)
        self._listener.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- threads -----------------------------------------------------------------------

    def _start(self, target, *args) -> None:
        """Starts a thread; the caller holds _lock and has checked that the
        proxy is not closed (close() joins the threads started before it)."""
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            client.settimeout(None)
            with self._lock:
                refuse = self._cut
            if refuse:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, upstream)
            with self._lock:
                if not self._cut:       # else cut (or closed) while connecting
                    self._socks.update(conn.socks)
                    self._start(self._copy, conn, client, upstream)
                    self._start(self._copy, conn, upstream, client)
                    continue
            for s in conn.socks:
                _shut(s)
                s.close()

    def _copy(self, conn: _Conn, src: socket.socket, dst: socket.socket) -> None:
        """Reads src and moves the bytes to dst: straight (no delay) or
        through a delay line, created with its writer the first time a
        delay applies.  A stall holds them (before reading, or between
        reading and writing), a drop discards them.  src's end (a FIN)
        closes both sockets, after the delay if there is one (it comes out
        of the line after the bytes before it, and a stall holds it too);
        an error, a cut or close() ends the connection at once."""
        line = None
        eof = False
        try:
            while True:
                self._flowing.wait()
                data = src.recv(CHUNK)
                if not data:
                    eof = True
                    break
                delay = self._delay
                if line is None and delay <= 0:     # straight through
                    self._flowing.wait()
                    if self._closed:
                        break
                    if not self._dropping:
                        dst.sendall(data)
                    continue
                due = time.monotonic() + delay
                if self._dropping:
                    continue
                if line is None:
                    line = self._line(conn, dst)
                    if line is None:
                        break
                if not line.put(due, data):         # waits for room
                    break
        except OSError:
            pass
        finally:
            delay = self._delay
            if line is None and eof and delay > 0 and not self._cut:  # the FIN alone is delayed too
                line = self._line(conn, dst)
            if line is None:
                self._end(conn)
            else:
                line.put(time.monotonic() + delay, b"")

    def _line(self, conn: _Conn, dst: socket.socket) -> _Line | None:
        """A new delay line to dst with its writer, or None when the
        connection or the proxy is over."""
        with self._lock:
            if self._closed or conn.ended:
                return None
            line = _Line()
            conn.lines.append(line)
            self._lines.add(line)
            self._start(self._write, conn, line, dst)
        return line

    def _write(self, conn: _Conn, line: _Line, dst: socket.socket) -> None:
        """Writes line's chunks to dst as they fall due, until the end
        comes out of it (then closes the connection) or it is closed."""
        try:
            while (data := line.take()) is not None:
                self._flowing.wait()
                if self._closed or not data:
                    break
                if not self._dropping:
                    dst.sendall(data)
                line.sent(len(data))
        except OSError:
            pass
        finally:
            self._end(conn)

    def _end(self, conn: _Conn) -> None:
        """Closes both sockets of a connection and its delay lines, once."""
        with self._lock:
            if conn.ended:
                return
            conn.ended = True
            self._socks.difference_update(conn.socks)
            self._lines.difference_update(conn.lines)
            lines = list(conn.lines)
        for s in conn.socks:
            _shut(s)
        for line in lines:
            line.close()
        for s in conn.socks:
            s.close()


class _Conn:
    """One forwarded connection: its two sockets and its delay lines."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.socks = (client, upstream)
        self.lines: list[_Line] = []
        self.ended = False


class _Line:
    """The chunks read from one side and not yet written to the other,
    each with the time it falls due, in the order they were read; b""
    is the end of the connection.  size counts the bytes queued and the
    chunk being written."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._chunks: deque[tuple[float, bytes]] = deque()
        self.size = 0
        self._closed = False

    def put(self, due: float, data: bytes) -> bool:
        """Queues data (b"": the end), first waiting while the line holds
        MAX_IN_FLIGHT bytes or more; False once the line is closed."""
        with self._cond:
            while data and self.size >= MAX_IN_FLIGHT and not self._closed:
                self._cond.wait()
            if self._closed:
                return False
            self._chunks.append((due, data))
            self.size += len(data)
            self._cond.notify_all()
            return True

    def take(self) -> bytes | None:
        """The first chunk once it falls due (the writer then calls
        sent()), b"" for the end; None once the line is closed."""
        with self._cond:
            while not self._closed:
                if not self._chunks:
                    self._cond.wait()
                    continue
                due, data = self._chunks[0]
                left = due - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._chunks.popleft()
                return data
            return None

    def sent(self, n: int) -> None:
        with self._cond:
            if not self._closed:      # close() emptied it
                self.size -= n
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._chunks.clear()
            self.size = 0
            self._cond.notify_all()


def _seconds(delay: float) -> float:
    delay = float(delay)
    if not delay >= 0:
        raise ValueError(f"delay must be a number of seconds >= 0, not {delay!r}")
    return delay


def _shut(s: socket.socket) -> None:
    """Shuts a socket down both ways: the peer sees a FIN, and a thread
    blocked reading it wakes up."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
