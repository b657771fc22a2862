"""Embedded mode: the server's Cython token bucket inside this process.

``Limiter`` has the client's ``check`` API and no server: for a single
process, or for tests.  ``LocalFallback`` is the stricter limit a client
enforces on its own while the server is failing; it runs on a Limiter.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastlimit._core import BucketStore, Clock
from fastlimit.decision import LOCAL, LOCAL_FALLBACK, Decision

Key = str | bytes

MAX_PERIOD_MS = 2**32 - 1      # CL.CHECK's bound on PERIOD

# The server sweeps idle buckets on a timer; an embedded store has no timer,
# so every SWEEP_EVERY checks one pays a small, bounded sweep.
SWEEP_EVERY = 4096
SWEEP_BUDGET_MS = 0.1


def key_bytes(key: Key) -> bytes:
    """Keys are binary-safe; text is UTF-8, as redis-py would send it."""
    if type(key) is bytes:
        return key
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a key is str or bytes, not {type(key).__name__}")


def check_on_failure(on_failure: str) -> str:
    """on_failure itself if it is "open" or "closed"; else ValueError."""
    if on_failure != "open" and on_failure != "closed":
        raise ValueError(f"on_failure must be 'open' or 'closed', not {on_failure!r}")
    return on_failure


class Limiter:
    """Token buckets in this process, with the server's exact arithmetic.

    Safe from many threads: each check is one C call that holds the GIL
    from start to end, so concurrent checks of one key never interleave.
    (A free-threaded Python build would need a lock around the store.)
    Decisions have source ``"local"``.
    """

    def __init__(self, shards: int = 256, clock: Clock | None = None):
        self._store = BucketStore(shards=shards, clock=clock)
        self._checks = 0

    @property
    def clock(self) -> Clock:
        """The limiter's clock (a manual one moves only when told)."""
        return self._store.clock

    def check(self, key: Key, capacity: int, refill_per_sec: int, cost: int = 1,
              period_ms: int = 1000, on_failure: str = "open") -> Decision:
        """Spends ``cost`` tokens of ``key``'s bucket if it has them.

        Same arguments as ``Client.check``; ``on_failure`` is accepted so the
        two are interchangeable, and unused: nothing here can fail.
        Invalid numbers raise ValueError (the server's bounds).
        """
        if on_failure != "open":
            check_on_failure(on_failure)
        decision = self._store.decide(key if type(key) is bytes else key_bytes(key),
                                      capacity, refill_per_sec, cost, period_ms, LOCAL)
        self._checks += 1
        if not self._checks % SWEEP_EVERY:
            self._store.sweep(budget_ms=SWEEP_BUDGET_MS)
        return decision

    def check_raw(self, key: bytes, capacity: int, refill_per_sec: int,
                  cost: int = 1, period_ms: int = 1000) -> tuple:
        """BucketStore.check's five-tuple, with the amortised sweep."""
        reply = self._store.check(key, capacity, refill_per_sec, cost, period_ms)
        # Not atomic across threads: a lost increment only delays a sweep.
        self._checks += 1
        if not self._checks % SWEEP_EVERY:
            self._store.sweep(budget_ms=SWEEP_BUDGET_MS)
        return reply

    def reset(self, key: Key) -> bool:
        """Forgets a bucket (it is full again); True if there was one."""
        return self._store.reset(key_bytes(key))

    def sweep(self, budget_ms: float = 1.0) -> int:
        """Drops buckets that have refilled; returns how many."""
        return self._store.sweep(budget_ms=budget_ms)[0]

    def __len__(self) -> int:
        return len(self._store)


def divide_limit(capacity: int, refill_per_sec: int, period_ms: int,
                 divisor: int) -> tuple[int, int, int]:
    """A limit ``divisor`` times stricter: capacity divided (at least 1) and
    the refill rate divided.  The rate is divided exactly by stretching the
    period instead of rounding the refill down to zero for slow rates."""
    if divisor == 1:
        return capacity, refill_per_sec, period_ms
    capacity = max(1, capacity // divisor)
    if refill_per_sec % divisor == 0:
        return capacity, refill_per_sec // divisor, period_ms
    if period_ms * divisor <= MAX_PERIOD_MS:
        return capacity, refill_per_sec, period_ms * divisor
    return capacity, max(1, refill_per_sec // divisor), period_ms


RuleValue = tuple[int, int] | tuple[int, int, int]


class LocalFallback:
    """The limit a client enforces in-process while its server is failing.

    ``divisor``: each limit is divided by it, typically the number of
    instances sharing the limit, so that all of them together stay near the
    real limit while each counts alone.

    ``rules``: the numbers for ``limit()`` calls, whose rules otherwise live
    only on the server.  Keys are ``(resource, tier)``, ``resource`` (any
    tier), ``("*", tier)`` or ``"*"`` (anything), looked up most specific
    first; values are ``(capacity, refill_per_sec)`` or ``(capacity,
    refill_per_sec, period_ms)``.  A ``limit()`` with no matching rule gets
    no fallback: the call's ``on_failure`` policy applies.

    Decisions have source ``"local_fallback"``.
    """

    def __init__(self, divisor: int = 1,
                 rules: Mapping[object, RuleValue] | None = None,
                 shards: int = 16, clock: Clock | None = None):
        if not isinstance(divisor, int) or divisor < 1:
            raise ValueError("divisor must be an integer >= 1")
        self.divisor = divisor
        self.limiter = Limiter(shards=shards, clock=clock)
        # Buckets of different rules never share a key: the rule's index,
        # which has no NUL, then a NUL, then the client key.
        self._rules = {match: (b"r%d\0" % i, _rule_numbers(match, value))
                       for i, (match, value) in enumerate((rules or {}).items())}

    def check(self, key: Key, capacity: int, refill_per_sec: int, cost: int = 1,
              period_ms: int = 1000) -> Decision:
        """The caller's share of the limit, enforced in this process while
        the server fails (see the class docstring)."""
        capacity, refill, period = divide_limit(capacity, refill_per_sec,
                                                period_ms, self.divisor)
        reply = self.limiter.check_raw(b"c\0" + key_bytes(key), capacity,
                                       refill, cost, period)
        return Decision.from_reply(reply, LOCAL_FALLBACK)

    def limit(self, client_key: Key, resource: str, tier: str | None = None,
              cost: int = 1) -> Decision | None:
        """None when no rule matches: the caller's on_failure decides."""
        found = self._rule_for(resource, tier)
        if found is None:
            return None
        prefix, (capacity, refill, period) = found
        capacity, refill, period = divide_limit(capacity, refill, period, self.divisor)
        reply = self.limiter.check_raw(prefix + key_bytes(client_key), capacity,
                                       refill, cost, period)
        return Decision.from_reply(reply, LOCAL_FALLBACK)

    def _rule_for(self, resource: str, tier: str | None):
        for match in ((resource, tier), resource, ("*", tier), "*"):
            found = self._rules.get(match)
            if found is not None:
                return found
        return None


def _rule_numbers(match, value) -> tuple[int, int, int]:
    if len(value) == 2:
        return value[0], value[1], 1000
    if len(value) == 3:
        return tuple(value)
    raise ValueError(f"fallback rule {match!r}: expected (capacity, refill_per_sec"
                     f"[, period_ms]), got {value!r}")
