"""The windowed counters (CL.FIXED, CL.MOVING, CL.SLIDING: the `limits`
library's strategies) carried as the buckets are, on real processes: a
replica gets them by its full copy and by the stream (and keeps them when
promoted), a restart from the snapshot keeps them, maxmemory counts and
evicts them (a standby following), DEBUG SWEEP drops the ended ones.
(A slot move keeps them: tests/cluster/test_reshard.py.)

Every server runs on a manual clock set to the same time, so a count on
one is compared with the other's by a read (amount 0) on each."""

from __future__ import annotations

import signal

import pytest
import redis
from servers import wait_caught_up
from wire import wait_until

T0 = 1_000_000
WINDOW = 60_000
LIMIT = 1_000
WAIT = 20.0


def clock(c, ms: int) -> None:
    c.execute_command("DEBUG", "CLOCK", "SET", ms)


def spend(c, prefix: str, keys: int = 20, runs: int = 40) -> None:
    """Every kind: fixed counters, sliding windows with a previous and a
    current count, moving-window logs of many runs (distinct times: their
    records move up size classes as they grow), all at T0 + runs."""
    pipe = c.pipeline(transaction=False)
    for i in range(keys):
        clock_at = T0 - WINDOW
        pipe.execute_command("DEBUG", "CLOCK", "SET", clock_at)
        pipe.execute_command("CL.SLIDING", f"{prefix}:s:{i}", LIMIT, WINDOW, i + 1)
    for t in range(runs):
        pipe.execute_command("DEBUG", "CLOCK", "SET", T0 + t)
        for i in range(keys):
            pipe.execute_command("CL.FIXED", f"{prefix}:f:{i}", WINDOW, i + 1)
            pipe.execute_command("CL.SLIDING", f"{prefix}:s:{i}", LIMIT, WINDOW, 1)
            if t <= i:       # logs of 1 to `runs` runs
                pipe.execute_command("CL.MOVING", f"{prefix}:m:{i}", LIMIT, WINDOW, 2)
    replies = pipe.execute()
    assert all(not isinstance(x, Exception) for x in replies)


def counts(c, prefix: str, at: int, keys: int = 20) -> list:
    """Every kind's read at `at` (amount 0: nothing written)."""
    clock(c, at)
    pipe = c.pipeline(transaction=False)
    for i in range(keys):
        pipe.execute_command("CL.FIXED", f"{prefix}:f:{i}", WINDOW, 0)
        pipe.execute_command("CL.SLIDING", f"{prefix}:s:{i}", LIMIT, WINDOW, 0)
        pipe.execute_command("CL.MOVING", f"{prefix}:m:{i}", LIMIT, WINDOW, 0)
    return pipe.execute()


# Times inside every window: a read past one's end would let the sweep drop
# it on one server and not (yet) on the other, and the clock goes back after.
AT = [T0 + 40, T0 + 41, T0 + 30_000, T0 + WINDOW - 1]


def all_counts(c, prefix: str) -> list:
    out = [counts(c, prefix, at) for at in AT]
    clock(c, T0 + 40)
    return out


def start_pair(make_server, *args):
    primary = make_server("--manual-clock", *args)
    p = primary.client()
    clock(p, T0)
    return primary, p


def attach_replica(make_server, primary, *args):
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port),
                          *args)
    r = replica.client()
    clock(r, T0 + 40)
    wait_until(lambda: r.info("replication").get("master_link_status") == "up", WAIT,
               "the replica's link to come up")
    return replica, r


# ---- replication ---------------------------------------------------------------------------

def test_a_replica_gets_the_windowed_counts_and_keeps_them_when_promoted(make_server):
    primary, p = start_pair(make_server)
    spend(p, "copy")                                  # before: the full copy carries them
    replica, r = attach_replica(make_server, primary)
    clock(p, T0 + 40)
    wait_until(lambda: r.info("memory")["windows_keys"] == p.info("memory")["windows_keys"],
               WAIT, "the full copy to load")
    assert p.info("memory")["windows_keys"] == 60
    assert all_counts(r, "copy") == all_counts(p, "copy")

    spend(p, "stream")                                # after: the stream carries them
    assert p.execute_command("CL.WINCLEAR", "copy:f:3", "copy:m:3", "copy:s:3") == 3
    assert p.execute_command("CL.WINFLUSH", "copy:m:1") == 11        # m:1, m:10..m:19
    wait_caught_up(p, r)
    for prefix in ("copy", "stream"):
        assert all_counts(r, prefix) == all_counts(p, prefix), prefix
    assert r.info("memory")["windows_keys"] == p.info("memory")["windows_keys"]
    assert r.execute_command("CL.FIXED", "copy:f:3", WINDOW, 0) == [0, T0 + 40]
    assert r.execute_command("CL.MOVING", "copy:m:15", LIMIT, WINDOW, 0) == [0, T0 + 40, 0]
    assert r.execute_command("CL.MOVING", "copy:m:2", LIMIT, WINDOW, 0) == [0, T0, 6]

    # a replica answers reads, refuses writes
    for cmd in (("CL.FIXED", "x", WINDOW), ("CL.MOVING", "x", 5, WINDOW, 1),
                ("CL.SLIDING", "x", 5, WINDOW, 2)):
        with pytest.raises(redis.ReadOnlyError):
            r.execute_command(*cmd)

    # failover: the promoted replica goes on from the same counts
    r.execute_command("REPLICAOF", "NO", "ONE")
    for c in (p, r):
        clock(c, T0 + 100)
        assert c.execute_command("CL.FIXED", "stream:f:4", WINDOW, 1) == [40 * 5 + 1,
                                                                          T0 + WINDOW]
        assert c.execute_command("CL.MOVING", "stream:m:19", 40, WINDOW, 1) == [0, T0, 40]
        # limits' sliding window: 20 + 40 from the previous window weighed by 60 s - 100 ms
        assert c.execute_command("CL.SLIDING", "stream:s:19", LIMIT, WINDOW, 0)[1:4] == [
            20, WINDOW - (T0 + 100) % WINDOW, 40]


