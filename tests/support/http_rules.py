"""The rules API's calls over real HTTP, for its tests standalone
(tests/server/http/test_http_rules.py) and in cluster mode
(tests/cluster/test_http_rules_cluster.py): a call's reply, pipelined
calls on one connection, and a server with its HTTP port."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass

from servers import ServerProcess

RULE = {"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1}
PROBLEM = "application/problem+json"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]     # lowercase names
    body: bytes

    def json(self):
        return json.loads(self.body)

    def problem(self) -> dict:
        assert self.headers["content-type"] == PROBLEM, (self.status, self.headers, self.body)
        doc = self.json()
        assert doc["status"] == self.status
        return doc


def call(port: int, method: str, path: str, body=None, headers=None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


class _SharedReader:
    """One buffered reader under several HTTPResponses in a row, so
    pipelined responses are read in order from one connection."""

    def __init__(self, f):
        self.f = f

    def makefile(self, mode):
        return self

    def close(self):
        pass

    def __getattr__(self, name):
        return getattr(self.f, name)


def pipelined(port: int, *requests: tuple[str, str, bytes]) -> list[Reply]:
    """Sends every (method, path, body) in one write on one connection,
    then reads the responses."""
    wire = b"".join(f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}"
                    f"\r\n\r\n".encode() + body for method, path, body in requests)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(wire)
        reader = _SharedReader(sock.makefile("rb"))
        replies = []
        for _ in requests:
            resp = http.client.HTTPResponse(reader)
            resp.begin()
            replies.append(Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                 resp.read()))
        return replies


class Node:
    """A server with its HTTP port, and the calls a test makes on it."""

    def __init__(self, process: ServerProcess, http_port: int):
        self.process = process
        self.port = http_port

    def __call__(self, method, path, body=None, headers=None) -> Reply:
        return call(self.port, method, path, body, headers)

    def resp(self, *args):
        with self.process.client() as c:
            return c.execute_command(*args)
