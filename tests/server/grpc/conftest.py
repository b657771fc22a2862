"""Fixtures for the tests of server/grpc/: real servers with the gRPC
front on (grpcserver.py)."""

from __future__ import annotations

import pytest
from grpcserver import GrpcServer


@pytest.fixture
def make_grpc_server():
    started: list[GrpcServer] = []

    def make(*args: str, standin_rules=None) -> GrpcServer:
        srv = GrpcServer(*args, standin_rules=standin_rules).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture
def gs(make_grpc_server) -> GrpcServer:
    """Manual clock at 0, the stand-in decision with api_key 3/minute."""
    srv = make_grpc_server("--manual-clock", standin_rules=["api_key=3/minute"])
    srv.client().execute_command("DEBUG", "CLOCK", "SET", "0")
    return srv
