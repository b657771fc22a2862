"""Split keys in cluster mode, on real fastlimit cluster processes (manual
clock): sub-keys hash to different slots and so spread over the shards; a
plain key of a split rule is refused with "-SPLIT k" (and a split rule
checked with one that is not, with "-SPLIT 0"); fastlimit.Client learns k
and sends each check to its sub-key's shard, and so does redis-py's
RedisCluster by naming alone; the standbys hold the sub-buckets, and a
reshard moves one without a reset."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import redis
from cluster_rig import FastlimitCluster, wait_for

from fastlimit._cluster import keyslot
from fastlimit.client import AsyncClient, Client
from fastlimit.client.split_keys import subkey
from fastlimit.cluster.client import SLOTS
from fastlimit.decision import SERVER

LIMIT, K = 400, 4
RULES = {"rules": {
    "tenant": {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": LIMIT,
            "window_ms": 3_600_000, "split": K},
    "page": {"match": {"resource": "both"}, "capacity": 5, "refill_per_second": 1},
    "hot-both": {"match": {"resource": "both"}, "algorithm": "fixed_window", "limit": 30,
                 "window_ms": 3_600_000, "split": K}}}
TIMEOUT_MS = 2000


def start_cluster(root, shards: int) -> FastlimitCluster:
    (root / "rules.json").write_text(json.dumps(RULES))
    return FastlimitCluster(str(root), shards, 1, "--rules-file", str(root / "rules.json"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(tmp_path_factory.mktemp("split-cluster"), 3)
    yield c
    c.stop()


def shard_of(cluster, key: bytes) -> int:
    return keyslot(key) * len(cluster.nodes) // SLOTS


def spread_key(cluster, prefix: str) -> bytes:
    """A key whose K sub-keys are on every shard."""
    for i in range(10_000):
        key = f"{prefix}:{i}".encode()
        if len({shard_of(cluster, subkey(key, j)) for j in range(K)}) == len(cluster.nodes):
            return key
    raise AssertionError("no key spreads over every shard")


def owner(cluster, key: bytes):
    return cluster.primaries[shard_of(cluster, key)]


def sub_remaining(cluster, key: bytes, resource: str = "api") -> list[int]:
    out = []
    for j in range(K):
        with owner(cluster, subkey(key, j)).client() as c:
            out.append(c.execute_command("CL.LIMIT", subkey(key, j), resource, "COST", 0)[2]
                       // K)
    return out


def test_the_sub_keys_differ_in_slot_and_name_their_sub_bucket(cluster):
    key = spread_key(cluster, "naming")
    assert len({keyslot(subkey(key, j)) for j in range(K)}) == K
    with owner(cluster, subkey(key, 1)).client() as c:
        assert c.execute_command("CL.LIMIT", subkey(key, 1), "api", "COST", 40)[:3] == \
            [1, LIMIT, (LIMIT // K - 40) * K]
    assert sub_remaining(cluster, key) == [100, 60, 100, 100]


def test_a_plain_key_of_a_split_rule_is_refused_with_k(cluster):
    key = b"plain-refused"
    with owner(cluster, key).client() as c:
        with pytest.raises(redis.ResponseError) as e:
            c.execute_command("CL.LIMIT", key, "api")
        assert str(e.value).startswith(f"SPLIT {K} the key is split into {K} sub-keys")
        with pytest.raises(redis.ResponseError, match="^SPLIT 3 "):
            c.execute_command("CL.CHECK", key, 30, 1, "SPLIT", 3)
    sub = subkey(b"mixed", 0)
    with owner(cluster, sub).client() as c:
        with pytest.raises(redis.ResponseError, match="^SPLIT 0 in cluster mode a split rule "
                                                      "cannot be checked together"):
            c.execute_command("CL.LIMIT", sub, "both")


def test_the_client_learns_k_and_spends_every_sub_bucket(cluster):
    key = spread_key(cluster, "client")
    with Client(cluster=f"127.0.0.1:{cluster.primaries[0].port}",
                timeout_ms=TIMEOUT_MS) as client:
        decisions = [client.limit(key, "api") for _ in range(2 * LIMIT)]
        assert all(d.source == SERVER for d in decisions)
        assert sum(d.allowed for d in decisions) == LIMIT
        assert client.stats.split_learned == 1      # then k is known
        checks = [client.check(b"bucket:" + key, 30, 1, split=K) for _ in range(200)]
        assert sum(d.allowed for d in checks) == 30
        assert all(d.limit == 30 for d in checks)
    assert sub_remaining(cluster, key) == [0] * K


def test_the_async_client_too(cluster):
    key = spread_key(cluster, "async")

    async def spend() -> int:
        client = AsyncClient(cluster=f"127.0.0.1:{cluster.primaries[1].port}",
                             timeout_ms=TIMEOUT_MS)
        try:
            return sum([(await client.limit(key, "api")).allowed for _ in range(2 * LIMIT)])
        finally:
            await client.aclose()
    assert asyncio.run(spend()) == LIMIT


def test_any_cluster_client_by_naming_alone(cluster):
    key = spread_key(cluster, "redis-py")
    rc = redis.RedisCluster(host="127.0.0.1", port=cluster.primaries[2].port, socket_timeout=10)
    try:
        allowed = sum(rc.execute_command("CL.LIMIT", subkey(key, i % K), "api")[0]
                      for i in range(2 * LIMIT))
    finally:
        rc.close()
    assert allowed == LIMIT


def test_the_standbys_hold_the_sub_buckets(cluster):
    key = spread_key(cluster, "standby")
    for j in range(K):
        with owner(cluster, subkey(key, j)).client() as c:
            c.execute_command("CL.LIMIT", subkey(key, j), "api", "COST", 10 * (j + 1))

    def counts(node_index: int) -> list[int]:
        out = []
        for j in range(K):
            node = cluster.nodes[shard_of(cluster, subkey(key, j))][node_index]
            with node.client() as c:
                out.append(c.execute_command("CLUSTER", "COUNTKEYSINSLOT",
                                             keyslot(subkey(key, j))))
        return out
    assert all(n >= 1 for n in counts(0))
    wait_for(lambda: counts(1) == counts(0), "the standbys to have the sub-buckets")


@pytest.mark.untraced
def test_a_reshard_moves_a_sub_bucket_without_a_reset(tmp_path):
    c = start_cluster(tmp_path, 2)
    try:
        key = next(k for k in (f"moving:{i}".encode() for i in range(1000))
                   if shard_of(c, subkey(k, 0)) == 0)
        sub = subkey(key, 0)
        slot = keyslot(sub)
        with c.primaries[0].client(socket_timeout=60) as s:
            assert s.execute_command("CL.LIMIT", sub, "api", "COST", 70)[0] == 1
            s.execute_command("CL.CLUSTER", "MOVE", f"{slot}-{slot}", "fl-1")
        with c.primaries[1].client() as t:
            assert t.execute_command("CL.LIMIT", sub, "api", "COST", 0)[2] == 30 * K
    finally:
        c.stop()


def test_the_readme_example(cluster):
    """The README's redis-py lines, as written but for the port."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("### Splitting a hot key"):]
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert "port=7000" in block
    code = block.replace("port=7000", f"port={cluster.primaries[0].port}")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    scope["rc"].close()
