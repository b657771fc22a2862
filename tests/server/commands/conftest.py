"""Fixtures for the tests of the commands (server/commands/): a raw
connection to the shared manual-clock server, and the port of fastlimit
or of a real redis-server for the tests that run on both."""

from __future__ import annotations

import pytest
from resp_values import Raw


@pytest.fixture
def raw(server, r):
    """A raw connection to the flushed manual-clock server (clock 0)."""
    with Raw.to(server.port) as conn:
        yield conn


@pytest.fixture(params=["fastlimit", "redis"])
def port(request, server, redis_server):
    return server.port if request.param == "fastlimit" else redis_server.port
