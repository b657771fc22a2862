"""The RESP front's listeners: on port at every bind address and, with
tls-port, on it behind TLS (_tls.TlsConnection), each connection handed to
fastlimit._protocol.Connection, counted in maxclients from the accept on.

Not a subsystem, as the HTTP and gRPC fronts are: the server binds these
before its subsystems start and serves them only once they are up (a
cluster node that has not heard from Sentinel yet would answer
CLUSTERDOWN), and closes them before its subsystems stop.  CONFIG SET bind
and port move them: rebind() binds the new sockets, then the server
commits or abandons the change."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

from fastlimit._protocol import Connection
from fastlimit.server import config as cfg
from fastlimit.server.subsystem import start_accepting

ListenerKey = tuple[str, int, bool]     # host, port, TLS
RESP_FRONT = "resp"     # these listeners' name in a takeover (takeover/)


class RespFront:
    def __init__(self, server, log: logging.Logger):
        self.server = server            # fastlimit.server.app.Server
        self.log = log
        self._servers: list[asyncio.Server] = []
        # The RESP listeners by (host, port, tls), which CONFIG SET bind and
        # port change (the HTTP and gRPC fronts stay where they started).
        self._listeners: dict[ListenerKey, list[asyncio.Server]] = {}

    # ---- the start and the stop -------------------------------------------------

    async def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Binds port (a free one when it is 0, the server's port then) and
        tls-port on every bind address, not accepting yet."""
        app, settings = self.server, self.server.settings
        for host in settings.bind:
            servers = await self._listen(loop, host, app.port or 0)
            if not app.port:
                app.port = servers[0].sockets[0].getsockname()[1]
            self._listeners[(host, app.port, False)] = [*servers]
        if settings.tls_port:   # the same protocol, behind TLS (admission.py)
            for host in settings.bind:
                servers = await self._listen(loop, host, settings.tls_port, app.tls.server)
                self._listeners[(host, settings.tls_port, True)] = [*servers]
            self.log.info("TLS on %s port %d", " ".join(settings.bind), settings.tls_port)

    async def start_serving(self) -> None:
        for listener in self._servers:
            await start_accepting(listener)

    def close(self) -> None:
        """Stops accepting; the connections accepted stay (the server
        closes them)."""
        for server in self._servers:
            server.close()

    async def wait_closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()

    async def _listen(self, loop, host: str, port: int, tls=None) -> list[asyncio.Server]:
        """Not accepting yet; on the sockets a server taken over from
        handed over for host:port, if any (takeover/)."""
        servers = await self.server.takeover.listen(
            loop, self.factory(loop, tls), RESP_FRONT, host, port, tls is not None, serve=False)
        self._servers += servers
        return servers

    def factory(self, loop, tls) -> Callable[[], asyncio.BaseProtocol]:
        # Connection has asyncio.Protocol's callbacks but is a cdef class,
        # not a subclass of it.
        app = self.server
        return app.protocol_factory(
            loop, lambda: cast(asyncio.BaseProtocol, Connection(app.core)), app.core, tls)

    # ---- CONFIG SET bind and port -----------------------------------------------

    def rebind(self, trial: cfg.Settings, names: set[str]) -> Rebind:
        """The sockets the new bind and port need, bound and listening now,
        before anything changes: the listeners already on an address kept
        stay as they are.  A bind that fails closes what was bound and
        raises Redis's error, the old listeners untouched."""
        app = self.server
        rebind = Rebind(self)
        if not names & {"bind", "port"}:
            return rebind
        # The value CONFIG GET shows is no change (--port 0 shows 0, the port it
        # picked serving); another 0 picks a free port, as at the start.
        port = trial.port if trial.port != app.settings.port else app.port
        wanted = [(host, False) for host in trial.bind]
        wanted += [(host, True) for host in trial.bind] if trial.tls_port else []
        try:
            for host, tls in wanted:
                key = (host, trial.tls_port if tls else port, tls)
                if key[1] and key in self._listeners:
                    rebind.kept.add(key)
                    continue
                socks = bound_sockets(host, key[1])
                if not tls and not port:      # port 0: a free one, then the same for all
                    port = socks[0].getsockname()[1]
                rebind.new[(host, key[1] or port, tls)] = socks
        except OSError as e:
            rebind.abandon()
            moved = "port" in names and port != app.port
            self.log.warning("CONFIG SET %s: could not listen on %s port %s: %s",
                             "port" if moved else "bind", " ".join(trial.bind), port, e)
            if moved:
                raise cfg.ConfigError("Unable to listen on this port. Check server logs.",
                                      "port") from None
            raise cfg.ConfigError("Failed to bind to specified addresses.", "bind") from None
        rebind.port = port
        return rebind

    async def _serve(self, key: ListenerKey, socks: list[socket.socket]) -> None:
        """Serves sockets bound by CONFIG SET, unless a later one closed
        their listener first."""
        app = self.server
        loop = asyncio.get_running_loop()
        servers = self._listeners.get(key)
        tls = app.tls.server if key[2] else None
        for sock in socks:
            if self._listeners.get(key) is not servers or app.stopping:
                sock.close()
                continue
            server = await loop.create_server(
                self.factory(loop, tls), sock=sock, backlog=511)
            app.takeover.noted(RESP_FRONT, key[0], key[2], server)
            self._servers.append(server)
            cast(list, servers).append(server)


class Rebind:
    """A change of the RESP listeners that CONFIG SET prepared: the
    sockets bound for it (new) and the listeners it keeps; commit() makes
    it the server's, abandon() forgets it."""

    def __init__(self, front: RespFront):
        self.front = front
        self.port = front.server.port
        self.new: dict[ListenerKey, list[socket.socket]] = {}
        self.kept: set[ListenerKey] = set()

    def abandon(self) -> None:
        for socks in self.new.values():
            for sock in socks:
                sock.close()
        self.new.clear()

    def commit(self) -> None:
        """The old listeners not kept stop accepting; the connections they
        accepted stay, as in Redis.  The new ones serve from the next turn
        of the loop (their sockets listen already)."""
        front, app = self.front, self.front.server
        if not self.new and not self.kept:
            return
        for key in [k for k in front._listeners if k not in self.kept]:
            for listener in front._listeners.pop(key):
                listener.close()
                front._servers.remove(listener)
        app.port = self.port
        for key, socks in self.new.items():
            front._listeners[key] = []
            asyncio.ensure_future(front._serve(key, socks))
        front.log.warning("now listening on %s port %d", " ".join(app.settings.bind), app.port)


def bound_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for host:port, one per address the name has, as
    create_server binds them (port 0: the first one's free port for all)."""
    socks: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        seen = set()
        for family, kind, proto, _, addr in infos:
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if not port and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            sock.bind(addr)
            sock.listen(511)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks
