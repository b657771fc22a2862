"""HTTP/2 and the protobuf of Envoy's ShouldRateLimit through the gRPC
front's connection (_grpc.pyx's GrpcConnection: libnghttp2's session, our
callbacks, the request decoder, the decision, the response encoder) on a
server in this process with a rate limit configuration, in reads cut
anywhere.  The client's connection preface is put before the bytes unless
the first byte is odd (then the bytes must bring their own)."""

import os
import sys
import tempfile

import harness

with harness.instrumented():
    from fastlimit._grpc import GrpcConnection
    from fastlimit.server.app import Server  # noqa: F401  (instrumented with the RLS service)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
CONFIG = b"""\
domain: fuzz
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 10}
"""


def make_server():
    fd, path = tempfile.mkstemp(suffix=".yaml")
    os.write(fd, CONFIG)
    os.close(fd)
    try:
        srv = harness.server(rls_config=path)
    finally:
        os.unlink(path)
    srv.grpc.shared.loop = harness.loop()
    return srv


SERVER = make_server()


def one_input(data: bytes) -> None:
    reads = harness.split(data)
    if not data or data[0] & 1 == 0:
        reads.insert(0, PREFACE)
    harness.feed(GrpcConnection(SERVER.grpc.shared), reads)
    harness.raise_logged_bugs()
    SERVER.flush_buckets()


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
