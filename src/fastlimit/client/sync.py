"""``Client``: the synchronous client, one redis-py connection pool per
server; cluster mode's map is read at construction and refreshed in a
thread."""

from __future__ import annotations

import threading
import time

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import MovedError, ResponseError
from redis.retry import Retry

from fastlimit.client.base import _ClientBase, _describe, _Request, log
from fastlimit.cluster.client import ClusterMapError
from fastlimit.decision import Decision
from fastlimit.embedded import Key, key_bytes
from fastlimit.failover import SwitchWatcher, parse_address


class Client(_ClientBase):
    """Synchronous client, safe to share between threads (one connection
    pool per server).

    ``servers``: "host:port" or a list of them (consistent hashing).
    ``timeout_ms``: connect and read timeout of every round trip
    (``connect_timeout_ms`` sets the connect part alone).
    ``breaker``: settings for each server's circuit breaker (each gets a
    copy); None disables it.  ``fallback``: a LocalFallback to enforce while
    a server fails; None means the call's ``on_failure`` policy.
    ``preaggregate``: 0 (off), or a batch of tokens to take from the server
    at once and spend locally in ``check``: fewer round trips for coarse
    limits, at the price of overshoot up to instances × batch per window
    (tokens taken earlier are spent later) and of tokens parked unused in
    one instance for up to ``preaggregate_ttl_ms``.
    ``sentinels`` ("host:port" or (host, port) each) and ``service`` (a
    name, or a list hashed like ``servers``) take the place of ``servers``:
    the primary of each service is found through Redis Sentinel and
    followed through failovers; ``sentinel_password`` is the sentinels'
    own, and ``sentinel_timeout_ms`` bounds each question to them.
    ``cluster`` ("host:port" or a list: startup nodes of a fastlimit or
    Redis Cluster) takes the place of ``servers``: the slot map comes from
    ``CLUSTER SLOTS`` (the constructor raises ``ClusterMapError`` if no
    startup node gives one covering every slot), each call goes to its
    key's primary, ``-MOVED`` is followed (up to 5 hops) and refreshes the
    map, as does a failed round trip; ``cluster_timeout_ms`` bounds each
    ``CLUSTER SLOTS``.  Breakers and the failure policy are per primary.
    Other keyword arguments go to ``redis.Redis``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self._cluster is not None:
            try:
                self._load_map()
            except ClusterMapError:
                self.close()
                raise
        if self._watcher is not None:
            self._watcher.start()

    def _redis_client(self, host: str, port: int, options: dict) -> redis.Redis:
        return redis.Redis(host=host, port=port, **options)

    def _sentinel_manager(self, addresses, options) -> redis.sentinel.Sentinel:
        return redis.sentinel.Sentinel(addresses, sentinel_kwargs=options)

    def _switch_watcher(self, sentinels, services) -> SwitchWatcher:
        return SwitchWatcher(sentinels, services, self._master_switched)

    def _no_retry(self) -> Retry:
        return Retry(NoBackoff(), 0)

    def check(self, key: Key, capacity: int, refill_per_sec: int, cost: int = 1,
              period_ms: int = 1000, on_failure: str = "open", split: int = 1) -> Decision:
        """``CL.CHECK``: spend ``cost`` tokens of ``key``'s bucket, which holds
        ``capacity`` and gains ``refill_per_sec`` every ``period_ms``;
        ``split`` k makes it k sub-buckets (README "Split keys"), and in
        cluster mode this client picks one, so the check goes to its shard."""
        key = key_bytes(key)
        request = self._check_request(key, capacity, refill_per_sec, cost, period_ms,
                                      on_failure, split)
        if not self._prefetchable(cost, split):
            return self._execute(request)
        bucket = (key, capacity, refill_per_sec, period_ms)
        decision = self._spend_prefetched(bucket, cost)
        if decision is None:
            batch = self._batch_request(request, bucket)
            if batch is not None:
                decision = self._batch_answered(bucket, cost, self._execute(batch))
        return decision if decision is not None else self._execute(request)

    def limit(self, client_key: Key, resource: str, tier: str | None = None,
              cost: int = 1, on_failure: str = "open") -> Decision:
        """``CL.LIMIT``: check ``client_key`` against the server's rules for
        ``resource`` (and ``tier``); all matching rules or none."""
        return self._execute(self._limit_request(client_key, resource, tier, cost,
                                                 on_failure))

    def _execute(self, request: _Request) -> Decision:
        node = self._node_for(request.route_key)
        hops = 0
        while True:
            if node is None:
                return self._unmapped(request)
            if node.breaker is not None and not node.breaker.allow():
                return self._skipped(node, request)
            try:
                reply = node.redis.execute_command(*request.command)
            except ResponseError as e:
                reply = e
            except Exception as e:  # noqa: BLE001 - a limiter failure must not fail the caller
                self._round_trip_failed(node, 1, e)
                return self._degraded(node, request, e)
            self._round_trip_ok(node, 1)
            target = self._redirect(node, reply, hops) if type(reply) is MovedError else None
            if target is None:
                resent = self._split_learned(request, reply, hops)
                if resent is None:
                    return self._answered(node, request, reply)
                request, target = resent, self._node_for(resent.route_key)
            node, hops = target, hops + 1

    # ---- cluster mode ---------------------------------------------------

    def _load_map(self) -> None:
        """Asks each source in turn for CLUSTER SLOTS until one gives a usable map."""
        problems = []
        for address in self._map_sources():
            host, port = parse_address(address)
            asker = redis.Redis(host=host, port=port, **self._cluster_options)
            try:
                retired = self._install_map(asker.execute_command("CLUSTER", "SLOTS"), host)
            except (ClusterMapError, redis.RedisError, OSError) as e:
                problems.append(f"{address}: {_describe(e)}")
                continue
            finally:
                asker.close()
            for node in retired:
                node.redis.close()
            return
        raise self._no_usable_map(problems)

    def _request_refresh(self) -> None:
        if self._refresh_gate.ask():
            threading.Thread(target=self._refresh, name="fastlimit-cluster-map",
                             daemon=True).start()

    def _refresh(self) -> None:
        again = True
        while again and not self._closed:
            time.sleep(self._refresh_gate.wait_s())
            try:
                self._load_map()
            except ClusterMapError as e:
                log.warning("fastlimit cluster map not refreshed, the old one stays: %s", e)
            again = self._refresh_gate.finished()

    def close(self) -> None:
        """Closes every server's connections (and the sentinels')."""
        self._closed = True
        if self._watcher is not None:
            self._watcher.close()
        for node in list(self._nodes.values()):
            node.redis.close()
        if self._sentinel is not None:
            self._sentinel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
