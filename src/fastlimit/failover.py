"""Following the primary through Redis Sentinel, for ``Client`` and
``AsyncClient``.

redis-py's Sentinel support does the finding: each new connection asks a
sentinel for the service's primary (``SENTINEL MASTERS``), and a
``-READONLY`` reply (a demoted primary) drops the connection so the next
one asks again.  What this module adds is noticing a failover as soon as
the sentinels announce it: a watcher subscribed to ``+switch-master`` on
one sentinel at a time tells the client, which lets the next call probe
the new primary at once instead of waiting out its circuit breaker's
probe interval (the breaker has usually opened while the old primary was
dying).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

import redis
import redis.asyncio
from redis.exceptions import ConnectionError, TimeoutError

log = logging.getLogger("fastlimit.client")

SWITCH_CHANNEL = "+switch-master"
# Between attempts to reach any sentinel, once all of them failed.
RETRY_S = 0.5
# How often a sync watcher looks up from its socket to notice close().
POLL_S = 0.5

OnSwitch = Callable[[str, str, int], None]


def parse_address(address: str | tuple[str, int], what: str = "server") -> tuple[str, int]:
    """"host:port" (IPv6 as "[::1]:6380") or (host, port) -> (host, port)."""
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"a {what} is 'host:port', not {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def sentinel_list(sentinels: Iterable[str | tuple[str, int]]) -> list[tuple[str, int]]:
    """The sentinels' addresses; ValueError if there are none."""
    addresses = [parse_address(s, "sentinel") for s in sentinels]
    if not addresses:
        raise ValueError("at least one sentinel is needed")
    return addresses


def parse_switch(data: bytes | str, services: set[str]) -> tuple[str, str, int] | None:
    """``<name> <old-ip> <old-port> <new-ip> <new-port>`` -> (name, new ip,
    new port) when name is one of services; else None."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    parts = data.split()
    if len(parts) != 5 or not parts[4].isdigit() or parts[0] not in services:
        return None
    return parts[0], parts[3], int(parts[4])


class SwitchWatcher:
    """A daemon thread that follows +switch-master on the sentinels (one at
    a time, the next when one fails) and calls on_switch(service, host,
    port) for the services it was given."""

    def __init__(self, sentinels: list[redis.Redis], services: set[str], on_switch: OnSwitch):
        self._sentinels = sentinels
        self._services = services
        self._on_switch = on_switch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastlimit-sentinel-watch",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * POLL_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            for sentinel in self._sentinels:
                self._follow(sentinel)
                if self._stop.is_set():
                    return
            self._stop.wait(RETRY_S)

    def _follow(self, sentinel: redis.Redis) -> None:
        pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(SWITCH_CHANNEL)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=POLL_S)
                switch = message and parse_switch(message["data"], self._services)
                if switch:
                    self._on_switch(*switch)
        except (ConnectionError, TimeoutError, OSError) as e:
            log.debug("sentinel %s: %s; trying the next one", sentinel, e)
        finally:
            pubsub.close()


class AsyncSwitchWatcher:
    """SwitchWatcher as an asyncio task, started on the client's first call
    (it needs the running loop)."""

    def __init__(self, sentinels: list[redis.asyncio.Redis], services: set[str],
                 on_switch: OnSwitch):
        self._sentinels = sentinels
        self._services = services
        self._on_switch = on_switch
        self._task: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            for sentinel in self._sentinels:
                await self._follow(sentinel)
            await asyncio.sleep(RETRY_S)

    async def _follow(self, sentinel: redis.asyncio.Redis) -> None:
        pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(SWITCH_CHANNEL)
            while True:
                message = await pubsub.get_message(timeout=None)
                switch = message and parse_switch(message["data"], self._services)
                if switch:
                    self._on_switch(*switch)
        except (ConnectionError, TimeoutError, OSError) as e:
            log.debug("sentinel %s: %s; trying the next one", sentinel, e)
        finally:
            await pubsub.aclose()
