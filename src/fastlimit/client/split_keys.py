"""Split keys on the client's side (README "Split keys"): the sub-key
naming any Redis Cluster client can follow, and what a cluster told this
client about keys its rules split.

Sub-bucket i of key K is K with "#i" at the end of K's hashed part (the
bytes between the first "{" and the next "}" when there are some, else
all of K: Redis's hash-tag rule), as the server's fl_split.h names it.
In cluster mode a check of a split key names one sub-key, so it goes to
that sub-key's shard; a CL.LIMIT on a plain key whose rule is split is
answered "-SPLIT k ...", which this client remembers for a few seconds
(a change of k is then picked up) and resends with a random sub-key."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import OrderedDict

from redis.exceptions import ResponseError

# How long a learned k is used before the server is asked again: after a
# change of k the old sub-keys past the new k are refused (and re-learned)
# at once, a larger k is seen within this.
SPLIT_TTL_S = 5.0
# Keys remembered at most: the oldest is forgotten first.
MAX_SPLIT_KEYS = 4096
_SPLIT_REPLY = re.compile(r"SPLIT ([1-9][0-9]?) ")


def hashed_end(key: bytes) -> int:
    """The offset just past key's hashed part."""
    opened = key.find(b"{")
    if opened >= 0:
        closed = key.find(b"}", opened + 1)
        if closed > opened + 1:
            return closed
    return len(key)


def subkey(key: bytes, i: int) -> bytes:
    """Sub-key i of key (b"user:42" -> b"user:42#3", b"a{t}b" -> b"a{t#3}b")."""
    end = hashed_end(key)
    return key[:end] + b"#%d" % i + key[end:]


def random_subkey(key: bytes, k: int) -> bytes:
    return subkey(key, random.randrange(k))


def split_refusal(reply) -> int | None:
    """k, when reply is the server's "SPLIT k ..." error (a plain key of a
    split rule, in cluster mode); else None."""
    if not isinstance(reply, ResponseError):
        return None
    m = _SPLIT_REPLY.match(str(reply))
    return int(m.group(1)) if m else None


class SplitKeys:
    """k of the (client key, resource, tier) calls the cluster answered
    with SPLIT, bounded and for SPLIT_TTL_S each."""

    def __init__(self, ttl_s: float = SPLIT_TTL_S, max_keys: int = MAX_SPLIT_KEYS):
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._known: OrderedDict[tuple, tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()       # Client is shared by threads

    def get(self, ident: tuple) -> int | None:
        entry = self._known.get(ident)
        if entry is None:
            return None
        if entry[1] <= time.monotonic():
            with self._lock:
                self._known.pop(ident, None)
            return None
        return entry[0]

    def learn(self, ident: tuple, k: int) -> None:
        with self._lock:
            self._known.pop(ident, None)
            self._known[ident] = (k, time.monotonic() + self.ttl_s)
            while len(self._known) > self.max_keys:
                self._known.popitem(last=False)

    def __len__(self) -> int:
        return len(self._known)
