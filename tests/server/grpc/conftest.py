"""Fixtures for the tests of server/grpc/: real servers with the gRPC
front on (tests/support/grpcserver.py)."""

from __future__ import annotations

import pytest
from grpcserver import RIG_YAML, GrpcServer
from servers import started_servers


@pytest.fixture
def make_grpc_server():
    with started_servers(GrpcServer) as make:
        yield make


@pytest.fixture
def gs(make_grpc_server) -> GrpcServer:
    """Manual clock at 0, the stand-in decision with api_key 3/minute."""
    srv = make_grpc_server("--manual-clock", rls=RIG_YAML)
    srv.client().execute_command("DEBUG", "CLOCK", "SET", "0")
    return srv
