"""Turn a limiter ``Decision`` into HTTP headers and the 429 body.

Pure functions, no framework: the ASGI and WSGI middleware both use them,
and the tests check them against a table.

Units (all whole seconds, rounded *up* so a client that waits the advertised
time never arrives early and gets denied again):

- ``Retry-After``: seconds until the denied request could pass
  (``retry_after_ms``), at least 1 on a 429.
- ``X-RateLimit-Limit``: the bucket's capacity (the burst a client may send).
- ``X-RateLimit-Remaining``: whole tokens left after this request.
- ``X-RateLimit-Reset``: seconds until the bucket is full again
  (``reset_after_ms``) -- a delta, not an epoch timestamp.
- ``RateLimit-Policy: "burst";q=<limit>;w=<window>``: the IETF draft's
  policy; the window is the time a bucket takes to refill from empty, and is
  left out when the middleware does not know it (server-side rules).
- ``RateLimit: "burst";r=<remaining>;t=<reset>``: the IETF draft's current
  state, with the same numbers as the X- headers.

When the limiter could not be asked (``failed_open``/``failed_closed``) the
Decision's numbers are not a real quota, so no quota headers are sent. A
``failed_closed`` denial is a 429 with ``Retry-After: 1``: the outage is
usually short, and 429 (not 503) keeps clients on their existing
rate-limit retry path instead of treating the whole API as down.
"""

from __future__ import annotations

import json
from typing import Protocol

STATUS_429 = "429 Too Many Requests"
POLICY_NAME = "burst"
FAILED_SOURCES = frozenset({"failed_open", "failed_closed"})

Headers = list[tuple[str, str]]


class DecisionLike(Protocol):
    """The fields of ``fastlimit.client.Decision`` these functions read."""

    allowed: bool
    limit: int
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    source: str


def ceil_seconds(ms: int) -> int:
    """Milliseconds to whole seconds, rounded up; negatives count as 0."""
    return -(-ms // 1000) if ms > 0 else 0


def retry_after_seconds(decision: DecisionLike) -> int | None:
    """Seconds a denied client should wait, or None when waiting never helps.

    ``retry_after_ms`` is -1 when the cost exceeds the capacity: no wait
    makes that request pass, so promising a time would be a lie.
    """
    if decision.source == "failed_closed":
        return 1
    if decision.retry_after_ms < 0:
        return None
    # At least 1: "Retry-After: 0" on a 429 invites an immediate retry storm.
    return max(1, ceil_seconds(decision.retry_after_ms))


def quota_headers(decision: DecisionLike, window_seconds: int | None = None) -> Headers:
    """The quota headers sent on every limited response, allowed or denied."""
    if decision.source in FAILED_SOURCES:
        return []
    limit = decision.limit
    remaining = decision.remaining
    reset = ceil_seconds(decision.reset_after_ms)
    policy = f'"{POLICY_NAME}";q={limit}'
    if window_seconds is not None:
        policy += f";w={window_seconds}"
    return [
        ("X-RateLimit-Limit", str(limit)),
        ("X-RateLimit-Remaining", str(remaining)),
        ("X-RateLimit-Reset", str(reset)),
        ("RateLimit-Policy", policy),
        ("RateLimit", f'"{POLICY_NAME}";r={remaining};t={reset}'),
    ]


def denied_body(decision: DecisionLike) -> bytes:
    """``{"error": "rate_limited", "retry_after_seconds": N}`` (N may be null)."""
    body = {"error": "rate_limited", "retry_after_seconds": retry_after_seconds(decision)}
    return json.dumps(body).encode()


def denied_response(decision: DecisionLike,
                    window_seconds: int | None = None) -> tuple[Headers, bytes]:
    """Headers and body of the 429 sent in place of the application's response."""
    body = denied_body(decision)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
    retry = retry_after_seconds(decision)
    if retry is not None:
        headers.append(("Retry-After", str(retry)))
    return headers + quota_headers(decision, window_seconds), body
