"""Calls from this node to the other nodes of its cluster (slot maps and
rules are handed over this way), each one bounded in time.

Connections are kept per node, so there are at most as many as the map
names nodes; a node that fails to answer loses its connection and gets
a new one on the next call.  Nodes authenticate to each other with the
password clients use (requirepass), which every node of a cluster shares;
with tls-cluster they call each other's tls-port over TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from fastlimit.cluster.map import Address
from fastlimit.lazy_redis import redis

# A node slower than this is taken as not reachable.
CALL_TIMEOUT_S = 1.0
# At start the server does not listen yet: a peer gets less time.
START_TIMEOUT_S = 0.3


class Peers:
    def __init__(self, password: Callable[[], bytes | None], tls: Callable[[], dict]):
        self.password = password
        self.tls = tls            # redis-py's ssl_* arguments (tls-cluster), or {}
        self._clients: dict[Address, redis.asyncio.Redis] = {}
        self.calls = self.failures = 0

    def _client(self, addr: Address) -> redis.asyncio.Redis:
        client = self._clients.get(addr)
        if client is None:
            client = self._clients[addr] = redis.asyncio.Redis(
                host=addr.host, port=addr.port, password=self.password(),  # type: ignore[arg-type]
                socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S,
                single_connection_client=True,
                retry=redis.asyncio.retry.Retry(redis.backoff.NoBackoff(), 0), **self.tls())
        return client

    async def call(self, addr: Address, *args):
        """One command on one node; raises what redis-py raises (a
        ResponseError for an error reply, ConnectionError/TimeoutError
        when it cannot be reached in time)."""
        self.calls += 1
        try:
            return await asyncio.wait_for(self._client(addr).execute_command(*args),
                                          CALL_TIMEOUT_S * 2)
        except (TimeoutError, redis.ConnectionError, redis.TimeoutError, OSError):
            self.failures += 1
            await self._forget(addr)
            raise

    async def call_each(self, addrs: Iterable[Address], *args) -> dict[Address, Any]:
        """The command on every node at once: each node's reply, or the
        exception its call raised."""
        addrs = list(addrs)
        replies = await asyncio.gather(*(self.call(a, *args) for a in addrs),
                                       return_exceptions=True)
        return dict(zip(addrs, replies, strict=True))

    def call_at_start(self, addr: Address, *args):
        """A blocking call, before the loop runs (catching up at start)."""
        with redis.Redis(host=addr.host, port=addr.port, password=self.password(),  # type: ignore[arg-type]
                         socket_timeout=START_TIMEOUT_S,
                         socket_connect_timeout=START_TIMEOUT_S,
                         retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                         **self.tls()) as client:
            return client.execute_command(*args)

    async def _forget(self, addr: Address) -> None:
        client = self._clients.pop(addr, None)
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def close(self) -> None:
        for addr in list(self._clients):
            await self._forget(addr)


def unreached(replies: dict[Address, object]) -> list[Address]:
    """The nodes whose call failed."""
    return sorted(a for a, r in replies.items() if isinstance(r, BaseException))


def names(addrs: Iterable[Address]) -> str:
    return ", ".join(str(a) for a in addrs)
