"""The `limits` asyncio storages (``async+fastlimit://...``) over
redis-py's asyncio clients: the same commands as sync.py, awaited."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
from limits._storage_scheme import parse_storage_uri
from limits.aio.storage.base import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.errors import ConfigurationError
from limits.storage.base import TimestampedSlidingWindow

from fastlimit.limits_storage.common import (
    PREFIX,
    PairedRead,
    ms,
    redis_url,
    sentinel_for,
    weighted,
)


class AsyncFastlimitStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport,
                            TimestampedSlidingWindow):
    """`limits` asyncio storage on a fastlimit server:
    ``async+fastlimit://host:port`` (``async+fastlimits://`` for TLS,
    ``async+fastlimit+unix:///path``); options are redis-py's."""

    STORAGE_SCHEME = ["async+fastlimit", "async+fastlimits", "async+fastlimit+unix"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        self.key_prefix = key_prefix
        self.paired = PairedRead()
        self.client = self.connect(uri, options)

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        return redis.asyncio.Redis.from_url(redis_url(uri), **options)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return redis.RedisError

    def prefixed_key(self, key: str) -> str:
        return f"{self.key_prefix}:{key}"

    async def call(self, *args: Any) -> Any:
        return await self.client.execute_command(*args)

    async def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        if amount == 0:
            return await self.get(key)
        return int((await self.call("CL.FIXED", self.prefixed_key(key), ms(expiry), amount))[0])

    async def get(self, key: str) -> int:
        count, expire_ms = await self.call("CL.FIXED", self.prefixed_key(key), 1, 0)
        self.paired.note(key, expire_ms)
        return int(count)

    async def get_expiry(self, key: str) -> float:
        paired = self.paired.take(key)
        if paired is not None:
            return paired
        return int((await self.call("CL.FIXED", self.prefixed_key(key), 1, 0))[1]) / 1000

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        if amount == 0:
            return True
        if amount > limit:
            return False
        return bool((await self.call("CL.MOVING", self.prefixed_key(key), limit, ms(expiry),
                                     amount))[0])

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        _, start_ms, count = await self.call("CL.MOVING", self.prefixed_key(key), limit,
                                             ms(expiry), 0)
        return int(start_ms) / 1000, int(count)

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int,
                                           amount: int = 1) -> bool:
        if amount > limit:
            return False
        length = ms(expiry)
        reply = await self.call("CL.SLIDING", self.prefixed_key(key), limit, length, amount)
        if amount == 0:
            return weighted(reply[1], reply[2], reply[3], length) <= limit
        return bool(reply[0])

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        _, previous, previous_ttl, current, current_ttl = await self.call(
            "CL.SLIDING", self.prefixed_key(key), 1, ms(expiry), 0)
        return int(previous), previous_ttl / 1000, int(current), current_ttl / 1000

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self.clear(key)

    async def clear(self, key: str) -> None:
        await self.call("CL.WINCLEAR", self.prefixed_key(key))

    async def reset(self) -> int | None:
        return int(await self.call("CL.WINFLUSH", self.prefixed_key("")))

    async def check(self) -> bool:
        try:
            return bool(await self.client.ping())
        except Exception:
            return False


class AsyncFastlimitClusterStorage(AsyncFastlimitStorage):
    """``async+fastlimit+cluster://host:port[,host:port...]``."""

    STORAGE_SCHEME = ["async+fastlimit+cluster"]

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        parsed = parse_storage_uri(uri)
        if not parsed.locations:
            raise ConfigurationError(f"no host:port in {uri!r}")
        auth = {k: v for k, v in (("username", parsed.username),
                                  ("password", parsed.password)) if v}
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in parsed.locations],
            **{**auth, **options})

    async def reset(self) -> int | None:
        replies = await self.client.execute_command(
            "CL.WINFLUSH", self.prefixed_key(""),
            target_nodes=redis.asyncio.cluster.RedisCluster.PRIMARIES)
        return sum(int(n) for n in (replies.values() if isinstance(replies, dict) else [replies]))


class AsyncFastlimitSentinelStorage(AsyncFastlimitStorage):
    """``async+fastlimit+sentinel://host:port[,host:port...]/service``."""

    STORAGE_SCHEME = ["async+fastlimit+sentinel"]

    def __init__(self, uri: str, key_prefix: str = PREFIX, wrap_exceptions: bool = False,
                 service_name: str | None = None,
                 sentinel_kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        self.service_name = service_name
        self.sentinel_kwargs = sentinel_kwargs or {}
        options.pop("use_replicas", None)
        super().__init__(uri, key_prefix=key_prefix, wrap_exceptions=wrap_exceptions, **options)

    def connect(self, uri: str, options: dict[str, Any]) -> Any:
        self.sentinel, service = sentinel_for(redis.asyncio.sentinel.Sentinel, uri,
                                              self.service_name, self.sentinel_kwargs, options)
        return self.sentinel.master_for(service)
