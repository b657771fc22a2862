"""The gRPC front as a subsystem: it listens on grpc-port on every bind
address and hands each connection to fastlimit._grpc.GrpcConnection, which
speaks HTTP/2 and answers Envoy's ShouldRateLimit through
server.rls.service, and grpc.health.v1's Check."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from fastlimit._grpc import GrpcConnection, GrpcShared
from fastlimit.server.subsystem import Subsystem

# How long a shutdown lets the calls already begun finish (each has its
# grpc-deadline-ms, or the client's grpc-timeout, anyway).
DRAIN_SECONDS = 1.0
# Between the GOAWAY notice and the last GOAWAY: time for a client to read
# the notice and open its new streams elsewhere (RFC 9113 6.8: "at least
# one round-trip time"), so that none is cut while it sends one.
GOAWAY_GRACE_SECONDS = 0.05


class GrpcFront(Subsystem):
    def __init__(self, server, log: logging.Logger):
        self.server = server
        self.log = log
        self.port = 0
        self.shared = GrpcShared(server.core, self)
        self.shared.app = server
        self.shared.decider = server.rls.service.decider
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def endpoint_stats(self):
        return self.shared.endpoint_stats

    def apply_settings(self, s) -> None:
        self.shared.max_streams = s.grpc_max_concurrent_streams
        self.shared.max_descriptors = s.grpc_max_descriptors
        self.shared.deadline_ns = int(s.grpc_deadline_ms * 1_000_000)
        # as an HTTP/1.1 client has it to send its request's headers
        self.shared.client_wait_s = s.http_header_timeout

    async def start(self) -> None:
        self.shared.loop = asyncio.get_running_loop()
        self._servers, self.port = await self.server.listen_front(
            "gRPC", lambda: cast(asyncio.BaseProtocol, GrpcConnection(self.shared)),
            self.shared, self.server.tls.grpc if self.server.settings.tls_grpc else None)

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
                          "grpc_request_timeouts": shared.request_timeouts,
                          "grpc_stall_timeouts": shared.stall_timeouts,
                          "grpc_output_limit_disconnections":
                              shared.output_limit_disconnections,
                          "grpc_deferred_calls": shared.deferred_calls,
                          "grpc_total_calls": sum(c.calls for c in stats),
                          "grpc_failed_calls": sum(c.failed_calls for c in stats)}}

    def announce_shutdown(self) -> None:
        """Says NOT_SERVING and sends each connection a GOAWAY notice
        (once): its client opens its next streams elsewhere."""
        if self.shared.draining:
            return
        self.shared.draining = True
        for conn in self.shared.connections:
            conn.notify_shutdown()

    async def stop(self) -> None:
        """Stops listening, announces the shutdown, lets the calls begun
        finish (bounded), then the last GOAWAY."""
        for server in self._servers:
            server.close()
        self.announce_shutdown()
        connections = list(self.shared.connections)
        loop = asyncio.get_running_loop()
        if connections:
            await asyncio.sleep(GOAWAY_GRACE_SECONDS)
        deadline = loop.time() + DRAIN_SECONDS
        while any(c.unanswered for c in connections) and loop.time() < deadline:
            await asyncio.sleep(0.005)
        for conn in connections:
            conn.goaway()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
