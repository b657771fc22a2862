"""Consistent hashing: which server owns a key.

Each server is placed on a 64-bit ring at many pseudo-random points
(virtual nodes); a key belongs to the first point at or after its own
hash.  One key always maps to the same server, the servers get near-equal
shares, and adding an Nth server moves only the keys that now land on its
points: about 1/N of them, all to the new server.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable

DEFAULT_VNODES = 160


def hash64(data: bytes) -> int:
    """A 64-bit hash of data, the same in every process."""
    # blake2b: stable across processes and Python versions (unlike hash()),
    # so every instance of a service routes a key to the same server.
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing over server names: each server owns vnodes points
    on a ring, a key goes to the owner of the first point at or after its
    hash, and adding a server moves about 1/N of the keys."""

    def __init__(self, nodes: Iterable[str], vnodes: int = DEFAULT_VNODES):
        self.nodes = list(dict.fromkeys(nodes))
        if not self.nodes:
            raise ValueError("a hash ring needs at least one node")
        if vnodes < 1:
            raise ValueError("vnodes must be >= 1")
        points = sorted((hash64(f"{node}#{i}".encode()), node)
                        for node in self.nodes for i in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._owners = [node for _, node in points]

    def node_for(self, key: bytes) -> str:
        """The server that owns key."""
        i = bisect.bisect_left(self._hashes, hash64(key))
        return self._owners[i % len(self._owners)]
