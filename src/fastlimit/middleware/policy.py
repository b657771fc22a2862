"""What to limit and how: the framework-neutral core of both middlewares.

A ``RateLimitPolicy`` turns a ``Request`` into one limiter call:

- fixed numbers (``Limit``, or a ``{tier: Limit}`` mapping) call
  ``limiter.check(bucket_key, capacity, refill_per_sec, cost, period_ms,
  on_failure)`` with the bucket key ``"<resource>|<client key>"``;
- ``Rules()`` calls ``limiter.limit(client_key, resource, tier, cost,
  on_failure)`` and lets the server's rules decide.

The limiter is a ``fastlimit.Client``, ``fastlimit.AsyncClient`` or the
embedded ``fastlimit.Limiter``; its result may be a Decision or an awaitable
of one, and the middleware awaits it when it can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from fastlimit.middleware.request import KeyFunc, Request, client_ip, method_and_route

FAILURE_MODES = ("open", "closed")


@dataclass(frozen=True)
class Limit:
    """A token bucket: up to ``capacity`` requests at once, refilled by
    ``refill_per_sec`` every ``period_ms`` milliseconds (default: per second)."""

    capacity: int
    refill_per_sec: int
    period_ms: int = 1000

    def __post_init__(self):
        for name in ("capacity", "refill_per_sec", "period_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limit.{name} must be a positive integer, not {value!r}")

    @classmethod
    def per_second(cls, n: int, burst: int | None = None) -> Limit:
        """n requests per second, in bursts of up to burst (default n)."""
        return cls(burst or n, n, 1000)

    @classmethod
    def per_minute(cls, n: int, burst: int | None = None) -> Limit:
        """n requests per minute, in bursts of up to burst (default n)."""
        return cls(burst or n, n, 60_000)

    @classmethod
    def per_hour(cls, n: int, burst: int | None = None) -> Limit:
        """n requests per hour, in bursts of up to burst (default n)."""
        return cls(burst or n, n, 3_600_000)

    @property
    def window_seconds(self) -> int:
        """Seconds for an empty bucket to fill: the ``w`` of RateLimit-Policy."""
        ms = -(-self.capacity * self.period_ms // self.refill_per_sec)
        return -(-ms // 1000)


@dataclass(frozen=True)
class Rules:
    """Limits come from the server's rules (``client.limit``). The middleware
    does not know their window, so ``RateLimit-Policy`` carries one only if
    given here."""

    window_seconds: int | None = None


LimitSource = Limit | Mapping[str | None, Limit] | Rules


class PendingCheck(NamedTuple):
    """A limiter call in flight: a Decision or an awaitable of one, plus the
    policy window the response headers advertise."""

    result: Any
    window_seconds: int | None


def bucket_key(resource: str, client_key: str) -> str:
    return f"{resource}|{client_key}"


class RateLimitPolicy:
    """Configuration shared by the ASGI and WSGI middleware.

    key:        Request -> client key, or None to let the request through
                unlimited (default: the client's IP, no trusted proxies).
    resource:   Request -> resource name (default ``"METHOD /route"``).
    tier:       Request -> tier name or None (selects a ``Limit`` from a
                mapping, or is passed to the server's rules).
    cost:       Request -> tokens this request spends (default 1).
    on_failure: "open" (product limits: allow when the limiter is down) or
                "closed" (security limits: deny), or Request -> either.
    """

    def __init__(self, limiter: Any, limit: LimitSource, *,
                 key: KeyFunc | None = None,
                 resource: Callable[[Request], str] = method_and_route,
                 tier: Callable[[Request], str | None] | None = None,
                 cost: Callable[[Request], int] | None = None,
                 on_failure: str | Callable[[Request], str] = "open"):
        _validate_limit(limit)
        if isinstance(on_failure, str) and on_failure not in FAILURE_MODES:
            raise ValueError(f"on_failure must be one of {FAILURE_MODES}, not {on_failure!r}")
        self.limiter = limiter
        self.limit = limit
        self.key = key or client_ip()
        self.resource = resource
        self.tier = tier
        self.cost = cost
        self.on_failure = on_failure

    def start(self, request: Request) -> PendingCheck | None:
        """Ask the limiter about this request; None when it is not limited."""
        client_key = self.key(request)
        if client_key is None:
            return None
        resource = self.resource(request)
        tier = self.tier(request) if self.tier else None
        cost = self.cost(request) if self.cost else 1
        on_failure = self.on_failure(request) if callable(self.on_failure) else self.on_failure
        if isinstance(self.limit, Rules):
            result = self.limiter.limit(client_key, resource, tier=tier, cost=cost,
                                        on_failure=on_failure)
            return PendingCheck(result, self.limit.window_seconds)
        limit = self._limit_for(tier)
        result = self.limiter.check(bucket_key(resource, client_key), limit.capacity,
                                    limit.refill_per_sec, cost=cost,
                                    period_ms=limit.period_ms, on_failure=on_failure)
        return PendingCheck(result, limit.window_seconds)

    def _limit_for(self, tier: str | None) -> Limit:
        if isinstance(self.limit, Limit):
            return self.limit
        assert not isinstance(self.limit, Rules)     # start() asks the server for Rules
        # Unknown tiers get the default (None) entry, normally the strictest.
        return self.limit.get(tier) or self.limit[None]


def _validate_limit(limit: LimitSource) -> None:
    """Configuration errors surface at start-up, not on the first request."""
    if isinstance(limit, (Limit, Rules)):
        return
    if not isinstance(limit, Mapping):
        raise TypeError("limit must be a Limit, a {tier: Limit} mapping or Rules(), "
                        f"not {limit!r}")
    if None not in limit:
        raise ValueError("a {tier: Limit} mapping needs a None entry: the limit for "
                         "requests with no tier or an unknown one")
    for tier, value in limit.items():
        if not isinstance(value, Limit):
            raise TypeError(f"limit for tier {tier!r} must be a Limit, not {value!r}")
