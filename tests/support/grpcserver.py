"""A fastlimit server process with its gRPC front on a free grpc-port,
called with grpcio (raw bytes over a generic unary call, the messages made
by rls_messages.py)."""

from __future__ import annotations

import os
import tempfile

import grpc
from rls_messages import HEALTH_PATH, RLS_PATH, decode_response, health_status
from servers import ExtraPortServer

# The rate limit service's configuration the front's tests decide with
# (envoyproxy/ratelimit's YAML): api_key 3 a minute, per path 1000 a minute.
RIG_YAML = """\
domain: rig
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: api_key}
  - key: generic_key
    value: per_path
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1000, name: "generic_key,path"}
"""


class GrpcServer(ExtraPortServer):
    """A fastlimit-server child with --grpc-port on a free port; with
    rls (a YAML text, such as RIG_YAML), its rate limit service decides
    with that configuration (written under the tests' temp dir)."""

    PORT_FLAG = "--grpc-port"

    def __init__(self, *args: str, rls: str | None = None):
        if rls is not None:
            fd, path = tempfile.mkstemp(prefix="rls-", suffix=".yaml")
            with os.fdopen(fd, "w") as f:
                f.write(rls)
            args = (*args, "--rls-config", path)
        super().__init__(*args)
        self._channel = None

    @property
    def grpc_port(self) -> int:
        return self.extra_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        return self._channel

    def call(self, path: str, message: bytes, timeout: float = 10, metadata=None) -> bytes:
        """The response message's bytes; grpc.RpcError on a gRPC error."""
        return self.channel().unary_unary(path)(message, timeout=timeout, metadata=metadata)

    def should_rate_limit(self, message: bytes, **kw) -> dict:
        return decode_response(self.call(RLS_PATH, message, **kw))

    def health(self, message: bytes = b"") -> int:
        return health_status(self.call(HEALTH_PATH, message))

    def info(self) -> dict:
        return self.client().info("everything")

    def stop(self, *args, **kw):
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        return super().stop(*args, **kw)
