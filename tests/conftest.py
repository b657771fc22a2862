"""Shared fixtures: real fastlimit server processes and a real
redis-server (see tests/support/servers.py), started on free loopback
ports and talked to over sockets.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest
import servers
from http_server import HttpServer
from postgres import PostgresServer
from servers import RedisServerProcess, ServerProcess, started_servers

# ---- coverage ------------------------------------------------------------------------------
# The debug pass of scripts/test.sh runs under `coverage run`.  Line tracing
# makes the Cython hot path some 30 times slower, so the tests that bound CPU
# time or latency are marked `untraced` where they are written (`pytestmark`
# for a whole file), and the tests that exist to push volume (hundreds of
# thousands of operations) `volume`: both run untraced, in this process and
# in the servers they start.  What they test is unchanged, and the paths
# they take smaller tests take too.  The untraced ones run alone on the
# release build; the volume ones run in both passes beside other tests, so
# the debug build's checks (bounds, the tables' invariants) see their volume.


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "untraced: runs without coverage's line tracing, alone (it bounds time)")
    config.addinivalue_line(
        "markers", "volume: runs without coverage's line tracing, beside other tests, on both "
        "builds (it pushes volume: the debug build's checks run, the lines are others' too)")


def pytest_collection_modifyitems(items):
    # The tests that bound CPU time or latency (the untraced ones) and the
    # real-time failovers must not share the cores with other tests:
    # scripts/test.sh runs them alone, after the parallel part.
    for item in items:
        if item.get_closest_marker("untraced") or item.get_closest_marker("release_only"):
            item.add_marker("serial")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Notes a failed test on its item, for fixtures that print their
    processes' logs only then (servers.failed)."""
    report = yield
    if report.failed:
        item.stash[servers.FAILED] = True
    return report


def _running_coverage():
    """The Coverage measuring this process, if any."""
    try:
        import coverage
    except ImportError:
        return None
    return coverage.Coverage.current()


@pytest.fixture(autouse=True)
def _untraced(request):
    """Pauses coverage for an untraced or volume test; autouse fixtures come first,
    so the servers the test starts see servers.TRACED cleared."""
    marked = request.node.get_closest_marker("untraced") or request.node.get_closest_marker("volume")
    cov = _running_coverage() if marked else None
    if cov is None:
        yield
        return
    cov.stop()
    servers.TRACED = False
    try:
        yield
    finally:
        servers.TRACED = True
        cov.start()



@pytest.fixture(scope="session", autouse=True)
def _temp_dir_under_pytests(tmp_path_factory):
    """The temporary files of the whole run go under pytest's basetemp
    (which pytest prunes to its last runs), none into the system's temp
    dir: the tests' own (tempfile) and their children's (TMPDIR: the
    servers, redis-server, chromium, the bench scripts).  First of the
    session fixtures (autouse), so every process the tests start sees it."""
    tmp = str(tmp_path_factory.mktemp("tmp", numbered=False))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = tmp
    yield tmp
    if saved[0] is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


@pytest.fixture(scope="session")
def shared_servers():
    """The manual-clock servers shared by the tests that reset them (see
    r): one traced, and, started when first needed, one untraced for the
    untraced tests (marked `untraced`)."""
    started: dict[bool, ServerProcess] = {}

    def get() -> ServerProcess:
        if servers.TRACED not in started:
            started[servers.TRACED] = ServerProcess("--manual-clock").start()
        return started[servers.TRACED]

    yield get
    for s in started.values():
        assert s.stop() in (0, -signal.SIGTERM), s.log()


@pytest.fixture
def server(shared_servers):
    """One manual-clock server shared by the tests that reset it (see r)."""
    return shared_servers()


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
    with started_servers(ServerProcess) as make:
        yield make


@pytest.fixture
def make_http_server():
    """Servers with the HTTP front on a free port (tests/support/http_server.py)."""
    with started_servers(HttpServer) as make:
        yield make


@pytest.fixture
def hs(make_http_server) -> HttpServer:
    """The default: manual clock, no password, the HTTP front on."""
    return make_http_server("--manual-clock")


@pytest.fixture(scope="session")
def redis_server():
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (make test installs it)")
    s = RedisServerProcess()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def pg():
    """One real PostgreSQL per test process (tests/support/postgres.py);
    each test that needs one takes a database of its own."""
    s = PostgresServer().start()
    yield s
    s.remove()


@pytest.fixture(params=["sqlite", "postgresql"])
def rules_store(request) -> list[str]:
    """The arguments of a rules-store, for the rules tests that run against
    both: none (the SQLite rules-db), or --rules-store with a fresh
    database of the session's PostgreSQL, which every node the test
    starts shares, as a fleet does."""
    if request.param == "sqlite":
        return []
    return ["--rules-store", request.getfixturevalue("pg").create_database()]
