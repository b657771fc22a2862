"""The `limits` storages over redis-py's synchronous clients."""

from __future__ import annotations

from typing import Any

import redis
import redis.cluster
import redis.sentinel
from limits._storage_scheme import parse_storage_uri
from limits.errors import ConfigurationError
from limits.storage.base import (
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    Storage,
    TimestampedSlidingWindow,
)

from fastlimit.limits_storage.common import (
    PREFIX,
    PairedRead,
    ms,
    redis_url,
    sentinel_for,
    weighted,
)


class FastlimitStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport,
                       TimestampedSlidingWindow):
    """`limits` storage on a fastlimit server: ``fastlimit://host:port``
    (``fastlimits://`` for TLS, ``fastlimit+unix:///path``).  Options are
    redis-py's (``redis.Redis.from_url``), and ``key_prefix`` (default
    "LIMITS") scopes the keys and what reset() forgets."""

    STORAGE_SCHEME = ["fastlimit", "fastlimits", "fastlimit+unix"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        self.key_prefix = key_prefix
        self.paired = PairedRead()
        self.client = self.connect(uri, options)

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        return redis.Redis.from_url(redis_url(uri), **options)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return redis.RedisError

    def prefixed_key(self, key: str) -> str:
        return f"{self.key_prefix}:{key}"

    def call(self, *args: Any) -> Any:
        return self.client.execute_command(*args)

    # ---- the fixed window --------------------------------------------------

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        if amount == 0:
            return self.get(key)
        return int(self.call("CL.FIXED", self.prefixed_key(key), ms(expiry), amount)[0])

    def get(self, key: str) -> int:
        count, expire_ms = self.call("CL.FIXED", self.prefixed_key(key), 1, 0)
        self.paired.note(key, expire_ms)
        return int(count)

    def get_expiry(self, key: str) -> float:
        paired = self.paired.take(key)
        if paired is not None:
            return paired
        return int(self.call("CL.FIXED", self.prefixed_key(key), 1, 0)[1]) / 1000

    # ---- the moving window -----------------------------------------------------

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount == 0:
            return True         # as limits' MemoryStorage: nothing to log
        if amount > limit:
            return False
        return bool(self.call("CL.MOVING", self.prefixed_key(key), limit, ms(expiry),
                              amount)[0])

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        _, start_ms, count = self.call("CL.MOVING", self.prefixed_key(key), limit,
                                       ms(expiry), 0)
        return int(start_ms) / 1000, int(count)

    # ---- the sliding window counter ------------------------------------------------

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int,
                                     amount: int = 1) -> bool:
        if amount > limit:
            return False
        length = ms(expiry)
        reply = self.call("CL.SLIDING", self.prefixed_key(key), limit, length, amount)
        if amount == 0:
            return weighted(reply[1], reply[2], reply[3], length) <= limit
        return bool(reply[0])

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        _, previous, previous_ttl, current, current_ttl = self.call(
            "CL.SLIDING", self.prefixed_key(key), 1, ms(expiry), 0)
        return int(previous), previous_ttl / 1000, int(current), current_ttl / 1000

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self.clear(key)

    # ---- the rest ----------------------------------------------------------------------

    def clear(self, key: str) -> None:
        self.call("CL.WINCLEAR", self.prefixed_key(key))

    def reset(self) -> int | None:
        return int(self.call("CL.WINFLUSH", self.prefixed_key("")))

    def check(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:
            return False


class FastlimitClusterStorage(FastlimitStorage):
    """``fastlimit+cluster://[user:password@]host:port[,host:port...]``:
    a fastlimit cluster, through redis-py's RedisCluster (options are its)."""

    STORAGE_SCHEME = ["fastlimit+cluster"]

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        parsed = parse_storage_uri(uri)
        if not parsed.locations:
            raise ConfigurationError(f"no host:port in {uri!r}")
        auth = {k: v for k, v in (("username", parsed.username),
                                  ("password", parsed.password)) if v}
        return redis.cluster.RedisCluster(
            startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in parsed.locations],
            **{**auth, **options})

    def reset(self) -> int | None:
        # every primary forgets its own share of the prefix
        replies = self.client.execute_command(
            "CL.WINFLUSH", self.prefixed_key(""), target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        return sum(int(n) for n in (replies.values() if isinstance(replies, dict) else [replies]))


class FastlimitSentinelStorage(FastlimitStorage):
    """``fastlimit+sentinel://host:port[,host:port...]/service``: the
    primary that Redis Sentinel names for the service (``service_name``
    may be given instead of the path; ``sentinel_kwargs`` go to the
    Sentinel connections).  Always the primary: the windowed counters are
    not replicated to standbys."""

    STORAGE_SCHEME = ["fastlimit+sentinel"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, wrap_exceptions: bool = False,
                 service_name: str | None = None,
                 sentinel_kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        self.service_name = service_name
        self.sentinel_kwargs = sentinel_kwargs or {}
        options.pop("use_replicas", None)    # limits' option; every call is a write here
        super().__init__(uri, key_prefix=key_prefix, wrap_exceptions=wrap_exceptions, **options)

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        self.sentinel, service = sentinel_for(redis.sentinel.Sentinel, uri, self.service_name,
                                              self.sentinel_kwargs, options)
        return self.sentinel.master_for(service)
