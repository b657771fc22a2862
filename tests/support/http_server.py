"""A fastlimit-server child with its HTTP front on a free port, for every
test folder that speaks HTTP to a real server (tests/server/http/,
tests/hotkeys/): ``from http_server import HttpServer``."""

from __future__ import annotations

import http.client
import json

from servers import ExtraPortServer


class HttpServer(ExtraPortServer):
    """A fastlimit-server child with --http-port on a free port."""

    PORT_FLAG = "--http-port"

    @property
    def http_port(self) -> int:
        return self.extra_port

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
