"""HTTP helpers for the middleware tests: real servers in threads (uvicorn
for ASGI apps, werkzeug's threaded server for WSGI apps) on free loopback
ports, and a client built on http.client so the bytes on the wire are the
ones checked."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass

# Headers the HTTP servers add on their own; the tests compare the rest exactly.
SERVER_HEADERS = {"date", "server", "connection"}


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]  # in wire order, names lower-cased, the server's own left out
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return values[0] if values else None

    def json(self):
        return json.loads(self.body)


def request(port: int, path: str, method: str = "GET", headers: dict | None = None,
            body: bytes | None = None) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        kept = [(k.lower(), v) for k, v in resp.getheaders() if k.lower() not in SERVER_HEADERS]
        return Response(resp.status, kept, data)
    finally:
        conn.close()


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.01)


class AsgiServer:
    """An ASGI app under uvicorn in a thread."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        # proxy_headers off: uvicorn would otherwise rewrite the peer address from
        # X-Forwarded-For itself, and the middleware's own handling is under test.
        config = uvicorn.Config(app, log_level="warning", lifespan="off", proxy_headers=False,
                                server_header=False, date_header=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        _wait(lambda: self.server.started, "uvicorn")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


class WsgiServer:
    """A WSGI app under werkzeug's threaded development server in a thread."""

    def __init__(self, app):
        from werkzeug.serving import make_server

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(10)
        self.server.server_close()


# ---- the headers and bodies the middleware must send ----------------------

def quota(limit, remaining, reset, window):
    """The quota headers of an answer, in the order the middleware sends them."""
    return [
        ("x-ratelimit-limit", str(limit)),
        ("x-ratelimit-remaining", str(remaining)),
        ("x-ratelimit-reset", str(reset)),
        ("ratelimit-policy", f'"burst";q={limit};w={window}'),
        ("ratelimit", f'"burst";r={remaining};t={reset}'),
    ]


def denied(retry, limit, remaining, reset, window):
    """The headers and body of a 429."""
    body = json.dumps({"error": "rate_limited", "retry_after_seconds": retry}).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if retry is not None:
        headers.append(("retry-after", str(retry)))
    return headers + quota(limit, remaining, reset, window), body
