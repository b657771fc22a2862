"""maxmemory between real processes: noeviction's -OOM as redis-server
words it, the default policy keeping exhausted buckets through a flood of
new keys, the INFO figures, the bound lowered at runtime, and a standby
that drops what its primary evicted.  Manual clocks: nothing expires by
itself, so only eviction makes room."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import pytest
import redis
from servers import wait_caught_up
from wire import Wire, command, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import keyflood  # noqa: E402  (bench/ is not a package)

OOM = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
T0 = 1_000_000
MB = 1024**2
# A check that spends one token of ten (a refill of one a second): a
# bucket one second from full, what a flood of new keys leaves behind.
FLOOD_CHECK = (10, 1)
WAIT = 20.0


def flood(port: int, prefix: str, n: int, chunk: int = 5000,
          cmd: tuple = ("CL.CHECK", "{key}", *FLOOD_CHECK)) -> None:
    """n new keys, pipelined in chunks; every reply read (and not an error)."""
    with Wire.to(port) as w:
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            w.send(b"".join(command(*(str(a).format(key=f"{prefix}:{i}") for a in cmd))
                            for i in range(start, start + count)))
            for _ in range(count):
                reply = w.read_reply()
                assert reply.startswith(b"*5"), reply


def exhaust(c, keys) -> None:
    pipe = c.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("CL.CHECK", k, 10, 1, "COST", 10)
    assert all(reply[0] == 1 for reply in pipe.execute())


def still_exhausted(c, keys) -> int:
    """How many of keys answer denied (their bucket kept, still empty)."""
    pipe = c.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("CL.CHECK", k, 10, 1)
    return sum(reply[0] == 0 for reply in pipe.execute())


def started(make_server, *args):
    srv = make_server("--manual-clock", *args)
    c = srv.client()
    c.execute_command("DEBUG", "CLOCK", "SET", T0)
    return srv, c


# ---- noeviction ------------------------------------------------------------------------

def test_noeviction_refuses_new_buckets_with_redis_text(make_server, redis_server):
    rc = redis_server.client()
    rc.config_set("maxmemory-policy", "noeviction")
    rc.config_set("maxmemory", "1")
    try:
        with Wire.to(redis_server.port) as w:
            redis_reply = w.call("SET", "k", "v")
    finally:
        rc.config_set("maxmemory", "0")
    assert redis_reply == OOM

    srv, c = started(make_server, "--maxmemory-policy", "noeviction")
    c.execute_command("CL.CHECK", "old", 10, 1)
    c.execute_command("CL.RULE", "SET", "r", json.dumps(
        {"match": {"resource": "GET /x"}, "algorithm": "token_bucket", "capacity": 5,
         "refill_per_second": 1}))
    c.execute_command("CL.LIMIT", "old-client", "GET /x")
    c.config_set("maxmemory", "1")
    with Wire.to(srv.port) as w:
        assert w.call("CL.CHECK", "new", 10, 1) == OOM
        assert w.call("CL.LIMIT", "new-client", "GET /x") == OOM
        assert w.call("CL.THROTTLE", "new", 5, 10, 60) == OOM
        # buckets that exist are still checked, and a peek adds nothing
        assert w.call("CL.CHECK", "old", 10, 1).startswith(b"*5\r\n:1\r\n:10\r\n:8\r\n")
        assert w.call("CL.LIMIT", "old-client", "GET /x").startswith(b"*5\r\n:1\r\n:5\r\n:3\r\n")
        assert w.call("CL.CHECK", "new", 10, 1, "COST", 0).startswith(b"*5\r\n:1\r\n")
    assert c.dbsize() == 2
    assert c.info("stats")["evicted_keys"] == 0
    assert c.info("errorstats")["errorstat_OOM"]["count"] == 3
    c.config_set("maxmemory", "0")
    assert c.execute_command("CL.CHECK", "new", 10, 1)[0] == 1


# ---- the default policy under a flood -----------------------------------------------------

@pytest.mark.volume
def test_flood_of_new_keys_evicts_them_and_keeps_the_exhausted(make_server):
    srv, c = started(make_server, "--maxmemory", "1mb")
    assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "nearest-full"}
    victims = [f"real:{i}" for i in range(100)]
    exhaust(c, victims)
    flood(srv.port, "attack", 60_000)      # about 4 times what 1mb holds
    info = c.info()
    assert info["used_memory_dataset"] <= MB
    assert 8_000 < c.dbsize() < 25_000
    assert info["evicted_keys"] == 60_100 - c.dbsize()
    assert still_exhausted(c, victims) == 100


# A flood's limits against victims exhausted under 5 a minute (as logins
# are): a slower refill (a daily quota: each new key full again only after
# 86 s, later than the victims), a faster one and theirs.
LOGIN = (5, 5, "PERIOD", 60_000)
FLOODS = {"slower": (1000, 1000, "PERIOD", 86_400_000), "faster": (10, 10), "equal": LOGIN}


def rule_json(resource: str, capacity: int, refill: int, *period) -> str:
    """The token-bucket rule of a CL.CHECK's numbers."""
    spec = {"match": {"resource": resource}, "capacity": capacity}
    spec.update({"refill": refill, "period_ms": period[1]} if period
                else {"refill_per_second": refill})
    return json.dumps(spec)


