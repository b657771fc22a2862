"""``AsyncClient``: the asyncio client, pipelined per server
(``pipeline.py``); cluster mode's map is read on first use and refreshed
in background tasks."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import MovedError

from fastlimit.client.base import _ClientBase, _describe, _Node, _Request, log
from fastlimit.client.pipeline import _Pipeliner
from fastlimit.cluster.client import ClusterMapError
from fastlimit.decision import Decision
from fastlimit.embedded import Key, key_bytes
from fastlimit.failover import AsyncSwitchWatcher, parse_address


class AsyncClient(_ClientBase):
    """asyncio client with automatic pipelining: the checks that many tasks
    issue in the same event-loop iteration are sent to each server as one
    pipeline (no MULTI/EXEC) in one write, and each reply goes back to its
    caller, so a busy process needs few round trips.  ``stats.round_trips``
    counts the pipelines, ``stats.commands_sent`` the checks in them.

    ``timeout_ms`` bounds each pipeline's exchange in event-loop time that
    was free to notice the reply (see ``pipeline._LoopTimeBudget``), so a
    loop that is merely busy does not time out a healthy server; connecting
    and the handshake are bounded by ``connect_timeout_ms`` (default:
    timeout_ms).

    Same constructor, policy and results as ``Client``; use it from one
    event loop, and ``await client.aclose()`` (or ``async with``) at the end.
    In cluster mode the slot map is read on first use (the first calls wait
    for it; if no node gives one, calls are answered by the failure policy
    until one does), or by ``await client.initialize()``, which raises
    ``ClusterMapError`` as ``Client()`` does; pipelining is per primary.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._first_map: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    def _new_node(self, name: str, client) -> _Node:
        node = super()._new_node(name, client)
        node.pipeliner = _Pipeliner(self, node)
        return node

    def _redis_client(self, host: str, port: int, options: dict) -> redis.asyncio.Redis:
        return redis.asyncio.Redis(host=host, port=port, **options)

    def _sentinel_manager(self, addresses, options) -> redis.asyncio.sentinel.Sentinel:
        return redis.asyncio.sentinel.Sentinel(addresses, sentinel_kwargs=options)

    def _switch_watcher(self, sentinels, services) -> AsyncSwitchWatcher:
        return AsyncSwitchWatcher(sentinels, services, self._master_switched)

    def _no_retry(self) -> redis.asyncio.retry.Retry:
        return redis.asyncio.retry.Retry(NoBackoff(), 0)

    def _socket_timeout_ms(self) -> float:
        # redis-py's read timeout only bounds the connection handshake here
        # (HELLO, AUTH): exchanges are bounded by the loop-time budget.
        return self.connect_timeout_ms

    async def check(self, key: Key, capacity: int, refill_per_sec: int, cost: int = 1,
                    period_ms: int = 1000, on_failure: str = "open", split: int = 1) -> Decision:
        """See ``Client.check``."""
        key = key_bytes(key)
        request = self._check_request(key, capacity, refill_per_sec, cost, period_ms,
                                      on_failure, split)
        if not self._prefetchable(cost, split):
            return await self._execute(request)
        bucket = (key, capacity, refill_per_sec, period_ms)
        decision = self._spend_prefetched(bucket, cost)
        if decision is None:
            batch = self._batch_request(request, bucket)
            if batch is not None:
                decision = self._batch_answered(bucket, cost, await self._execute(batch))
        return decision if decision is not None else await self._execute(request)

    async def limit(self, client_key: Key, resource: str, tier: str | None = None,
                    cost: int = 1, on_failure: str = "open") -> Decision:
        """See ``Client.limit``."""
        return await self._execute(self._limit_request(client_key, resource, tier, cost,
                                                       on_failure))

    async def _execute(self, request: _Request) -> Decision:
        if self._watcher is not None and not self._watcher.started:
            self._watcher.start()
        node = self._node_for(request.route_key)
        if node is None and (self._first_map is None or not self._first_map.done()):
            node = await self._after_first_map(request.route_key)
        hops = 0
        while True:
            if node is None:
                await asyncio.sleep(0)      # as below: let the loop run
                return self._unmapped(request)
            if node.breaker is not None and not node.breaker.allow():
                # Every answer, even one that skips the network, lets the loop
                # run: a caller checking in a loop must not starve other tasks
                # while the breaker is open.
                await asyncio.sleep(0)
                return self._skipped(node, request)
            pipeliner = node.pipeliner
            assert pipeliner is not None        # AsyncClient gives every node one
            try:
                reply = await pipeliner.submit(request.command)
            except Exception as e:  # noqa: BLE001 - counted by the pipeliner
                return self._degraded(node, request, e)
            target = self._redirect(node, reply, hops) if type(reply) is MovedError else None
            if target is None:
                resent = self._split_learned(request, reply, hops)
                if resent is None:
                    return self._answered(node, request, reply)
                request, target = resent, self._node_for(resent.route_key)
            node, hops = target, hops + 1

    # ---- cluster mode ---------------------------------------------------

    async def initialize(self) -> None:
        """Cluster mode: reads the slot map now; ClusterMapError if no
        startup node gives one covering every slot."""
        if self._cluster is not None:
            await self._load_map()

    async def _after_first_map(self, route_key: bytes) -> _Node | None:
        """The first calls wait for the first map (one read for all of them)."""
        if self._first_map is None:
            self._first_map = asyncio.ensure_future(self._quietly(self._load_map()))
        await asyncio.shield(self._first_map)
        return self._node_for(route_key)

    async def _load_map(self) -> None:
        """Asks each source in turn for CLUSTER SLOTS until one gives a usable map."""
        problems = []
        for address in self._map_sources():
            host, port = parse_address(address)
            asker = redis.asyncio.Redis(host=host, port=port, **self._cluster_options)
            try:
                retired = self._install_map(
                    await asker.execute_command("CLUSTER", "SLOTS"), host)
            except (ClusterMapError, redis.RedisError, OSError) as e:
                problems.append(f"{address}: {_describe(e)}")
                continue
            finally:
                await asker.aclose()
            for node in retired:
                self._in_background(self._close_node(node))
            return
        raise self._no_usable_map(problems)

    async def _quietly(self, loading) -> None:
        try:
            await loading
        except ClusterMapError as e:
            log.warning("fastlimit cluster map not read, the failure policy answers: %s", e)

    def _request_refresh(self) -> None:
        if not self._closed and self._refresh_gate.ask():
            self._in_background(self._refresh())

    async def _refresh(self) -> None:
        again = True
        while again and not self._closed:
            await asyncio.sleep(self._refresh_gate.wait_s())
            await self._quietly(self._load_map())
            again = self._refresh_gate.finished()

    def _in_background(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)          # the loop keeps only weak references
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _close_node(node: _Node) -> None:
        assert node.pipeliner is not None
        await node.pipeliner.drain()
        await node.redis.aclose()

    async def aclose(self) -> None:
        """Waits for the pipelines in flight, then closes every server's
        connections."""
        self._closed = True
        if self._watcher is not None:
            await self._watcher.close()
        # A refresh running now ends within its timeouts and starts no other
        # (the nodes it retires are closed in tasks of their own).
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._first_map is not None:
            await asyncio.gather(self._first_map, return_exceptions=True)
        for node in list(self._nodes.values()):
            await self._close_node(node)
        if self._sentinel is not None:
            await self._sentinel.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
