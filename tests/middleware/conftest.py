"""Fixtures serving apps over real HTTP for the middleware tests (see
tests/support/httpkit.py)."""

from __future__ import annotations

import pytest
from httpkit import AsgiServer, WsgiServer


def _serving(server_class):
    started = []

    def serve(app) -> int:
        server = server_class(app)
        started.append(server)
        return server.port

    return serve, started


@pytest.fixture
def serve_asgi():
    """serve_asgi(app) -> port: the app under uvicorn until the test ends."""
    serve, started = _serving(AsgiServer)
    yield serve
    for server in started:
        server.stop()


@pytest.fixture
def serve_wsgi():
    """serve_wsgi(app) -> port: the app under werkzeug until the test ends."""
    serve, started = _serving(WsgiServer)
    yield serve
    for server in started:
        server.stop()
