"""A tiny xDS management server for the tests: ADS State of the World over
real gRPC (grpcio, a generic handler, raw bytes), serving RateLimitConfig
resources the test encodes here by hand from rls_conf.proto's field
numbers (independent of fastlimit.rls.xds_codec, so each checks the other).

Like go-control-plane's cache, it sends the snapshot when a stream opens
unless the stream's first request already has its version, and again to
every open stream when the test sets a new one; it records every request
it receives, decoded."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from concurrent import futures

import grpc
from rls_messages import fields, length_delimited, uint_field

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
UNITS = {"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}


# ---- RateLimitConfig (ratelimit.config.ratelimit.v3) ---------------------------------------

def policy(requests_per_unit: int, unit, name: str = "", unlimited: bool = False,
           replaces=()) -> bytes:
    """RateLimitPolicy {1 unit, 2 requests_per_unit, 3 unlimited, 4 name, 5 replaces}."""
    unit = UNITS[unit] if isinstance(unit, str) else unit
    out = uint_field(1, unit) if unit else b""
    out += uint_field(2, requests_per_unit) if requests_per_unit else b""
    out += uint_field(3, 1) if unlimited else b""
    out += length_delimited(4, name.encode()) if name else b""
    return out + b"".join(length_delimited(5, length_delimited(1, r.encode())) for r in replaces)


def descriptor(key: str, value: str = "", rate_limit: bytes | None = None, children=(),
               shadow_mode: bool = False) -> bytes:
    """RateLimitDescriptor {1 key, 2 value, 3 rate_limit, 4 descriptors, 5 shadow_mode}."""
    out = length_delimited(1, key.encode()) + (length_delimited(2, value.encode()) if value
                                               else b"")
    out += length_delimited(3, rate_limit) if rate_limit is not None else b""
    out += b"".join(length_delimited(4, c) for c in children)
    return out + (uint_field(5, 1) if shadow_mode else b"")


def rate_limit_config(domain: str, *descriptors: bytes, name: str | None = None) -> bytes:
    """RateLimitConfig {1 name, 2 domain, 3 descriptors}."""
    return length_delimited(1, (name if name is not None else domain).encode()) + \
        length_delimited(2, domain.encode()) + b"".join(length_delimited(3, d)
                                                         for d in descriptors)


def discovery_response(version: str, resources, nonce: str, type_url: str = TYPE_URL) -> bytes:
    """DiscoveryResponse {1 version_info, 2 resources (Any {1 type_url, 2 value}),
    4 type_url, 5 nonce}."""
    out = length_delimited(1, version.encode())
    for r in resources:
        out += length_delimited(2, length_delimited(1, TYPE_URL.encode()) + length_delimited(2, r))
    return out + length_delimited(4, type_url.encode()) + length_delimited(5, nonce.encode())


def decode_request(data: bytes) -> dict:
    """DiscoveryRequest as {version, node_id, names, type_url, nonce, error
    (code, message) or None}."""
    out = {"version": "", "node_id": "", "names": [], "type_url": "", "nonce": "",
           "error": None}
    for f, _, v in fields(data):
        if f == 1:
            out["version"] = v.decode()
        elif f == 2:
            out["node_id"] = dict((f2, v2) for f2, _, v2 in fields(v)).get(1, b"").decode()
        elif f == 3:
            out["names"].append(v.decode())
        elif f == 4:
            out["type_url"] = v.decode()
        elif f == 5:
            out["nonce"] = v.decode()
        elif f == 6:
            status = dict((f2, v2) for f2, _, v2 in fields(v))
            out["error"] = (status.get(1, 0), status.get(2, b"").decode())
    return out


# ---- the server ----------------------------------------------------------------------------

class AdsServer:
    def __init__(self, port: int = 0, tls: tuple[str, str, str] | None = None):
        """tls: (certificate, key, CA) files: served over TLS, and a client
        must show a certificate from that CA."""
        self.port = port
        self.tls = tls
        self.version = ""
        self.resources: list[bytes] = []
        self.raw: bytes | None = None          # a response sent as it is, instead
        self.requests: list[dict] = []         # every request, with "stream": its number
        self._streams: dict[int, queue.SimpleQueue] = {}
        self._numbers = itertools.count(1)
        self._nonces = itertools.count(1)
        self._cond = threading.Condition()
        self._server = None

    def start(self) -> AdsServer:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.stream_stream_rpc_method_handler(self._stream)   # bytes both ways
        methods = {"StreamAggregatedResources": handler}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, methods),))
        address = f"127.0.0.1:{self.port}"
        if self.tls is None:
            self.port = self._server.add_insecure_port(address)
        else:
            cert, key, ca = (open(path, "rb").read() for path in self.tls)
            self.port = self._server.add_secure_port(address, grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=True))
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(0).wait(5)
        with self._cond:
            for q in self._streams.values():
                q.put(None)
            self._streams.clear()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_snapshot(self, version: str, *resources: bytes) -> str | None:
        """Sends the snapshot to every open stream; the nonce it is sent with."""
        with self._cond:
            self.version, self.resources, self.raw = version, list(resources), None
            return self._send_all()

    def send_raw(self, make) -> str:
        """Sends make(nonce) as the response, bytes of the test's choosing."""
        with self._cond:
            nonce = f"n{next(self._nonces)}"
            for q in self._streams.values():
                q.put(make(nonce))
            return nonce

    def _send_all(self) -> str | None:
        if not self._streams:
            return None         # the next stream gets it with a nonce of its own
        nonce = f"n{next(self._nonces)}"
        for q in self._streams.values():
            q.put(discovery_response(self.version, self.resources, nonce))
        return nonce

    def _stream(self, request_iterator, context):
        number = next(self._numbers)
        q: queue.SimpleQueue = queue.SimpleQueue()
        context.add_callback(lambda: q.put(None))

        def read():
            try:
                self._read(number, request_iterator, q)
            except grpc.RpcError:
                pass            # the client went away
            q.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                yield item
        finally:
            with self._cond:
                self._streams.pop(number, None)

    def _read(self, number: int, request_iterator, q: queue.SimpleQueue) -> None:
        """Records the stream's requests; the first opens it to snapshots
        (and gets the one in force unless it has its version already)."""
        for i, message in enumerate(request_iterator):
            request = decode_request(message)
            request["stream"] = number
            with self._cond:
                self.requests.append(request)
                self._cond.notify_all()
                if i == 0:
                    self._streams[number] = q
                    if self.version and request["version"] != self.version:
                        q.put(discovery_response(self.version, self.resources,
                                                 f"n{next(self._nonces)}"))

    def wait_request(self, predicate, what: str, timeout: float = 10.0) -> dict:
        """The first request recorded that predicate accepts, waiting for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self.requests:
                    if predicate(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no request {what}: {self.requests}")
                self._cond.wait(left)

    def answer_to(self, nonce: str, timeout: float = 10.0) -> dict:
        """The ACK or NACK of the response sent with nonce."""
        return self.wait_request(lambda r: r["nonce"] == nonce, f"answering {nonce}", timeout)
