"""Envoy's rate limit service (envoyproxy/ratelimit compatible), in one
folder as envoyproxy/ratelimit keeps its own.

- config, goyaml, matcher, service: the YAML configuration (go-yaml's
  rules), descriptor matching and the decision (no asyncio);
- xds_codec: the xDS (ADS) messages; xds_client: the thread that follows
  an xDS server; subsystem: the configuration folder watched and reloaded,
  the swap in one step;
- http_json: the /json route of the HTTP front; commands: CL.RLS.

Compiled part it uses: _grpc.pyx (HTTP/2 by nghttp2, gRPC framing, the
RateLimitService and health codecs); the gRPC front is server/grpc/."""
