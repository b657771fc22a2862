"""A TCP proxy on 127.0.0.1 for fault tests: it forwards every connection
to a target port and can cut or stall the forwarded traffic on demand.

``cut()`` closes every forwarded connection (both ends see a FIN) and
closes each new one as soon as it is accepted, until ``restore()``.
``stall()`` stops moving bytes without closing anything, as a network
partition does: both ends see only silence (new connections are accepted
and connected upstream, but nothing passes) until ``restore()``.

One thread accepts, two threads per connection copy bytes; every
blocking call is bounded or woken by ``close()``, so nothing outlives it.

tests/support/ is on sys.path: ``from proxy import Proxy``.
"""

from __future__ import annotations

import socket
import threading

ACCEPT_POLL = 0.05     # seconds between checks of close() while accepting
CONNECT_TIMEOUT = 5.0


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(ACCEPT_POLL)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._flowing = threading.Event()     # clear while stalled
        self._flowing.set()
        self._closed = False
        self.accepted = 0                     # connections accepted, for tests to wait on
        self._spawn(self._accept_loop)

    # ---- control ---------------------------------------------------------------------

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            socks = list(self._socks)
        for s in socks:
            _shut(s)

    def stall(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False
        self._flowing.set()

    def close(self) -> None:
        with self._lock:
            self._closed = self._cut = True
            socks = list(self._socks)
        self._flowing.set()       # wakes the copiers waiting out a stall
        for s in socks:
            _shut(s)
        for t in self._threads:
            t.join(5)
        self._listener.close()

    def __enter__(self) -> "Proxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- threads -----------------------------------------------------------------------

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
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
            with self._lock:
                if self._cut:       # cut while connecting
                    _shut(client)
                    _shut(upstream)
                    continue
                self._socks.update((client, upstream))
            self._spawn(self._copy, client, upstream)
            self._spawn(self._copy, upstream, client)

    def _copy(self, src: socket.socket, dst: socket.socket) -> None:
        """Moves bytes src -> dst; a stall holds them (before reading, or
        between reading and writing), a cut or either end closing ends it
        and closes both."""
        try:
            while True:
                self._flowing.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                if self._closed:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)
            _shut(src)
            _shut(dst)
            src.close()
            dst.close()


def _shut(s: socket.socket) -> None:
    """Shuts a socket down both ways: the peer sees a FIN, and a thread
    blocked reading it wakes up."""
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
