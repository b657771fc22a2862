"""CL.FIXED, CL.MOVING, CL.SLIDING, CL.WINCLEAR and CL.WINFLUSH on a real
server at its manual clock, and the fastlimit:// storage answering as
limits' MemoryStorage does for the same calls at the same times."""

from __future__ import annotations

import random
import time
from unittest import mock

import pytest
import redis
from limits.errors import ConfigurationError, StorageError
from limits.storage import MemoryStorage, storage_from_string

import fastlimit.limits_storage  # noqa: F401  (registers the schemes)
from fastlimit.limits_storage.common import redis_url


def at(r, ms):
    r.execute_command("DEBUG", "CLOCK", "SET", ms)


def test_fixed_counts_past_the_limit_in_a_window_from_its_first_increment(r):
    at(r, 1500)
    assert r.execute_command("CL.FIXED", "k", 1000) == [1, 2500]
    at(r, 2000)
    assert r.execute_command("CL.FIXED", "k", 1000, 5) == [6, 2500]
    assert r.execute_command("CL.FIXED", "k", 1000, 0) == [6, 2500]      # a read
    at(r, 2500)
    assert r.execute_command("CL.FIXED", "k", 1000, 0) == [0, 2500]      # none: now
    assert r.execute_command("CL.FIXED", "k", 1000, 2) == [2, 3500]


def test_sliding_weighs_the_previous_aligned_window(r):
    at(r, 1500)
    assert r.execute_command("CL.SLIDING", "s", 10, 1000, 10) == [1, 0, 0, 10, 1500]
    assert r.execute_command("CL.SLIDING", "s", 10, 1000) == [0, 0, 0, 10, 1500]
    at(r, 2250)     # 10 * 750/1000 = 7.5, floored to 7: room for 3
    assert r.execute_command("CL.SLIDING", "s", 10, 1000, 3) == [1, 10, 750, 3, 1750]
    assert r.execute_command("CL.SLIDING", "s", 10, 1000, 1)[0] == 0
    at(r, 3999)
    assert r.execute_command("CL.SLIDING", "s", 10, 1000, 0) == [0, 3, 1, 0, 1001]


def test_moving_logs_runs_and_counts_the_window(r):
    assert r.execute_command("CL.MOVING", "m", 3, 1000, 2) == [1, 0, 2]
    at(r, 400)
    assert r.execute_command("CL.MOVING", "m", 3, 1000, 2) == [0, 0, 2]
    assert r.execute_command("CL.MOVING", "m", 3, 1000, 1) == [1, 0, 3]
    at(r, 1001)
    assert r.execute_command("CL.MOVING", "m", 3, 1000, 0) == [0, 400, 1]
    assert r.execute_command("CL.MOVING", "m", 3, 1000, 2) == [1, 400, 3]


def test_clear_flush_and_flushall(r):
    for key in ("LIMITS:a", "LIMITS:b", "other:c"):
        r.execute_command("CL.FIXED", key, 1000)
        r.execute_command("CL.MOVING", key, 5, 1000)
    assert r.execute_command("CL.WINCLEAR", "LIMITS:a", "nothing") == 2
    assert r.execute_command("CL.WINFLUSH", "LIMITS:") == 2
    assert r.execute_command("CL.FIXED", "other:c", 1000, 0)[0] == 1
    r.flushall()
    assert r.execute_command("CL.FIXED", "other:c", 1000, 0)[0] == 0


