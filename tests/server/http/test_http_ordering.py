"""Responses keep request order when a routed handler waits (a rule change
in cluster mode waits on the other primaries): an HttpConnection fed by
hand in this process, with a route whose response comes later."""

from __future__ import annotations

import asyncio
import json

from fastlimit._http import HttpConnection
from fastlimit._protocol import Command
from fastlimit.server import config as cfg
from fastlimit.server.app import Server
from fastlimit.server.http.routes import Response, Route, _compile


class Transport:
    def __init__(self):
        self.written = b""
        self.reading = True
        self.closed = False

    def get_extra_info(self, name):
        return ("127.0.0.1", 1)

    def write(self, data):
        self.written += data

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def close(self):
        self.closed = True


def request(method: str, path: str, body: bytes = b"") -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)


def test_a_check_after_a_waiting_response_is_sent_after_it():
    async def run():
        server = Server(cfg.Settings(manual_clock=True, rules_db=None, snapshot_file=None,
                                     http_port=0).validate())
        gate = asyncio.get_running_loop().create_future()

        async def later():
            await gate
            return Response(200, b'{"slow":true}')

        server.http.routes.routes.insert(0, Route("GET", "/slow", _compile("/slow"),
                                                  lambda req: later()))
        server.http.endpoint_stats["GET /slow"] = Command("GET /slow", 0)
        conn = HttpConnection(server.http.shared)
        transport = Transport()
        conn.connection_made(transport)
        conn.data_received(request("GET", "/livez") + request("GET", "/slow") +
                           request("POST", "/v1/check/bucket",
                                   b'{"key":"k","capacity":2,"refill_per_sec":1}') +
                           request("GET", "/livez"))
        assert transport.written.count(b"HTTP/1.1 200") == 1     # only what precedes /slow
        assert not transport.reading                             # and nothing more is read
        gate.set_result(None)
        for _ in range(5):
            await asyncio.sleep(0)
        bodies = [part.split(b"\r\n\r\n", 1)[1]
                  for part in transport.written.split(b"HTTP/1.1 ")[1:]]
        assert bodies[0] == b"ok\n" and bodies[1] == b'{"slow":true}'
        assert json.loads(bodies[2])["remaining"] == 1
        assert bodies[3] == b"ok\n"
        assert transport.reading

    asyncio.run(run())
