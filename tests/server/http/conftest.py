"""A fastlimit with its HTTP front on, for the tests of server/http/."""

from __future__ import annotations

import http.client
import json

import pytest
from servers import ServerProcess
from wire import free_port


class HttpServer(ServerProcess):
    """A fastlimit-server child with --http-port on a free port."""

    def __init__(self, *args: str):
        self.http_port = free_port()
        super().__init__("--http-port", str(self.http_port), *args)

    def http(self, timeout: float = 10) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout)

    def request(self, method: str, path: str, body=None, headers=None):
        """(status, headers as a dict of lowercase names, body bytes) of one
        request on a new connection; a dict or list body is sent as JSON."""
        conn = self.http()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path: str, doc, headers=None):
        """(status, headers, the JSON body decoded)."""
        status, hdrs, body = self.request("POST", path, doc, headers)
        return status, hdrs, json.loads(body)


@pytest.fixture
def make_http_server():
    started: list[HttpServer] = []

    def make(*args: str) -> HttpServer:
        srv = HttpServer(*args).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def hs(make_http_server) -> HttpServer:
    """The default: manual clock, no password."""
    return make_http_server("--manual-clock")
