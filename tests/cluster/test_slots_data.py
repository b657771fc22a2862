"""Buckets by hash slot: CLUSTER COUNTKEYSINSLOT and GETKEYSINSLOT on a
real one-shard cluster node against known keys (errors byte for byte with
a cluster-enabled redis-server), and the engine's export, import and
deletion of the buckets of a set of slots, resumable under a budget."""

from __future__ import annotations

import json

import pytest
import redis
from cluster_rig import FastlimitCluster

from fastlimit._cluster import keyslot
from fastlimit._core import BucketStore, Clock, SlotCursor, SlotKeys
from fastlimit._rules import RuleEngine
from fastlimit.server import snapshot

pytestmark = pytest.mark.untraced

RULES = {"rules": {
    "per-client": {"match": {"resource": "GET /a"}, "capacity": 3, "refill_per_second": 1},
    "per-resource": {"match": {"resource": "GET /b"}, "capacity": 2, "refill_per_second": 1,
                     "key": "client+resource"}}}


def raw(port: int, *args):
    conn = redis.Connection(host="127.0.0.1", port=port, socket_timeout=10)
    try:
        conn.send_command(*args)
        return conn.read_response()
    except redis.ResponseError as e:
        return ("error", str(e))
    finally:
        conn.disconnect()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("slots-data")
    rules = root / "rules.json"
    rules.write_text(json.dumps(RULES))
    cluster = FastlimitCluster(str(root), 1, 0, "--rules-file", str(rules))
    yield cluster.primaries[0]
    cluster.stop()


# Keys sharing slots (hash tags), a client key with a NUL byte and one
# that looks like a composed key's tail.
CHECK_KEYS = [b"{u1}:a", b"{u1}:b", b"plain", b"n\x00ul"]
CLIENT_KEYS = [b"{u1}:c", b"n\x00ul", b"{u2}", b"x\x00GET /b"]


def test_count_and_keys_of_a_slot_are_the_buckets_written_there(node):
    port = node.port
    for key in CHECK_KEYS:
        assert raw(port, "CL.CHECK", key, 5, 1)[0] == 1
    for key in CLIENT_KEYS:
        assert raw(port, "CL.LIMIT", key, "GET /a")[0] == 1
        assert raw(port, "CL.LIMIT", key, "GET /b")[0] == 1
    buckets: dict[int, int] = {}
    keys: dict[int, set] = {}
    for key in CHECK_KEYS:
        buckets[keyslot(key)] = buckets.get(keyslot(key), 0) + 1
        keys.setdefault(keyslot(key), set()).add(key)
    for key in CLIENT_KEYS:     # two rule buckets, one key
        buckets[keyslot(key)] = buckets.get(keyslot(key), 0) + 2
        keys.setdefault(keyslot(key), set()).add(key)
    for slot, n in buckets.items():
        assert raw(port, "CLUSTER", "COUNTKEYSINSLOT", slot) == n
        found = raw(port, "CLUSTER", "GETKEYSINSLOT", slot, 100)
        assert len(found) == len(set(found)) and set(found) == keys[slot]
        assert len(raw(port, "CLUSTER", "GETKEYSINSLOT", slot, 1)) == 1
        assert raw(port, "CLUSTER", "GETKEYSINSLOT", slot, 0) == []
    empty = next(s for s in range(16384) if s not in buckets)
    assert raw(port, "CLUSTER", "COUNTKEYSINSLOT", empty) == 0
    assert raw(port, "CLUSTER", "GETKEYSINSLOT", empty, 10) == []


@pytest.mark.parametrize("args", [
    ("COUNTKEYSINSLOT", -1), ("COUNTKEYSINSLOT", 16384), ("COUNTKEYSINSLOT", "x"),
    ("COUNTKEYSINSLOT", "99999999999999999999"), ("COUNTKEYSINSLOT",),
    ("COUNTKEYSINSLOT", 1, 2), ("GETKEYSINSLOT", 0, -1), ("GETKEYSINSLOT", -1, 1),
    ("GETKEYSINSLOT", 16384, 1), ("GETKEYSINSLOT", "x", 1), ("GETKEYSINSLOT", 0, "x"),
    ("GETKEYSINSLOT", 0), ("GETKEYSINSLOT", 0, 1, 2)])
def test_slot_key_commands_refuse_bad_input_as_redis_does(node, redis_cluster_node, args):
    assert raw(node.port, "CLUSTER", *args) == raw(redis_cluster_node.port, "CLUSTER", *args)


# ---- export, import, deletion (the engine, in process) ------------------------------

def engine_with_rules(clock) -> RuleEngine:
    engine = RuleEngine(clock=clock, shards=4)
    engine.define(0, {"algorithm": "token_bucket", "scope": "client", "capacity": 3,
                      "refill": 1})
    engine.define(1, {"algorithm": "token_bucket", "scope": "client+resource",
                      "capacity": 2, "refill": 1})
    return engine


def mask_of(slots) -> bytes:
    mask = bytearray(16384)
    for s in slots:
        mask[s] = 1
    return bytes(mask)


