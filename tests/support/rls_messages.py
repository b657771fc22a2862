"""The RLS and health messages by hand, for the gRPC front's tests: a
RateLimitRequest encoder and a RateLimitResponse decoder written from the
field numbers of envoy/service/ratelimit/v3/rls.proto (independent of the
server's C code, so each checks the other), plus gRPC's 5-byte framing.
The benches (bench/grpc_*.py) use it too: nothing but error_of needs
grpcio or pytest, so only error_of imports them."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import grpc

RLS_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
HEALTH_PATH = "/grpc.health.v1.Health/Check"
OK, OVER_LIMIT = 1, 2
SECOND, MINUTE, HOUR, DAY = 1, 2, 3, 4


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def uint_field(field: int, n: int) -> bytes:
    return tag(field, 0) + varint(n)


def descriptor(entries, limit=None, hits_addend=None) -> bytes:
    """RateLimitDescriptor {1 entries {1 key, 2 value}, 2 limit, 3 hits_addend}."""
    out = b"".join(length_delimited(1, length_delimited(1, k) + length_delimited(2, v))
                   for k, v in entries)
    if limit is not None:
        out += length_delimited(2, uint_field(1, limit[0]) + uint_field(2, limit[1]))
    if hits_addend is not None:
        out += length_delimited(3, uint_field(1, hits_addend) if hits_addend else b"")
    return out


def request(domain: bytes, *descriptors: bytes, hits_addend: int = 0) -> bytes:
    """RateLimitRequest {1 domain, 2 descriptors, 3 hits_addend}."""
    out = length_delimited(1, domain) if domain else b""
    out += b"".join(length_delimited(2, d) for d in descriptors)
    return out + (uint_field(3, hits_addend) if hits_addend else b"")


def grpc_frame(message: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(message)) + message


def fields(message: bytes):
    """(field, wire type, value) of each field: an int, or the bytes of a
    length-delimited one."""
    i, out = 0, []
    while i < len(message):
        key, i = read_varint(message, i)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = read_varint(message, i)
        elif wire_type == 2:
            n, i = read_varint(message, i)
            value, i = message[i:i + n], i + n
            assert i <= len(message), "truncated"
        else:
            raise AssertionError(f"unexpected wire type {wire_type}")
        out.append((field, wire_type, value))
    return out


def read_varint(data: bytes, i: int):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def decode_response(message: bytes) -> dict:
    """RateLimitResponse as {"overall": code, "statuses": [...], "headers": [...]}:
    each status {"code", "limit": (rpu, unit, name) or None, "remaining",
    "reset": seconds or None (absent)}."""
    out = {"overall": 0, "statuses": [], "headers": []}
    for field, _, value in fields(message):
        if field == 1:
            out["overall"] = value
        elif field == 2:
            status = {"code": 0, "limit": None, "remaining": 0, "reset": None}
            for f, _, v in fields(value):
                if f == 1:
                    status["code"] = v
                elif f == 2:
                    limit = {1: 0, 2: 0, 3: b""}
                    limit.update({f2: v2 for f2, _, v2 in fields(v)})
                    status["limit"] = (limit[1], limit[2], limit[3])
                elif f == 3:
                    status["remaining"] = v
                elif f == 4:
                    seconds = dict((f2, v2) for f2, _, v2 in fields(v)).get(1, 0)
                    status["reset"] = seconds - (1 << 64) if seconds >> 63 else seconds
            out["statuses"].append(status)
        elif field == 3:
            header = {f: v for f, _, v in fields(value)}
            out["headers"].append((header.get(1, b""), header.get(2, b"")))
    return out


def health_request(service: bytes = b"") -> bytes:
    return length_delimited(1, service) if service else b""


def health_status(message: bytes) -> int:
    return dict((f, v) for f, _, v in fields(message)).get(1, 0)


def error_of(call) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a call that must fail with a gRPC error."""
    import grpc
    import pytest
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()
