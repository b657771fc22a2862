"""What the sync and asyncio storages share: URIs, keys, units, replies."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from limits._storage_scheme import parse_storage_uri
from limits.errors import ConfigurationError

DEFAULT_PORT = 6380
PREFIX = "LIMITS"
# redis-py's scheme for each of ours (limits' own Redis storages' naming).
REDIS_SCHEMES = {"fastlimit": "redis", "fastlimits": "rediss", "fastlimit+unix": "unix"}
# How long a count read by get() answers the get_expiry() that follows it
# for the same key (FixedWindowRateLimiter.get_window_stats calls both; the
# one reply of CL.FIXED carries both, so the stats are one round trip).
PAIRED_READ_S = 0.1


def redis_url(uri: str) -> str:
    """The redis-py URL of a fastlimit URI (async+ taken off, the scheme
    mapped, fastlimit's default port filled in)."""
    parsed = urllib.parse.urlsplit(uri.removeprefix("async+"))
    scheme = REDIS_SCHEMES.get(parsed.scheme)
    if scheme is None:
        raise ConfigurationError(f"not a fastlimit storage URI: {uri!r}")
    netloc = parsed.netloc
    if scheme == "unix":
        return "unix://" + uri.removeprefix("async+").split("://", 1)[1]
    host = netloc.rpartition("@")[2]
    if not host:
        raise ConfigurationError(f"no host in fastlimit storage URI {uri!r}")
    try:
        port = urllib.parse.urlsplit(f"x://{host}").port
    except ValueError as e:
        raise ConfigurationError(f"bad port in fastlimit storage URI {uri!r}") from e
    if port is None:
        netloc += f":{DEFAULT_PORT}"
    return urllib.parse.urlunsplit((scheme, netloc, parsed.path, parsed.query, parsed.fragment))


def sentinel_for(sentinel_class, uri: str, service_name: str | None,
                 sentinel_kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
    """The Sentinel (sync or asyncio: sentinel_class) that a
    fastlimit+sentinel:// URI names, its credentials going to the sentinels
    and to the primary; ConfigurationError without a service or an
    address."""
    parsed = parse_storage_uri(uri)
    service = (parsed.path or "").strip("/") or service_name
    if not service:
        raise ConfigurationError("'service_name' not provided")
    if not parsed.locations:
        raise ConfigurationError(f"no host:port in {uri!r}")
    auth = {k: v for k, v in (("username", parsed.username),
                              ("password", parsed.password)) if v}
    sentinel = sentinel_class(parsed.locations, sentinel_kwargs={**auth, **sentinel_kwargs},
                              **{**auth, **options})
    return sentinel, service


def ms(seconds: float) -> int:
    """A window's length in the server's milliseconds (limits gives seconds)."""
    n = round(seconds * 1000)
    if n < 1:
        raise ConfigurationError(f"a window must be at least 1 ms, not {seconds!r} s")
    return n


def weighted(previous: int, previous_ttl_ms: int, current: int, length_ms: int) -> int:
    """The sliding window counter's count, floored exactly as CL.SLIDING does."""
    return previous * previous_ttl_ms // length_ms + current


class PairedRead:
    """The expiry of the last counter get() read, for the get_expiry() of
    the same key that follows it (one slot; a miss asks the server)."""

    __slots__ = ("key", "expire_s", "at")

    def __init__(self) -> None:
        self.key: str | None = None
        self.expire_s = 0.0
        self.at = 0.0

    def note(self, key: str, expire_ms: int) -> None:
        self.key, self.expire_s, self.at = key, expire_ms / 1000, time.monotonic()

    def take(self, key: str) -> float | None:
        if self.key != key or time.monotonic() - self.at > PAIRED_READ_S:
            return None
        self.key = None
        return self.expire_s