def test_flushall_reaches_the_replica(make_server):
    primary, p = start_pair(make_server)
    replica, r = attach_replica(make_server, primary)
    clock(p, T0 + 40)
    spend(p, "f", keys=3, runs=3)
    wait_caught_up(p, r)
    assert r.info("memory")["windows_keys"] == 9
    # they are keys as DBSIZE and INFO keyspace count them (no bucket here)
    assert r.dbsize() == p.dbsize() == 9
    assert p.info("keyspace")["db0"]["keys"] == 9
    p.flushall()
    wait_caught_up(p, r)
    assert r.info("memory")["windows_keys"] == 0


# ---- snapshots ------------------------------------------------------------------------------

def test_a_restart_from_the_snapshot_keeps_the_windowed_counts(make_server, tmp_path):
    path = str(tmp_path / "s.snap")
    s = make_server("--manual-clock", "--snapshot-file", path)
    c = s.client()
    spend(c, "a")
    assert c.execute_command("SAVE") in (b"OK", True)
    expected = all_counts(c, "a")
    # kill -9: the counts can only come back from what SAVE wrote
    assert s.stop(signal.SIGKILL) == -signal.SIGKILL
    s.start()
    c = s.client()
    assert all_counts(c, "a") == expected
    assert "(and 60 windowed counters)" in s.log()

    # BGSAVE's child writes them too, and the save at SIGTERM
    spend(c, "b", keys=5, runs=5)
    assert c.execute_command("BGSAVE") in (b"Background saving started", True)
    wait_until(lambda: c.info("persistence")["rdb_bgsave_in_progress"] == 0, WAIT,
               "the BGSAVE to finish")
    c.execute_command("CL.WINCLEAR", "a:f:0")
    expected = all_counts(c, "a")
    assert s.stop(signal.SIGTERM) == 0
    s.start()
    c = s.client()
    assert all_counts(c, "a") == expected
    assert c.execute_command("CL.FIXED", "a:f:0", WINDOW, 0)[0] == 0
    assert c.info("memory")["windows_keys"] == 60 - 1 + 15


# ---- maxmemory -------------------------------------------------------------------------------

def flood_windows(c, prefix: str, n: int) -> None:
    pipe = c.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("CL.FIXED", f"{prefix}:{i}", WINDOW)
    pipe.execute()


@pytest.mark.volume
def test_maxmemory_counts_and_evicts_windowed_counters_and_a_standby_follows(make_server):
    primary, p = start_pair(make_server)
    replica, r = attach_replica(make_server, primary)
    clock(p, T0 + 40)
    flood_windows(p, "w", 20_000)
    memory = p.info("memory")
    assert memory["windows_keys"] == 20_000
    assert memory["used_memory_dataset"] >= memory["windows_memory_bytes"] > 20_000 * 20
    used = memory["used_memory_dataset"]

    # noeviction: a new windowed counter past the bound is refused as Redis words it
    p.config_set("maxmemory-policy", "noeviction")
    p.config_set("maxmemory", str(used))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        flood_windows(p, "more", 5_000)
    assert p.execute_command("CL.FIXED", "w:7", WINDOW) == [2, T0 + 40 + WINDOW]  # existing: fine

    # a lowered bound with a policy that evicts: the tables shrink to it
    p.config_set("maxmemory-policy", "allkeys-random")
    p.config_set("maxmemory", str(used // 2))
    wait_until(lambda: p.info("memory")["used_memory_dataset"] <= used // 2, WAIT,
               "the tables to come under the lowered bound")
    left = p.info("memory")["windows_keys"]
    assert left < 15_000 and p.info("stats")["evicted_keys"] >= 20_000 - left
    wait_caught_up(p, r)
    assert r.info("memory")["windows_keys"] == left     # it applied the evictions


# ---- DEBUG SWEEP ---------------------------------------------------------------------------

def test_debug_sweep_drops_ended_windows(r):
    clock(r, T0)
    flood_windows(r, "d", 3000)
    r.execute_command("CL.MOVING", "log", 5, 1000)
    r.execute_command("CL.SLIDING", "sliding", 5, 1000)
    # one read: the background sweep cannot run between these
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("DEBUG", "CLOCK", "SET", T0 + WINDOW + 1000)
    # a sweep goes on from where the last one (the background's) stopped, to
    # the tables' end: two of them go round once at least
    pipe.execute_command("DEBUG", "SWEEP", 10_000)
    pipe.execute_command("DEBUG", "SWEEP", 10_000)
    pipe.execute_command("INFO", "memory")
    pipe.execute_command("DEBUG", "CLOCK", "SET", T0)
    _, first, second, memory, _ = pipe.execute()
    removed, scanned = first[0] + second[0], first[1] + second[1]
    assert removed == 3002 and scanned >= 3002
    assert memory["windows_keys"] == 0
