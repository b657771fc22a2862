"""Moving slots between shards (CL.CLUSTER MOVE: copy, pause, flip) on
real processes: two shards of a primary and a standby on the manual
clock, redis-py RedisCluster clients spending tokens on the moving keys
throughout, and a target killed in the middle of a move."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import redis
from cluster_rig import FastlimitCluster, info, wait_for

from fastlimit._cluster import keyslot

pytestmark = pytest.mark.untraced

RULES = {"rules": {"api": {"match": {"resource": "GET /a"}, "capacity": 3,
                           "refill_per_second": 1}}}
MOVING = range(100, 164)         # of shard fl-0 (0..8191)
CAPACITY = 1000                  # the load's buckets: never refilled (frozen clock)


@pytest.fixture
def cluster(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps(RULES))
    c = FastlimitCluster(str(tmp_path), 2, 1, "--rules-file", str(rules))
    for node in c.every_node:
        with node.client() as client:
            client.execute_command("DEBUG", "CLOCK", "SET", 1_000_000)
    yield c
    c.stop()


def tags_in(slots: range) -> list[bytes]:
    """One hash tag per slot of slots."""
    found: dict[int, bytes] = {}
    i = 0
    while len(found) < len(slots):
        tag = b"t%d" % i
        if keyslot(tag) in slots:
            found.setdefault(keyslot(tag), tag)
        i += 1
    return [found[s] for s in slots]


def keys_in(slots: range, per_slot: int, prefix: bytes = b"") -> list[bytes]:
    return [b"%s{%s}:%d" % (prefix, tag, i) for tag in tags_in(slots) for i in range(per_slot)]


def fill(node, keys: list[bytes], *args) -> list:
    out = []
    with node.client() as c:
        for start in range(0, len(keys), 5000):
            pipe = c.pipeline(transaction=False)
            for key in keys[start:start + 5000]:
                pipe.execute_command(*args[:1], key, *args[1:])
            out += pipe.execute()
    return out


def count_in(node, slots: range) -> int:
    with node.client() as c:
        return sum(c.execute_command("CLUSTER", "COUNTKEYSINSLOT", s) for s in slots)


def move(node, *args, timeout: float = 60):
    with node.client(socket_timeout=timeout) as c:
        return c.execute_command("CL.CLUSTER", "MOVE", *args)


def status(node) -> dict:
    with node.client() as c:
        reply = c.execute_command("CL.CLUSTER", "MOVESTATUS")
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    return {k.decode(): v.decode() if isinstance(v, bytes) else v for k, v in reply.items()}


class Spender(threading.Thread):
    """RedisCluster clients spending one token at a time on keys, counting
    the allowed ones per key, until told to stop (and bounded)."""

    def __init__(self, port: int, keys: list[bytes]):
        super().__init__(daemon=True)
        self.port, self.keys = port, keys
        self.allowed = {k: 0 for k in keys}
        self.requests = 0
        self.errors: list[Exception] = []
        self.stop_after: float | None = None

    def run(self) -> None:
        rc = redis.RedisCluster(host="127.0.0.1", port=self.port, socket_timeout=10)
        deadline = time.monotonic() + 60
        try:
            i = 0
            while time.monotonic() < deadline and (
                    self.stop_after is None or time.monotonic() < self.stop_after):
                key = self.keys[i % len(self.keys)]
                i += 1
                try:
                    if rc.execute_command("CL.CHECK", key, CAPACITY, 1)[0] == 1:
                        self.allowed[key] += 1
                    self.requests += 1
                except redis.RedisError as e:     # none expected: MOVED is followed
                    self.errors.append(e)
                    return
        finally:
            rc.close()


def test_a_reshard_under_load_loses_and_doubles_nothing(cluster):
    source, target = cluster.primaries
    exhausted = keys_in(MOVING, 2)
    assert all(r[0] == 1 for r in fill(source, exhausted, "CL.CHECK", 5, 1, "COST", 5))
    assert all(r[0] == 1 for r in fill(source, exhausted, "CL.LIMIT", "GET /a", "COST", 3))
    bulk = keys_in(MOVING, 400, b"bulk")               # so that the copy takes many batches
    fill(source, bulk, "CL.CHECK", 10, 1)
    before = count_in(source, MOVING)
    assert before == 2 * len(exhausted) + len(bulk)     # a CL.CHECK and a rule bucket each
    spent = keys_in(MOVING, 1, b"spent")[:32]
    spenders = [Spender(source.port, spent[i::2]) for i in range(2)]
    for s in spenders:
        s.start()
    wait_for(lambda: all(s.requests > 20 for s in spenders), "the load to start")

    final = move(source, f"{MOVING.start}-{MOVING.stop - 1}", "fl-1")
    final = {k.decode(): v for k, v in (final.items() if isinstance(final, dict)
                                        else zip(final[::2], final[1::2], strict=True))}
    done_at = time.monotonic()
    for s in spenders:
        s.stop_after = done_at + 0.5
        s.join(30)
    print(f"\nslots {MOVING.start}-{MOVING.stop - 1} moved: pause {final['pause_ms']} ms "
          f"(of which the map installs {final['flip_ms']} ms), "
          f"copy {final['copy_ms']} ms, {final['buckets']} buckets in {final['batches']} "
          f"batches, {final['changes']} changes, {final['waited']} clients waited; "
          f"{sum(s.requests for s in spenders)} requests under load")
    assert all(not s.errors and not s.is_alive() for s in spenders)
    assert final["buckets"] >= before and 0 <= float(final["pause_ms"]) < 1000
    assert final["waited"] >= 1     # delayed by the pause, then MOVED: never an error

    # Every token spent is spent on the new owner: allowed + remaining = capacity.
    allowed = {k: n for s in spenders for k, n in s.allowed.items()}
    with target.client() as t:
        for key, n in allowed.items():
            assert n > 0
            assert t.execute_command("CL.CHECK", key, CAPACITY, 1, "COST", 0)[2] == CAPACITY - n
        for key in exhausted:
            assert t.execute_command("CL.CHECK", key, 5, 1)[0] == 0
            assert t.execute_command("CL.LIMIT", key, "GET /a")[0] == 0
    # The source redirects, clients followed MOVED, every node has the map.
    with source.client() as c:
        with pytest.raises(redis.exceptions.MovedError,
                           match=f"^{MOVING.start} 127.0.0.1:{target.port}$"):
            c.execute_command("CL.CHECK", keys_in(range(MOVING.start, MOVING.start + 1), 1)[0],
                              5, 1)
    assert info(source, "errorstats").get("errorstat_MOVED", {}).get("count", 0) > 0
    for node in cluster.every_node:
        wait_for(lambda n=node: info(n, "cluster")["cluster_slot_map_version"] == 2,
                 "every node to take the new map")
        with node.client() as c:
            slots = c.execute_command("CLUSTER", "SLOTS")
        owner = next(e for e in slots if e[0] <= MOVING.start <= e[1])
        assert owner[2][1] == target.port
    # The target's standby has them through replication; the source forgets them.
    standby = cluster.nodes[1][1]
    wait_for(lambda: count_in(standby, MOVING) == count_in(target, MOVING) >= before,
             "the target's standby to have the moved buckets")
    wait_for(lambda: count_in(source, MOVING) == 0, "the source to delete the moved buckets")
    wait_for(lambda: status(source)["deleting"] == 0, "the deletion to be over")
    wait_for(lambda: count_in(cluster.nodes[0][1], MOVING) == 0,
             "the source's standby to forget them")


def test_a_target_that_dies_mid_move_leaves_the_map_and_every_bucket_untouched(cluster):
    source, target = cluster.primaries
    exhausted = keys_in(MOVING, 2)
    fill(source, exhausted, "CL.CHECK", 5, 1, "COST", 5)
    fill(source, keys_in(MOVING, 4000, b"bulk"), "CL.CHECK", 10, 1)
    before = count_in(source, MOVING)
    outcome: list = []
    mover = threading.Thread(target=lambda: outcome.append(_try_move(source)), daemon=True)
    mover.start()
    wait_for(lambda: status(source).get("batches", 0) >= 1, "the copy to begin", 30)
    target.stop(signal.SIGKILL)
    mover.join(60)
    assert isinstance(outcome[0], redis.ResponseError)
    assert "slot move abandoned, the map and every bucket untouched" in str(outcome[0])
    assert status(source)["state"] == "abandoned"
    with source.client() as c:
        assert c.execute_command("CL.CLUSTER", "VERSIONS")[0] == 1
        for key in exhausted:                      # served here still, and exhausted
            assert c.execute_command("CL.CHECK", key, 5, 1)[0] == 0
    assert count_in(source, MOVING) == before
    assert info(source, "cluster")["cluster_slot_map_version"] == 1


def _try_move(node):
    try:
        return move(node, f"{MOVING.start}-{MOVING.stop - 1}", "fl-1")
    except redis.RedisError as e:
        return e


@pytest.mark.parametrize("args, error", [
    (("100-200", "fl-9"), "no shard 'fl-9'"),
    (("100-200", "fl-0"), "already"),
    (("8000-8300", "fl-1"), "does not serve every slot"),
    (("200-100", "fl-1"), "start <= end"),
    (("x", "fl-1"), "is not"),
])
def test_a_move_that_cannot_be_made_is_refused_with_nothing_changed(cluster, args, error):
    source = cluster.primaries[0]
    with pytest.raises(redis.ResponseError, match=error):
        move(source, *args)
    assert info(source, "cluster")["cluster_slot_map_version"] == 1


def test_a_standby_neither_moves_nor_imports_slots_and_bad_data_is_refused(cluster):
    standby = cluster.nodes[0][1]
    with pytest.raises(redis.ResponseError, match="from the primary serving them"):
        move(standby, "100-200", "fl-1")
    with standby.client() as c, pytest.raises(redis.ResponseError, match="shard's primary"):
        c.execute_command("CL.CLUSTER", "IMPORT", b"x")
    with cluster.primaries[1].client() as c:
        with pytest.raises(redis.ResponseError, match="unusable slot data: not a fastlimit"):
            c.execute_command("CL.CLUSTER", "IMPORT", b"FLSNAP but not one")
        assert c.execute_command("DBSIZE") == 0


class WindowSpender(Spender):
    """Spender's load on the `limits` strategies' windowed counters: a
    moving-window log and a fixed-window counter per key, one entry at a
    time, counting what the log allowed."""

    def run(self) -> None:
        rc = redis.RedisCluster(host="127.0.0.1", port=self.port, socket_timeout=10)
        deadline = time.monotonic() + 60
        try:
            i = 0
            while time.monotonic() < deadline and (
                    self.stop_after is None or time.monotonic() < self.stop_after):
                key = self.keys[i % len(self.keys)]
                i += 1
                try:
                    rc.execute_command("CL.FIXED", b"f:" + key, 60_000)
                    if rc.execute_command("CL.MOVING", key, CAPACITY, 60_000)[0] == 1:
                        self.allowed[key] += 1
                    self.requests += 1
                except redis.RedisError as e:     # none expected: MOVED is followed
                    self.errors.append(e)
                    return
        finally:
            rc.close()


def test_a_reshard_carries_the_windowed_counters(cluster):
    source, target = cluster.primaries
    logs = keys_in(MOVING, 2, b"log")
    assert all(r[0] == 1 for r in fill(source, logs, "CL.MOVING", 5, 60_000, 5))
    counters = keys_in(MOVING, 2, b"fixed")
    assert all(r == [7, 1_060_000] for r in fill(source, counters, "CL.FIXED", 60_000, 7))
    sliding = keys_in(MOVING, 2, b"sliding")
    assert all(r[0] == 1 for r in fill(source, sliding, "CL.SLIDING", 9, 60_000, 4))
    bulk = keys_in(MOVING, 300, b"bulk")               # so that the copy takes many batches
    fill(source, bulk, "CL.FIXED", 60_000)
    before = count_in(source, MOVING)
    assert before == 3 * len(logs) + len(bulk)
    spent = keys_in(MOVING, 1, b"spent")[:16]
    spender = WindowSpender(source.port, spent)
    spender.start()
    wait_for(lambda: spender.requests > 20, "the load to start")

    final = move(source, f"{MOVING.start}-{MOVING.stop - 1}", "fl-1")
    final = {k.decode(): v for k, v in (final.items() if isinstance(final, dict)
                                        else zip(final[::2], final[1::2], strict=True))}
    spender.stop_after = time.monotonic() + 0.5
    spender.join(30)
    assert not spender.errors and not spender.is_alive()
    assert final["buckets"] >= before

    with target.client() as t:
        for key in logs:          # exhausted before the move, exhausted after
            assert t.execute_command("CL.MOVING", key, 5, 60_000) == [0, 1_000_000, 5]
        for key in counters:
            assert t.execute_command("CL.FIXED", key, 60_000, 0) == [7, 1_060_000]
        for key in sliding:
            assert t.execute_command("CL.SLIDING", key, 9, 60_000, 0)[3] == 4
        # every entry the load was allowed is in the new owner's log and counter
        for key, n in spender.allowed.items():
            assert n > 0
            assert t.execute_command("CL.MOVING", key, CAPACITY, 60_000, 0)[2] == n
            assert t.execute_command("CL.FIXED", b"f:" + key, 60_000, 0)[0] >= n
    standby = cluster.nodes[1][1]
    wait_for(lambda: count_in(standby, MOVING) == count_in(target, MOVING) >= before,
             "the target's standby to have the moved windowed counters")
    wait_for(lambda: count_in(source, MOVING) == 0, "the source to delete them")
    wait_for(lambda: count_in(cluster.nodes[0][1], MOVING) == 0,
             "the source's standby to forget them")
