"""The answer to "may this key spend this much now?", whoever gave it."""

from __future__ import annotations

from dataclasses import dataclass

# Where a Decision came from.
SERVER = "server"                  # a fastlimit server (also tokens pre-fetched from it)
LOCAL = "local"                    # the embedded Limiter, in this process by design
LOCAL_FALLBACK = "local_fallback"  # the server is failing; a stricter local limit answered
FAILED_OPEN = "failed_open"        # the server is failing; allowed without checking
FAILED_CLOSED = "failed_closed"    # the server is failing; denied without checking

SOURCES = frozenset({SERVER, LOCAL, LOCAL_FALLBACK, FAILED_OPEN, FAILED_CLOSED})


@dataclass(frozen=True, slots=True)
class Decision:
    """One check's outcome, in the units of ``CL.CHECK``'s reply.

    ``limit`` is the bucket's capacity; ``remaining`` the whole tokens left
    after this call; ``retry_after_ms`` 0 when allowed, else how long until
    the cost would pass (-1: it never can, the cost exceeds the capacity);
    ``reset_after_ms`` how long until the bucket is full again.
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    source: str = SERVER

    @classmethod
    def from_reply(cls, reply, source: str = SERVER) -> "Decision":
        """From the five integers of a CL.CHECK / CL.LIMIT reply; TypeError
        or ValueError if it is not that."""
        allowed, limit, remaining, retry_after_ms, reset_after_ms = reply
        return make_decision(bool(allowed), int(limit), int(remaining),
                             int(retry_after_ms), int(reset_after_ms), source)


# A frozen dataclass's __init__ sets each field through object.__setattr__,
# which costs more than the embedded check itself.  Decisions built here set
# the slots directly: same object, same immutability to callers, about half
# the cost.
_new = object.__new__
(_set_allowed, _set_limit, _set_remaining, _set_retry, _set_reset, _set_source) = (
    Decision.__dict__[name].__set__ for name in
    ("allowed", "limit", "remaining", "retry_after_ms", "reset_after_ms", "source"))


def make_decision(allowed: bool, limit: int, remaining: int, retry_after_ms: int,
                  reset_after_ms: int, source: str) -> Decision:
    """Decision(...) for trusted values, without the dataclass __init__."""
    d = _new(Decision)
    _set_allowed(d, allowed)
    _set_limit(d, limit)
    _set_remaining(d, remaining)
    _set_retry(d, retry_after_ms)
    _set_reset(d, reset_after_ms)
    _set_source(d, source)
    return d
