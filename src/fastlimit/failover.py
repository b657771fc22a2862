"""Following the primary through Redis Sentinel, for ``Client`` and
``AsyncClient``.

redis-py's Sentinel support does the finding: each new connection asks a
sentinel for the service's primary (``SENTINEL MASTERS``), and a
``-READONLY`` reply (a demoted primary) drops the connection so the next
one asks again.  What this module adds is noticing a failover as soon as
the sentinels announce it: a watcher subscribed to ``+switch-master`` on
every sentinel tells the client, which lets the next call probe
the new primary at once instead of waiting out its circuit breaker's
probe interval (the breaker has usually opened while the old primary was
dying).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable

from fastlimit.lazy_redis import redis

log = logging.getLogger("fastlimit.client")

SWITCH_CHANNEL = "+switch-master"
# Between attempts to reach a sentinel that failed.
RETRY_S = 0.5
# How long a watcher waits on its socket at a time (a sync one then checks close()).
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


class _Switches:
    """The primaries announced so far: every sentinel announces the same
    switch (the leader at once, the others when they hear of it), and the
    client should hear of each one once."""

    def __init__(self, services: set[str], on_switch: OnSwitch):
        self.services = services
        self._on_switch = on_switch
        self._known: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def received(self, data) -> None:
        switch = parse_switch(data, self.services)
        if switch is None:
            return
        service, host, port = switch
        with self._lock:
            if self._known.get(service) == (host, port):
                return
            self._known[service] = (host, port)
        self._on_switch(service, host, port)


class SwitchWatcher:
    """Daemon threads, one per sentinel, that follow +switch-master and call
    on_switch(service, host, port) once per switch of the services given.
    All sentinels at once: the one that led the failover announces it
    first, the others up to a hello period (2 s) later."""

    def __init__(self, sentinels: list[redis.Redis], services: set[str], on_switch: OnSwitch):
        self._switches = _Switches(services, on_switch)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._follow, args=(sentinel,), daemon=True,
                                          name="fastlimit-sentinel-watch")
                         for sentinel in sentinels]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=2 * POLL_S)

    def _follow(self, sentinel: redis.Redis) -> None:
        while not self._stop.is_set():
            pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(SWITCH_CHANNEL)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    if message is not None:
                        self._switches.received(message["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                log.debug("sentinel %s: %s; retrying", sentinel, e)
            finally:
                pubsub.close()
            self._stop.wait(RETRY_S)


class AsyncSwitchWatcher:
    """SwitchWatcher as asyncio tasks, started on the client's first call
    (they need the running loop)."""

    def __init__(self, sentinels: list[redis.asyncio.Redis], services: set[str],
                 on_switch: OnSwitch):
        self._sentinels = sentinels
        self._switches = _Switches(services, on_switch)
        self._tasks: list[asyncio.Task] = []

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(sentinel)) for sentinel in self._sentinels]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _follow(self, sentinel: redis.asyncio.Redis) -> None:
        while True:
            pubsub = sentinel.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(SWITCH_CHANNEL)
                while True:
                    message = await pubsub.get_message(timeout=POLL_S)
                    if message is not None:
                        self._switches.received(message["data"])
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                log.debug("sentinel %s: %s; retrying", sentinel, e)
            finally:
                await pubsub.aclose()
            await asyncio.sleep(RETRY_S)
