"""Pre-aggregation (``preaggregate=``): tokens taken from the server in
batches and spent in this process.  ``_Prefetch`` holds them;
``_ClientBase``'s pre-aggregation methods (``base.py``) are the check
path's side of it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fastlimit.decision import SERVER, Decision


class _Held:
    """Pre-fetched tokens of one bucket, and the server's answer with them."""

    __slots__ = ("tokens", "expires", "limit", "remaining", "reset_after_ms", "refused")

    def __init__(self, tokens: int, expires: float, answer: Decision):
        self.tokens = tokens
        self.expires = expires
        self.limit = answer.limit
        self.remaining = answer.remaining
        self.reset_after_ms = answer.reset_after_ms
        self.refused = not answer.allowed       # the server refused a batch


class _Prefetch:
    """Local pre-aggregation: tokens taken from the server in batches
    (one ``COST batch`` check) and spent here without a round trip.

    Tokens held here were counted by the server when they were taken, so a
    bucket can admit, within any window, up to ``instances × batch`` more
    than its limit (each instance spending a batch taken earlier), and
    tokens one instance holds are unavailable to the others until spent or
    expired (``ttl_s``).  Only for coarse limits; off by default.  Once the
    server refuses a batch, the bucket is near its limit: until the ttl
    passes, calls ask for their own cost only (one round trip, exact).
    """

    PRUNE_EVERY = 1024

    def __init__(self, batch: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        if batch < 1:
            raise ValueError("preaggregate must be >= 1 (or 0 for off)")
        self.batch = batch
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: dict[tuple, _Held] = {}
        self._stored = 0
        self._lock = threading.Lock()

    def spend(self, bucket: tuple, cost: int) -> Decision | None:
        with self._lock:
            held = self._held.get(bucket)
            if held is None or held.tokens < cost or held.expires <= self.clock():
                return None
            held.tokens -= cost
            return Decision(True, held.limit, held.remaining + held.tokens, 0,
                            held.reset_after_ms, SERVER)

    def near_limit(self, bucket: tuple) -> bool:
        """A batch was refused lately: not worth asking for another."""
        held = self._held.get(bucket)
        return held is not None and held.refused and held.expires > self.clock()

    def keep(self, bucket: tuple, tokens: int, granted: Decision) -> Decision:
        """Holds the rest of a granted batch; the answer counts it as remaining."""
        self._store(bucket, _Held(tokens, self.clock() + self.ttl_s, granted))
        return Decision(True, granted.limit, granted.remaining + tokens, 0,
                        granted.reset_after_ms, SERVER)

    def refused(self, bucket: tuple, denied: Decision) -> None:
        self._store(bucket, _Held(0, self.clock() + self.ttl_s, denied))

    def _store(self, bucket: tuple, held: _Held) -> None:
        with self._lock:
            self._held[bucket] = held
            self._stored += 1
            if self._stored % self.PRUNE_EVERY == 0:
                now = self.clock()
                self._held = {b: h for b, h in self._held.items() if h.expires > now}
