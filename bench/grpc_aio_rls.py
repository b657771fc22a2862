#!/usr/bin/env python3
"""The pure-Python side of bench/grpc_front.py: ShouldRateLimit on a
grpc.aio server, the same decision as fastlimit's gRPC front.

What a Python team would run instead of fastlimit's front: grpcio's
asyncio server (one process, asyncio's default event loop, one thread
driving the handlers as the gRPC team advises, grpcio's C core threads
beside it) with a unary handler that takes the raw request bytes.

The decision is fastlimit's own, so the two sides differ only in the
gRPC stack: fastlimit.rls.service.RateLimitService over an in-process
fastlimit._rules.RuleEngine (the engine the server's rules run on, here
without a server around it) and a fastlimit.rules.registry.RuleRegistry
(where the counters' rule numbers are reserved, as in the server), with
the same rls-config YAML loaded by fastlimit.rls.config.  The messages
are read and written in Python with tests/support/rls_messages.py's
protobuf primitives (the response byte for byte as fastlimit's C
encoder writes it: proto3 zeros left out).

A second method, /fastlimit.bench.Stats/Get, answers JSON with the
handler's counts (calls, calls not answered with a message, and the service's per-domain
calls and over-limit counts), so the bench can check that every call was
answered with grpc-status 0 and decided.

    python bench/grpc_aio_rls.py --port N --rls-config PATH

prints "grpc.aio ready on port N" once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import grpc

from fastlimit._core import Clock
from fastlimit._rules import RuleEngine
from fastlimit.rls.config import load
from fastlimit.rls.service import RateLimitService, RlsError
from fastlimit.rules.registry import RuleRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from rls_messages import fields, length_delimited, uint_field  # noqa: E402

RLS_SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
STATS_SERVICE = "fastlimit.bench.Stats"


# ---------------------------------------------------------------------------
# the messages (field numbers of envoy/service/ratelimit/v3/rls.proto)

def decode_request(message: bytes):
    """RateLimitRequest {1 domain, 2 descriptors, 3 hits_addend}: the
    arguments of RateLimitService.should_rate_limit."""
    domain, descriptors, hits = b"", [], 0
    for f, wire_type, value in fields(message):
        if f == 1 and wire_type == 2:
            domain = value
        elif f == 2 and wire_type == 2:
            descriptors.append(decode_descriptor(value))
        elif f == 3 and wire_type == 0:
            hits = value & 0xFFFFFFFF
    return domain, descriptors, hits


def decode_descriptor(message: bytes):
    """RateLimitDescriptor {1 entries {1 key, 2 value}, 2 limit {1
    requests_per_unit, 2 unit}, 3 hits_addend {1 value}}."""
    entries, override, hits = [], None, None
    for f, wire_type, value in fields(message):
        if wire_type != 2:
            continue
        sub = {f2: v2 for f2, _, v2 in fields(value)}
        if f == 1:
            entries.append((sub.get(1, b""), sub.get(2, b"")))
        elif f == 2:
            override = (sub.get(1, 0), sub.get(2, 0))
        elif f == 3:
            hits = sub.get(1, 0)
    return entries, override, hits


def encode_response(overall: int, statuses, headers) -> bytes:
    """RateLimitResponse {1 overall_code, 2 statuses, 3 response_headers_to_add}."""
    out = [uint_field(1, overall)]
    for code, current, remaining, reset_s in statuses:
        status = uint_field(1, code) if code else b""
        if current is not None:
            rpu, unit, name = current
            status += length_delimited(2, (uint_field(1, rpu) if rpu else b"")
                                       + (uint_field(2, unit) if unit else b"")
                                       + (length_delimited(3, name) if name else b""))
        if remaining:
            status += uint_field(3, remaining)
        if current is not None or reset_s:
            status += length_delimited(4, uint_field(1, reset_s) if reset_s else b"")
        out.append(length_delimited(2, status))
    for key, value in headers:
        out.append(length_delimited(3, length_delimited(1, key) + length_delimited(2, value)))
    return b"".join(out)


# ---------------------------------------------------------------------------
# the server

class Handlers:
    def __init__(self, service: RateLimitService):
        self.service = service
        self.calls = self.answered = 0

    async def should_rate_limit(self, request: bytes, context) -> bytes:
        self.calls += 1
        try:
            overall, statuses, headers = self.service.should_rate_limit(*decode_request(request))
        except RlsError as e:
            await context.abort(grpc.StatusCode.UNKNOWN, str(e))
        reply = encode_response(overall, statuses, headers)
        self.answered += 1
        return reply

    async def stats(self, request: bytes, context) -> bytes:
        domains = {name.decode(): {"calls": s.calls, "over_limit": s.over_limit}
                   for name, s in self.service.stats.items()}
        return json.dumps({"calls": self.calls, "failed": self.calls - self.answered,
                           "domains": domains}).encode()


def unary(handler) -> grpc.RpcMethodHandler:
    # no (de)serializer: the handler gets and returns the message's bytes
    return grpc.unary_unary_rpc_method_handler(handler)


async def serve(port: int, rls_config: str) -> None:
    # as the server builds it (server/app.py, rls/subsystem.py): the
    # counters' rule numbers are reserved in a rule registry over the engine
    engine = RuleEngine(clock=Clock())
    registry = RuleRegistry(engine)
    registry.start()
    service = RateLimitService(engine, registry)
    service.set_config(load(rls_config))
    handlers = Handlers(service)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(
            RLS_SERVICE, {"ShouldRateLimit": unary(handlers.should_rate_limit)}),
        grpc.method_handlers_generic_handler(STATS_SERVICE, {"Get": unary(handlers.stats)}),
    ))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"grpc.aio ready on port {bound} (grpcio {grpc.__version__})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=0.5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rls-config", required=True, help="envoyproxy/ratelimit's YAML")
    args = p.parse_args()
    asyncio.run(serve(args.port, args.rls_config))


if __name__ == "__main__":
    main()
