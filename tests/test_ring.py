"""Consistent hashing (fastlimit.ring): stable, balanced, and adding a
server moves about 1/N of the keys, all of them to the new server."""

from __future__ import annotations

from collections import Counter

import pytest

from fastlimit.ring import HashRing

THREE = ["10.0.0.1:6380", "10.0.0.2:6380", "10.0.0.3:6380"]
KEYS = [f"user:{i}".encode() for i in range(30_000)]


def owners(ring: HashRing) -> list[str]:
    return [ring.node_for(k) for k in KEYS]


def test_a_key_always_maps_to_the_same_node():
    assert owners(HashRing(THREE)) == owners(HashRing(list(reversed(THREE))))


def test_keys_spread_evenly():
    shares = Counter(owners(HashRing(THREE)))
    assert set(shares) == set(THREE)
    for n in shares.values():
        assert abs(n - len(KEYS) / 3) < 0.15 * len(KEYS) / 3


def test_adding_a_node_moves_about_a_quarter_all_to_it():
    before = owners(HashRing(THREE))
    after = owners(HashRing(THREE + ["10.0.0.4:6380"]))
    moved = [(b, a) for b, a in zip(before, after) if b != a]
    assert 0.18 < len(moved) / len(KEYS) < 0.32
    assert {a for _, a in moved} == {"10.0.0.4:6380"}


def test_removing_a_node_moves_only_its_keys():
    before = owners(HashRing(THREE))
    after = owners(HashRing(THREE[:2]))
    for b, a in zip(before, after):
        assert a == b or b == THREE[2]


def test_validation():
    with pytest.raises(ValueError):
        HashRing([])
    with pytest.raises(ValueError):
        HashRing(THREE, vnodes=0)
