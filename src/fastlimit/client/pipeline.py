"""``AsyncClient``'s automatic pipelining: ``_Pipeliner`` sends every
command submitted in one event-loop iteration to its server in one write,
and ``_LoopTimeBudget`` bounds the exchange in event-loop time."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from hiredis import pack_command
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from fastlimit.client.aio import AsyncClient
    from fastlimit.client.base import _Node


class _LoopTimeBudget:
    """Expires an ``asyncio.timeout`` after ``budget_s`` of event-loop time
    that was available to notice a reply.

    A plain timer also counts the time the loop spent running other
    callbacks, and a busy asyncio process routinely stalls for a few
    milliseconds: with a 5 ms timeout, healthy servers would time out and
    open the breaker exactly when the service is under load.  So the budget
    is spent in ticks: a tick that fires late (the loop was busy) is charged
    one tick, not the whole delay.  An idle loop still expires on time.
    """

    TICKS = 4

    def __init__(self, timeout: asyncio.Timeout, budget_s: float):
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._tick = budget_s / self.TICKS
        self._left = budget_s
        self._last = self._loop.time()
        self._handle = self._loop.call_at(self._last + self._tick, self._on_tick)

    def _on_tick(self) -> None:
        now = self._loop.time()
        self._left -= min(now - self._last, self._tick)
        self._last = now
        if self._left <= 1e-9:
            self._timeout.reschedule(now)      # expire: the task gets TimeoutError
        else:
            self._handle = self._loop.call_at(now + min(self._tick, self._left),
                                              self._on_tick)

    def cancel(self) -> None:
        self._handle.cancel()


class _Pipeliner:
    """Automatic pipelining for one server: every command submitted in one
    event-loop iteration goes out in one pipeline (one write on one pooled
    connection, no MULTI/EXEC), and each reply goes back to its caller.

    The pipeline is written and read here rather than with redis-py's
    ``pipeline()``, whose per-command Python packing and per-reply timers
    cost about 3x the throughput; redis-py still owns the connections
    (connect, HELLO, AUTH, pooling) and hiredis parses the replies.
    """

    def __init__(self, client: AsyncClient, node: _Node):
        self._client = client
        self._node = node
        self._queue: list[tuple[tuple, asyncio.Future]] = []
        self._flush_scheduled = False
        self._in_flight: set[asyncio.Task] = set()

    def submit(self, command: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((command, future))
        if not self._flush_scheduled:
            # call_soon runs after every callback already queued for this
            # iteration, i.e. after all the tasks that are ready now have
            # had their turn to submit.
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        batch, self._queue, self._flush_scheduled = self._queue, [], False
        task = asyncio.ensure_future(self._send(batch))
        self._in_flight.add(task)          # the loop keeps only weak references
        task.add_done_callback(self._in_flight.discard)

    async def _send(self, batch: list[tuple[tuple, asyncio.Future]]) -> None:
        try:
            replies = await self._round_trip([command for command, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as e:  # noqa: BLE001 - becomes each caller's degraded decision
            self._client._round_trip_failed(self._node, len(batch), e)
            for _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        self._client._round_trip_ok(self._node, len(batch))
        for (_, future), reply in zip(batch, replies, strict=False):
            if not future.done():          # its caller may have been cancelled
                future.set_result(reply)

    async def _round_trip(self, commands: list[tuple]) -> list:
        """One write of every command, then their replies in order.

        Getting a connection (and connecting) is bounded by redis-py's own
        connect and socket timeouts; the exchange by the loop-time budget.
        """
        pool = self._node.redis.connection_pool
        conn = await pool.get_connection()
        try:
            async with asyncio.timeout(None) as timeout:
                budget = _LoopTimeBudget(timeout, self._client.timeout_ms / 1000)
                try:
                    return await self._exchange(conn, commands)
                finally:
                    budget.cancel()
        except BaseException:
            # Replies may still be on their way: this connection must never
            # serve another request.
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    @staticmethod
    async def _exchange(conn, commands: list[tuple]) -> list:
        await conn.send_packed_command(b"".join(map(pack_command, commands)),
                                       check_health=False)
        replies = []
        for _ in commands:
            try:
                # math.inf: no per-reply timer, the budget bounds the batch
                replies.append(await conn.read_response(timeout=math.inf))
            except ResponseError as e:
                replies.append(e)
        return replies

    async def drain(self) -> None:
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