def victims_reset(c, keys, cmd) -> int:
    """How many victims' buckets are full again (peeks: nothing spent)."""
    pipe = c.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command(*(str(a).format(key=k) for a in cmd), "COST", 0)
    return sum(reply[2] != 0 for reply in pipe.execute())


@pytest.mark.parametrize("kind", FLOODS)
def test_no_flood_of_any_refill_resets_exhausted_buckets(make_server, kind):
    # Regression (finding 5): nearest-full evicted the bucket soonest full,
    # so a daily quota's new keys outlasted exhausted per-minute buckets
    # and every one of those was reset.  The clock stands still: only
    # eviction makes room (tests/test_core_bound.py moves it).
    srv, c = started(make_server, "--maxmemory", "512kb")
    check = ("CL.CHECK", "{key}", *LOGIN)
    victims = [f"login:{i}" for i in range(100)]
    pipe = c.pipeline(transaction=False)
    for k in victims:
        pipe.execute_command(*(str(a).format(key=k) for a in check), "COST", 5)
    assert all(reply[0] == 1 for reply in pipe.execute())
    flood(srv.port, "q", 15_000, cmd=("CL.CHECK", "{key}", *FLOODS[kind]))
    assert c.info("stats")["evicted_keys"] > 3_000
    assert victims_reset(c, victims, check) == 0


@pytest.mark.parametrize("kind", FLOODS)
def test_no_flood_of_any_refill_resets_exhausted_rule_buckets(make_server, kind):
    # The same for CL.LIMIT: a rule's buckets ranked by the rule's numbers.
    srv, c = started(make_server, "--maxmemory", "512kb")
    c.execute_command("CL.RULE", "SET", "login", rule_json("POST /login", *LOGIN))
    c.execute_command("CL.RULE", "SET", "quota", rule_json("GET /api", *FLOODS[kind]))
    victims = [f"user:{i}" for i in range(100)]
    pipe = c.pipeline(transaction=False)
    for k in victims:
        pipe.execute_command("CL.LIMIT", k, "POST /login", "COST", 5)
    assert all(reply[0] == 1 for reply in pipe.execute())
    flood(srv.port, "q", 15_000, cmd=("CL.LIMIT", "{key}", "GET /api"))
    assert c.info("stats")["evicted_keys"] > 3_000
    assert victims_reset(c, victims, ("CL.LIMIT", "{key}", "POST /login")) == 0


@pytest.mark.release_only
def test_keyflood_slow_refill_run_resets_no_victim(tmp_path):
    # bench/keyflood.py's closing-note figure, briefly (real time: the
    # victims get a token back only after 2 minutes).
    args = argparse.Namespace(redis_benchmark=shutil.which("redis-benchmark"), pipeline=16,
                              unbounded_cap=0)
    run = keyflood.flood_one(args, tmp_path, "slow refill", 2 * MB, 3.0,
                             keyflood.SLOW_FLOOD, keyflood.LOGIN)
    assert run.samples[-1].evicted > 1000, keyflood.report([run], args)
    assert run.reset == 0 and run.denied == run.answers > 0, keyflood.report([run], args)


@pytest.mark.volume
def test_random_eviction_loses_exhausted_keys_the_default_keeps(make_server):
    # The same flood under allkeys-random forgets most of them: the default
    # keeps them because of the choice it makes, not by luck.
    srv, c = started(make_server, "--maxmemory", "1mb", "--maxmemory-policy",
                     "allkeys-random")
    victims = [f"real:{i}" for i in range(100)]
    exhaust(c, victims)
    flood(srv.port, "attack", 60_000)
    assert c.info()["used_memory_dataset"] <= MB
    assert still_exhausted(c, victims) < 50


# ---- INFO and CONFIG ---------------------------------------------------------------------------

