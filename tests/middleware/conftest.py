"""Fixtures serving apps over real HTTP for the middleware tests (see httpkit)."""

from __future__ import annotations

import os
import sys

import pytest

# httpkit.py sits beside this file and tests/middleware is not a package:
# put it on sys.path so ``import httpkit`` works whatever pytest's import mode is.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from httpkit import AsgiServer, WsgiServer  # noqa: E402


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
