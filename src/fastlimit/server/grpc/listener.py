"""The gRPC front as a subsystem: it listens on grpc-port on every bind
address and hands each connection to fastlimit._grpc.GrpcConnection, which
speaks HTTP/2 and answers Envoy's ShouldRateLimit through
server.rls.service, and grpc.health.v1's Check."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from fastlimit._grpc import GrpcConnection, GrpcShared
from fastlimit.rls.service import RlsError
from fastlimit.server.subsystem import Subsystem

# How long a shutdown lets the calls already begun finish (each has its
# grpc-deadline-ms, or the client's grpc-timeout, anyway).
DRAIN_SECONDS = 1.0


class GrpcFront(Subsystem):
    def __init__(self, server, log: logging.Logger):
        self.server = server
        self.log = log
        self.port = 0
        self.shared = GrpcShared(server.core, self)
        self.shared.app = server
        self.shared.refusal = RlsError
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def endpoint_stats(self):
        return self.shared.endpoint_stats

    def apply_settings(self, s) -> None:
        self.shared.set_password(s.requirepass)
        self.shared.max_streams = s.grpc_max_concurrent_streams
        self.shared.deadline_ns = int(s.grpc_deadline_ms * 1_000_000)
        # as an HTTP/1.1 client has it to send its request's headers
        self.shared.greeting_timeout_s = s.http_header_timeout

    async def start(self) -> None:
        port = self.server.settings.grpc_port
        if not port:
            return
        loop = asyncio.get_running_loop()
        self.shared.loop = loop
        for host in self.server.settings.bind:
            self._servers.append(await loop.create_server(
                lambda: cast(asyncio.BaseProtocol, GrpcConnection(self.shared)), host, port,
                reuse_address=True, backlog=511, **self._tls_options()))
        self.port = port
        self.log.info("gRPC on %s port %d", " ".join(self.server.settings.bind), port)

    def _tls_options(self) -> dict:
        s, tls = self.server.settings, self.server.tls
        return tls.listener_options(tls.grpc if s.tls_grpc else None, s)

    def info_sections(self, sections, named):
        shared = self.shared
        stats = shared.endpoint_stats.values()
        return {"clients": {"grpc_connected_clients": len(shared.connections)},
                "memory": {"mem_grpc": shared.memory},
                "stats": {"grpc_port": self.port,
                          "grpc_total_connections_received": shared.total_connections,
                          "grpc_rejected_connections": shared.rejected_connections,
                          "grpc_protocol_errors": shared.protocol_errors,
                          "grpc_greeting_timeouts": shared.greeting_timeouts,
                          "grpc_total_calls": sum(c.calls for c in stats),
                          "grpc_failed_calls": sum(c.failed_calls for c in stats)}}

    async def stop(self) -> None:
        """Stops listening, says NOT_SERVING and sends each connection a
        GOAWAY notice, lets the calls begun finish (bounded), then the
        last GOAWAY."""
        for server in self._servers:
            server.close()
        self.shared.draining = True
        connections = list(self.shared.connections)
        for conn in connections:
            conn.notify_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_SECONDS
        while any(c.unanswered for c in connections) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for conn in connections:
            conn.goaway()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