def test_idle_windows_are_swept(r):
    r.execute_command("CL.FIXED", "idle", 1000)
    r.execute_command("CL.SLIDING", "idle", 5, 1000)
    r.execute_command("CL.MOVING", "idle", 5, 1000)
    assert r.info("memory")["windows_keys"] == 3
    at(r, 10_000)
    # the server's sweep (server/expiry.py, every tick) takes them
    deadline = time.monotonic() + 5
    while r.info("memory")["windows_keys"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.info("memory")["windows_keys"] == 0


@pytest.mark.parametrize("command, error", [
    (["CL.FIXED", "k", 0], "window_ms must be an integer from 1 to 100000000000"),
    (["CL.FIXED", "k", "x"], "window_ms is not an integer or out of range"),
    (["CL.FIXED", "k", 10, -1], "amount must be an integer from 0 to 1000000000000000"),
    (["CL.FIXED", "k", 10, 1, 2], "wrong number of arguments for 'cl.fixed' command"),
    (["CL.MOVING", "k", 0, 10], "limit must be an integer from 1 to 1000000000000000"),
    (["CL.SLIDING", "k", 5], "wrong number of arguments for 'cl.sliding' command"),
    (["CL.WINFLUSH", ""], "prefix must not be empty"),
])
def test_bad_input_is_refused_with_the_reason(r, command, error):
    with pytest.raises(redis.ResponseError, match=error):
        r.execute_command(*command)


def test_keys_are_declared_for_cluster_routing(r):
    info = r.execute_command("COMMAND", "INFO", "CL.FIXED", "CL.MOVING", "CL.SLIDING",
                             "CL.WINCLEAR")
    keys = {name: [e["first_key_pos"], e["last_key_pos"], e["step_count"]]
            for name, e in info.items()}
    assert keys == {"cl.fixed": [1, 1, 1], "cl.moving": [1, 1, 1], "cl.sliding": [1, 1, 1],
                    "cl.winclear": [1, -1, 1]}


# ---- the storage, against limits' MemoryStorage at the same times ------------------

def same_calls(storage, memory, r, seed):
    """Random calls of every storage method at random times, both storages
    at the same time (the server's manual clock, MemoryStorage's time.time)."""
    rng = random.Random(seed)
    now = 1_000_000
    history = []
    for _ in range(400):
        now += rng.choice([0, 0, 1, 7, 100, 333, 999, 1000, 2500])
        at(r, now)
        key = rng.choice(["a", "b"])
        p = rng.randrange(3)     # limits' keys name their limit and window: one per key
        limit, expiry, amount = [(3, 1, 1), (5, 2, 2), (1000, 1, 400)][p]
        op = rng.randrange(7)
        with mock.patch("time.time", return_value=now / 1000):
            calls = [
                lambda s: s.incr(key, expiry, amount),
                lambda s: (s.get(key), s.get_expiry(key)),
                lambda s: s.acquire_entry(key, limit, expiry, amount),
                lambda s: s.get_moving_window(key, limit, expiry),
                lambda s: s.acquire_sliding_window_entry(key, limit, expiry, amount),
                lambda s: s.get_sliding_window(key, expiry),
                lambda s: s.clear(key),
            ]
            # the moving window and the counters share keys in neither storage
            k = f"{op // 2}:{key}:{p}" if op < 6 else key
            calls[6] = lambda s: [
                s.clear_sliding_window(f"{i}:{key}:{j}", [1, 2, 1][j]) if i == 2
                else s.clear(f"{i}:{key}:{j}") for i in range(3) for j in range(3)]
            key = k
            # what MemoryStorage's timer does every 10 ms of real time
            memory._MemoryStorage__expire_events()
            expected = calls[op](memory)
            got = calls[op](storage)
        history.append((op, now, key, expected, got))
        assert got == pytest.approx(expected, abs=1e-9), [h for h in history if h[2] == key]


@pytest.mark.parametrize("seed", range(3))
def test_the_storage_answers_as_memory_storage(r, server, seed):
    storage = storage_from_string(f"fastlimit://127.0.0.1:{server.port}")
    memory = MemoryStorage()
    # its timer thread would expire entries at the real time between the
    # patched calls: same_calls runs its expiry at the patched time instead
    memory.timer.cancel()
    memory._MemoryStorage__schedule_expiry = lambda: None
    try:
        same_calls(storage, memory, r, seed)
    finally:
        memory.timer.cancel()
        storage.client.close()


def test_uris():
    assert redis_url("fastlimit://h") == "redis://h:6380"
    assert redis_url("async+fastlimits://:pw@h:7000/0") == "rediss://:pw@h:7000/0"
    assert redis_url("fastlimit+unix:///tmp/s.sock") == "unix:///tmp/s.sock"
    with pytest.raises(ConfigurationError, match="no host"):
        storage_from_string("fastlimit://")
    with pytest.raises(ConfigurationError, match="service_name"):
        storage_from_string("fastlimit+sentinel://h:1")


def test_a_server_down_is_a_storage_error_when_wrapped(make_server):
    s = make_server()
    port = s.port
    s.stop()
    storage = storage_from_string(f"fastlimit://127.0.0.1:{port}", wrap_exceptions=True,
                                  socket_connect_timeout=1)
    assert storage.check() is False
    with pytest.raises(StorageError):
        storage.incr("k", 1)
    raw = storage_from_string(f"fastlimit://127.0.0.1:{port}", socket_connect_timeout=1)
    with pytest.raises(redis.ConnectionError):
        raw.acquire_entry("k", 5, 1)