def test_info_memory_and_config(make_server):
    srv, c = started(make_server, "--maxmemory", "3mb", "--maxmemory-samples", "7")
    exhaust(c, ["a", "b"])
    mem = c.info("memory")
    assert mem["maxmemory"] == 3 * MB and mem["maxmemory_human"] == "3.00M"
    assert mem["maxmemory_policy"] == "nearest-full"
    assert mem["used_memory"] == mem["used_memory_dataset"] + mem["mem_not_counted_for_evict"]
    assert 0 < mem["used_memory_dataset"] <= mem["used_memory"] <= mem["used_memory_peak"]
    assert mem["used_memory_rss"] > mem["used_memory"]
    assert mem["mem_fragmentation_ratio"] == pytest.approx(
        mem["used_memory_rss"] / mem["used_memory"], rel=0.2)
    assert c.info("stats")["evicted_keys"] == 0
    assert c.config_get("maxmemory*") == {"maxmemory": str(3 * MB),
                                           "maxmemory-policy": "nearest-full",
                                           "maxmemory-samples": "7"}
    c.config_set("maxmemory", "1gb")
    c.config_set("maxmemory-policy", "volatile-ttl")     # Redis's name for the same order
    assert c.info("memory")["maxmemory_human"] == "1.00G"
    with pytest.raises(redis.ResponseError) as e:
        c.config_set("maxmemory-policy", "allkeys-lru")
    assert str(e.value) == (
        "CONFIG SET failed (possibly related to argument 'maxmemory-policy') - argument(s) "
        "must be one of the following: nearest-full, volatile-ttl, allkeys-random, "
        "volatile-random, noeviction")
    with pytest.raises(redis.ResponseError, match="argument must be a memory value"):
        c.config_set("maxmemory", "lots")
    with pytest.raises(redis.ResponseError, match="between 1 and 64"):
        c.config_set("maxmemory-samples", "0")
    assert c.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-ttl"}


def test_config_file_sets_the_bound(make_server, tmp_path):
    path = tmp_path / "fastlimit.toml"
    path.write_text('maxmemory = "5mb"\nmaxmemory-policy = "noeviction"\n')
    srv = make_server("--config", str(path))
    c = srv.client()
    assert c.config_get("maxmemory") == {"maxmemory": str(5 * MB)}
    assert c.info("memory")["maxmemory_policy"] == "noeviction"


@pytest.mark.volume
def test_lowering_maxmemory_evicts_down_to_it(make_server):
    # A small flood: the ticks' eviction is bounded in time, and the debug
    # pass's line tracing makes each eviction some 30 times dearer (60,000
    # keys took it 19 s of the 20 s wait).
    srv, c = started(make_server)
    victims = [f"real:{i}" for i in range(100)]
    exhaust(c, victims)
    flood(srv.port, "before", 15_000)
    assert c.info("memory")["used_memory_dataset"] > 700 * 1024     # ~47 bytes a key
    c.config_set("maxmemory", "512kb")      # the ticks evict, no command needed
    wait_until(lambda: c.info("memory")["used_memory_dataset"] <= 512 * 1024, WAIT,
               "the tables never came down to the lowered bound")
    assert still_exhausted(c, victims) == 100
    assert c.info("stats")["evicted_keys"] > 5_000


# ---- replication ---------------------------------------------------------------------------------

@pytest.mark.volume
def test_standby_drops_the_buckets_its_primary_evicted(make_server):
    primary, p = started(make_server, "--maxmemory", "1mb")
    replica, r = started(make_server, "--replicaof", "127.0.0.1", str(primary.port),
                         "--maxmemory", "1mb")
    wait_until(lambda: r.info("replication").get("master_link_status") == "up", WAIT,
               "replica link never came up")
    victims = [f"real:{i}" for i in range(100)]
    exhaust(p, victims)
    flood(primary.port, "attack", 60_000)

    wait_caught_up(p, r)
    assert p.info("stats")["evicted_keys"] > 30_000
    assert r.info("stats")["evicted_keys"] == 0       # it follows, it does not choose
    assert r.dbsize() == p.dbsize()
    sample = victims + [f"attack:{i}" for i in range(0, 60_000, 97)]

    def peeks(c):
        pipe = c.pipeline(transaction=False)
        for k in sample:
            pipe.execute_command("CL.CHECK", k, *FLOOD_CHECK, "COST", 0)
        return pipe.execute()
    assert peeks(r) == peeks(p)
    assert all(x[2] == 0 for x in peeks(r)[:100])      # the exhausted kept on both


@pytest.mark.untraced
def test_a_snapshot_larger_than_the_bound_loads_whole_then_is_evicted(make_server, tmp_path):
    snap = str(tmp_path / "big.snap")
    srv, c = started(make_server, "--snapshot-file", snap)
    victims = [f"real:{i}" for i in range(100)]
    exhaust(c, victims)
    flood(srv.port, "before", 60_000)
    c.execute_command("SAVE")
    srv.stop()
    srv, c = started(make_server, "--snapshot-file", snap, "--maxmemory", "1mb")
    wait_until(lambda: c.info("memory")["used_memory_dataset"] <= MB, WAIT,
               "the loaded tables never came down to the bound")
    assert c.info("stats")["evicted_keys"] > 30_000
    assert still_exhausted(c, victims) == 100
