"""Hash slots (fastlimit._cluster): the published vectors, and a table of
keys checked against a real cluster-enabled redis-server's CLUSTER KEYSLOT."""

from __future__ import annotations

import random

import pytest

from fastlimit._cluster import SLOTS, keyslot

# (key, slot): the note's vectors (cluster spec, Jedis, Lettuce, redis-py,
# redis-doc, crc16_slottable.h).  CRC16 vectors of tag-free keys are given
# as crc & 0x3FFF: the slot is all the CRC is used for.
VECTORS = [
    (b"123456789", 0x31C3 & 0x3FFF),
    (b"", 0),
    (b"sfger132515", 0xA45C & 0x3FFF),
    (b"hae9Napahngaikeethievubaibogiech", 0x58CE & 0x3FFF),
    (b"AAAAAAAAAAAAAAAAAAAAAA", 0x92CD & 0x3FFF),
    (b"Hello, World!", 0x4FD6 & 0x3FFF),
    (b"key{123456789}a", 0x31C3 & 0x3FFF),
    (b"51", 7186),
    (b"somekey", 11058),
    (b"foo{hash_tag}", 2515),
    (b"bar{hash_tag}", 2515),
    (b"foo", 12182),
    (b"{foo}bar", 12182),
    (b"{foo}", 12182),
    (b"1337", 4314),
    (b"{user1000}.following", 3443),
    (b"{user1000}.followers", 3443),
    (b"foo{}{bar}", 8363),
    (b"foo{{bar}}zap", 4015),
    (b"{bar", 4015),
    (b"foo{bar}{zap}", 5061),
    (b"bar", 5061),
    (b"{}", 15257),
    (b"{}foo", 9500),
    (b"{user:42}:sec", 15880),
    (b"user:42", 15880),
    (b"rl:{user:42}:api", 15880),
    (b"06S", 0),
    (b"Qi", 1),
    (b"5L5", 2),
]


@pytest.mark.parametrize("key,slot", VECTORS, ids=[repr(k) for k, _ in VECTORS])
def test_key_slot_matches_the_published_vectors(key, slot):
    assert keyslot(key) == slot


# Hash-tag edge cases and binary keys, checked against real Redis below.
EDGE_KEYS = [
    b"{}", b"{}a", b"a{}", b"a{}b", b"{{a}}", b"{{}}", b"{a}}", b"{{a}", b"a{b}c{d}",
    b"a{b{c}d}", b"{", b"}", b"}{", b"}a{b}", b"a{", b"a{b", b"{a", b"{}}{a}", b"{ }",
    b"{\x00}", b"\x00{\x00}\x00", b"\x00", b"\xff\xfe\xfd", b"{\xff}", bytes(range(256)),
    b"\r\n", b"{\r\n}x", b"a" * 1000, b"{" + b"x" * 5000 + b"}", b"{}" * 100,
    b"rl:{user:42}:api", "ключ{тег}".encode(),
]


def random_keys(count: int) -> list[bytes]:
    rng = random.Random(12)
    alphabet = b"ab{}\x00\xff:"
    keys = []
    for i in range(count):
        n = rng.randrange(0, 24)
        # Half from a brace-rich alphabet so tags of every shape occur.
        source = alphabet if i % 2 else bytes(range(256))
        keys.append(bytes(rng.choice(source) for _ in range(n)))
    return keys


def redis_keyslots(node, keys: list[bytes]) -> list[int]:
    pipe = node.client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("CLUSTER", "KEYSLOT", key)
    return pipe.execute()


def test_key_slot_equals_redis_for_hash_tag_edge_cases_and_binary_keys(redis_cluster_node):
    expected = redis_keyslots(redis_cluster_node, EDGE_KEYS)
    assert [keyslot(k) for k in EDGE_KEYS] == expected


def test_key_slot_equals_redis_for_the_published_vectors(redis_cluster_node):
    keys = [k for k, _ in VECTORS]
    assert redis_keyslots(redis_cluster_node, keys) == [s for _, s in VECTORS]


def test_key_slot_equals_redis_for_10000_random_keys(redis_cluster_node):
    keys = random_keys(10_000)
    expected = redis_keyslots(redis_cluster_node, keys)
    mismatches = [(k, keyslot(k), e)
                  for k, e in zip(keys, expected, strict=True) if keyslot(k) != e]
    assert mismatches == []


def test_key_slot_is_always_a_slot():
    assert SLOTS == 16384
    assert all(0 <= keyslot(k) < SLOTS for k in random_keys(2000))


def test_key_slot_refuses_a_key_that_is_not_bytes():
    with pytest.raises(TypeError):
        keyslot("somekey")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        keyslot(None)  # type: ignore[arg-type]
