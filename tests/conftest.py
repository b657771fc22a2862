"""Shared fixtures: real fastlimit server processes and a real
redis-server (see tests/servers.py), started on free loopback ports and
talked to over sockets.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

# tests/wire.py (RESP encoding and reply framing by hand) is shared by the
# tests here and in tests/server/, which are not packages: put tests/ on
# sys.path so ``import wire`` works whatever pytest's import mode is.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from servers import RedisServerProcess, ServerProcess  # noqa: E402  (needs the path above)


@pytest.fixture(scope="session")
def server():
    """One manual-clock server shared by the tests that reset it (see r)."""
    with ServerProcess("--manual-clock") as s:
        yield s
    assert s.proc.returncode in (0, -signal.SIGTERM), s.log()


@pytest.fixture
def r(server):
    """A RESP2 redis-py client on a flushed server with the clock at 0."""
    client = server.client(protocol=2)
    client.flushall()
    client.execute_command("DEBUG", "CLOCK", "SET", 0)
    yield client
    client.close()
    assert server.alive(), server.log()


@pytest.fixture
def make_server():
    """Starts extra servers with their own settings; stops them after."""
    started = []

    def start(*args: str) -> ServerProcess:
        s = ServerProcess(*args).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def redis_server():
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (make test installs it)")
    s = RedisServerProcess()
    yield s
    s.stop()
