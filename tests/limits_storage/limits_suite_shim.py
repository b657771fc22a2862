"""A pytest plugin that runs the `limits` project's own tests (its 5.8.0
source distribution, extracted under build/, never copied into this tree)
against a fastlimit server: it adds fastlimit to their storage parameters
and provides the fixture those parameters name, in place of their
conftest.py (which starts docker containers).  test_limits_suite.py runs
it with ``--noconftest -p limits_suite_shim -m fastlimit``.

The server is the one FASTLIMIT_LIMITS_URI names (``fastlimit://host:port``),
on the real clock: their tests sleep and compare with time.time().
"""

from __future__ import annotations

import os

import pytest
import redis
from pytest_lazy_fixtures import lf

import fastlimit.limits_storage as registers
from fastlimit.limits_storage import AsyncFastlimitStorage, FastlimitStorage

URI = os.environ["FASTLIMIT_LIMITS_URI"]
SYNC = pytest.param(URI, {}, lf("fastlimit"), marks=pytest.mark.fastlimit, id="fastlimit")
ASYNC = pytest.param(f"async+{URI}", {}, lf("fastlimit"), marks=pytest.mark.fastlimit,
                     id="fastlimit")
_added: set[int] = set()


def pytest_configure(config):
    import tests.utils as u

    assert registers     # the import registers the schemes
    # all_storage and the sliding window's parameters are views of these dicts
    u.ALL_STORAGES["fastlimit"] = SYNC
    u.ALL_STORAGES_ASYNC["fastlimit"] = ASYNC
    # the moving window's are lists made when tests.utils was imported
    u.moving_window_storage.mark.args[1].append(SYNC)
    u.async_moving_window_storage.mark.args[1].append(ASYNC)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    """test_storage.py's (sync and aio) own list of storages, with the class
    each URI must build."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names, values = mark.args[0], mark.args[1]
        if names != "uri, args, expected_instance, fixture" or id(values) in _added:
            continue
        _added.add(id(values))
        aio = "aio" in metafunc.module.__name__
        values.append(pytest.param(
            ASYNC.values[0] if aio else URI, {},
            AsyncFastlimitStorage if aio else FastlimitStorage, lf("fastlimit"),
            marks=pytest.mark.fastlimit, id="fastlimit"))


@pytest.fixture
def fastlimit():
    """As their redis_basic fixture: a client on an emptied server."""
    client = redis.Redis.from_url(URI.replace("fastlimit://", "redis://"))
    client.flushall()
    yield client
    client.close()
