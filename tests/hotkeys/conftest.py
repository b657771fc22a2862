"""Servers for the hot-key tests: with the HTTP front on (for /metrics,
/v1/stats and the HTTP check endpoints)."""

from __future__ import annotations

import http.client
import json

import pytest
from servers import ExtraPortServer, started_servers


class HttpServer(ExtraPortServer):
    PORT_FLAG = "--http-port"

    def request(self, method: str, path: str, body=None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.extra_port, timeout=10)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture
def make_http_server():
    with started_servers(HttpServer) as make:
        yield make


@pytest.fixture
def hs(make_http_server) -> HttpServer:
    """Manual clock, the HTTP front on, default hot-key settings."""
    return make_http_server("--manual-clock")