def export_all(table, mask: bytes, **budget) -> tuple[list, int]:
    cursor = SlotCursor(mask)
    sections, steps = [], 0
    while not cursor.done:
        sections += table.export_slots(cursor, **budget)
        steps += 1
    return sections, steps


def load(sections, store, engine) -> None:
    parsed = snapshot.parse_sections(memoryview(b"".join(sections)))
    snapshot.load_sections(parsed, store, engine, [0, 1], deletes=True)


KEYS = [b"k%d" % i for i in range(3000)]


def test_exported_buckets_load_with_their_state_exhausted_stays_exhausted():
    clock = Clock(manual=True, start_ms=10_000)
    store, engine = BucketStore(shards=4, clock=clock), engine_with_rules(clock)
    for key in KEYS:
        store.check(key, 5, 1, 5)                   # exhausted
        engine.apply([0, 1], key, 2, b"GET /b")     # 1 and 0 left
    moving = {keyslot(k) for k in KEYS[::3]}
    mask = mask_of(moving)
    store_sections, steps = export_all(store, mask, budget_ms=1.0, max_bytes=2000)
    engine_sections, _ = export_all(engine, mask, budget_ms=1.0, max_bytes=2000)
    assert steps > 10        # resumed, not redone: a byte budget per step
    target_store, target_engine = BucketStore(shards=4, clock=clock), engine_with_rules(clock)
    load(store_sections + engine_sections, target_store, target_engine)
    inside = [k for k in KEYS if keyslot(k) in moving]
    assert len(target_store) == len(inside) and len(target_engine) == 2 * len(inside)
    for key in inside:
        assert target_store.check(key, 5, 1, 1)[0] == 0
        assert target_engine.apply([0], key, 1)[0] == 1      # 1 of 3 left
        assert target_engine.apply([0], key, 1)[0] == 0
        assert target_engine.apply([1], key, 1, b"GET /b")[0] == 0
    assert sum(target_store.count_in_slot(s) for s in moving) == len(inside)
    assert sum(target_engine.count_in_slot(s) for s in moving) == 2 * len(inside)


def test_an_export_resumed_over_a_changing_table_misses_no_bucket():
    # Between steps, inserts rehash the table and deletes shift its entries:
    # a walk by table slot would skip some; the arena walk does not, and it
    # ends though writes outpace it (later writes are the change log's).
    clock = Clock(manual=True, start_ms=10_000)
    store = BucketStore(shards=1, clock=clock)
    for key in KEYS:
        store.check(key, 5, 1, 1)
    cursor = SlotCursor(mask_of(range(16384)))
    exported: set[bytes] = set()
    steps = 0
    while not cursor.done:
        for section in snapshot.parse_sections(memoryview(
                b"".join(store.export_slots(cursor, max_bytes=500)))):
            exported |= set(record_keys(section))
        for i in range(40):
            store.check(b"new%d:%d" % (steps, i), 5, 1, 1)
        store.reset(KEYS[(steps * 7919) % len(KEYS)])
        steps += 1
        assert steps < 10_000
    survivors = {k for k in KEYS if store.check(k, 5, 1, 0)[2] == 4}
    assert steps > 20 and survivors - exported == set()


def record_keys(section):
    data, pos = bytes(section.data), 0
    while pos < len(data):
        keylen = int.from_bytes(data[pos + 4:pos + 6], "little")
        start = pos + 6 + section.value_size
        yield data[start:start + keylen]
        pos = start + keylen


def test_deleting_slots_removes_exactly_their_buckets_in_budgeted_steps():
    clock = Clock(manual=True, start_ms=10_000)
    store, engine = BucketStore(shards=4, clock=clock), engine_with_rules(clock)
    for key in KEYS:
        store.check(key, 5, 1, 1)
        engine.apply([0, 1], key, 1, b"GET /b")
    moving = {keyslot(k) for k in KEYS[:1000]}
    inside = [k for k in KEYS if keyslot(k) in moving]
    for table, per_key in ((store, 1), (engine, 2)):
        cursor, deleted = SlotCursor(mask_of(moving)), 0
        while not cursor.done:
            deleted += table.delete_slots(cursor, budget_ms=0.0)
        assert deleted == per_key * len(inside)
        assert len(table) == per_key * (len(KEYS) - len(inside))
        assert all(table.count_in_slot(s) == 0 for s in moving)


def test_keys_of_a_slot_are_deduplicated_and_bounded():
    clock = Clock(manual=True, start_ms=10_000)
    store, engine = BucketStore(clock=clock), engine_with_rules(clock)
    tagged = [b"{t}%d" % i for i in range(500)]
    for key in tagged:
        store.check(key, 5, 1, 1)
        engine.apply([0, 1], key, 1, b"r")
    slot = keyslot(b"{t}")
    keys = SlotKeys(10_000)
    store.keys_in_slot(keys, slot)
    engine.keys_in_slot(keys, slot)
    assert sorted(keys.keys()) == sorted(tagged)
    few = SlotKeys(7)
    engine.keys_in_slot(few, slot)
    assert len(few.keys()) == 7
    with pytest.raises(ValueError):
        store.count_in_slot(16384)
