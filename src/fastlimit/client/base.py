"""Python clients for fastlimit servers: ``Client`` (sync) and
``AsyncClient`` (asyncio), on redis-py with hiredis.

Both answer every call with a ``Decision`` and never raise for a failing
server: with short timeouts (5 ms by default) a failed round trip becomes a
decision by policy, and a circuit breaker per server stops later calls from
paying the timeout at all while the server is down:

- a ``LocalFallback``, when configured, enforces a stricter limit in this
  process (source ``"local_fallback"``);
- otherwise ``on_failure="open"`` allows (source ``"failed_open"``, for
  product limits) and ``on_failure="closed"`` denies (``"failed_closed"``,
  for security limits: login, password reset, SMS).

Every such decision is counted in ``client.stats`` and logged at ERROR on
the ``fastlimit.client`` logger, at most once per second with the counts
since the previous line, so an outage cannot flood the log.

With several servers, keys are spread by consistent hashing: one key (the
client key, for ``limit``) always goes to the same server, and adding a
server moves about 1/N of the keys.

With ``sentinels=[...]`` and ``service="name"`` (or several names, hashed
the same way), the client asks Redis Sentinel where each service's
primary is and follows it through failovers (see ``failover.py``).

With ``cluster=[...]`` (startup nodes of a fastlimit or Redis Cluster),
keys go where the cluster's slot map says, and ``-MOVED`` replies are
followed (see ``cluster/client.py``); the breaker and the failure policy
are per primary, so one dead shard leaves the others' keys answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from hiredis import pack_command
from redis.backoff import NoBackoff
from redis.exceptions import MovedError, ResponseError
from redis.retry import Retry

from fastlimit.breaker import CircuitBreaker
from fastlimit.cluster.client import (
    DEFAULT_CLUSTER_TIMEOUT_MS,
    MAX_REDIRECTS,
    SLOTS,
    ClusterMapError,
    RefreshGate,
    SlotMap,
    primaries_by_slot,
)
from fastlimit.decision import FAILED_CLOSED, FAILED_OPEN, SERVER, Decision
from fastlimit.embedded import Key, LocalFallback, check_on_failure, key_bytes
from fastlimit.failover import AsyncSwitchWatcher, SwitchWatcher, parse_address, sentinel_list
from fastlimit.ring import DEFAULT_VNODES, HashRing

__all__ = ["AsyncClient", "CircuitBreaker", "Client", "ClusterMapError", "Decision",
           "LocalFallback", "Stats"]

log = logging.getLogger("fastlimit.client")

DEFAULT_SERVER = "127.0.0.1:6380"
DEFAULT_TIMEOUT_MS = 5
# A sentinel answers where the primary is on each new connection.
DEFAULT_SENTINEL_TIMEOUT_MS = 100
# A template: each server gets its own copy (CircuitBreaker.copy).
DEFAULT_BREAKER = CircuitBreaker(failures=5, window_s=1.0, probe_every_s=5.0)
# What a failed-closed decision tells the caller to wait (Retry-After: 1).
FAILED_RETRY_MS = 1000
# limit (and remaining) of a failed limit() call: the rules, and so the
# numbers, are on the server.  The server's CL.LIMIT says -1 too when no rule
# matches.
UNKNOWN_LIMIT = -1
FAILURE_LOG_INTERVAL_S = 1.0

Servers = str | Iterable[str]


@dataclass
class Stats:
    """Counters of one client, safe to read at any time."""

    server: int = 0          # decisions from a server (pre-fetched ones included)
    prefetched: int = 0      # ... of which were spent from a pre-fetched batch
    local_fallback: int = 0  # decisions by the LocalFallback while a server failed
    failed_open: int = 0     # allowed without an answer
    failed_closed: int = 0   # denied without an answer
    round_trips: int = 0     # network attempts: a sync call, or one async pipeline
    commands_sent: int = 0   # commands in those round trips
    errors: int = 0          # failed round trips (refused, timed out, dropped)
    error_replies: int = 0   # error replies from a live server (unknown command, bad argument)
    breaker_skips: int = 0   # calls that skipped the network: the server's breaker was open
    master_switches: int = 0  # failovers the sentinels announced (+switch-master)
    moved: int = 0           # MOVED replies followed to another node (cluster mode)
    map_refreshes: int = 0   # slot maps read from CLUSTER SLOTS (cluster mode)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def incr(self, name: str, n: int = 1) -> None:
        """Adds n to one counter (thread-safe)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        """Every counter by name, for logging or metrics."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name[0] != "_"}


class _FailureLog:
    """One loud line per interval with the counts since the previous one."""

    def __init__(self, interval_s: float = FAILURE_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        self._counts: Counter[str] = Counter()
        self._next = 0.0
        self._lock = threading.Lock()

    def record(self, source: str, server: str, error: BaseException | str) -> None:
        with self._lock:
            self._counts[source] += 1
            now = self.clock()
            if now < self._next:
                return
            counts = self._counts
            self._counts, self._next = Counter(), now + self.interval_s
        summary = ", ".join(f"{n} {source}" for source, n in sorted(counts.items()))
        log.error("fastlimit server %s is failing (%s): %s decision(s) since the last report",
                  server, _describe(error), summary)


def _describe(error: BaseException | str) -> str:
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


class _Held:
    """Pre-fetched tokens of one bucket, and the server's answer with them."""

    __slots__ = ("tokens", "expires", "limit", "remaining", "reset_after_ms", "refused")

    def __init__(self, tokens: int, expires: float, answer: Decision):
        self.tokens = tokens
        self.expires = expires
        self.limit = answer.limit
        self.remaining = answer.remaining
        self.reset_after_ms = answer.reset_after_ms
        self.refused = not answer.allowed       # the server refused a batch


class _Prefetch:
    """Local pre-aggregation: tokens taken from the server in batches
    (one ``COST batch`` check) and spent here without a round trip.

    Tokens held here were counted by the server when they were taken, so a
    bucket can admit, within any window, up to ``instances × batch`` more
    than its limit (each instance spending a batch taken earlier), and
    tokens one instance holds are unavailable to the others until spent or
    expired (``ttl_s``).  Only for coarse limits; off by default.  Once the
    server refuses a batch, the bucket is near its limit: until the ttl
    passes, calls ask for their own cost only (one round trip, exact).
    """

    PRUNE_EVERY = 1024

    def __init__(self, batch: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        if batch < 1:
            raise ValueError("preaggregate must be >= 1 (or 0 for off)")
        self.batch = batch
        self.ttl_s = ttl_s
        self.clock = clock
        self._held: dict[tuple, _Held] = {}
        self._stored = 0
        self._lock = threading.Lock()

    def spend(self, bucket: tuple, cost: int) -> Decision | None:
        with self._lock:
            held = self._held.get(bucket)
            if held is None or held.tokens < cost or held.expires <= self.clock():
                return None
            held.tokens -= cost
            return Decision(True, held.limit, held.remaining + held.tokens, 0,
                            held.reset_after_ms, SERVER)

    def near_limit(self, bucket: tuple) -> bool:
        """A batch was refused lately: not worth asking for another."""
        held = self._held.get(bucket)
        return held is not None and held.refused and held.expires > self.clock()

    def keep(self, bucket: tuple, tokens: int, granted: Decision) -> Decision:
        """Holds the rest of a granted batch; the answer counts it as remaining."""
        self._store(bucket, _Held(tokens, self.clock() + self.ttl_s, granted))
        return Decision(True, granted.limit, granted.remaining + tokens, 0,
                        granted.reset_after_ms, SERVER)

    def refused(self, bucket: tuple, denied: Decision) -> None:
        self._store(bucket, _Held(0, self.clock() + self.ttl_s, denied))

    def _store(self, bucket: tuple, held: _Held) -> None:
        with self._lock:
            self._held[bucket] = held
            self._stored += 1
            if self._stored % self.PRUNE_EVERY == 0:
                now = self.clock()
                self._held = {b: h for b, h in self._held.items() if h.expires > now}


class _Request:
    """One call: the command for the server, the key that picks the server,
    and what to answer if the server cannot."""

    __slots__ = ("route_key", "command", "limit", "on_failure", "local")

    def __init__(self, route_key: bytes, command: tuple, limit: int, on_failure: str,
                 local: Callable[[], Decision | None] | None):
        self.route_key = route_key
        self.command = command
        self.limit = limit            # for failed_* decisions; UNKNOWN_LIMIT for limit()
        self.on_failure = on_failure
        self.local = local            # the LocalFallback's answer, if there is one

    def with_command(self, command: tuple) -> _Request:
        """Another command for the same call (a pre-fetch batch): the
        fallback still charges the caller's own cost."""
        return _Request(self.route_key, command, self.limit, self.on_failure, self.local)


class _Node:
    """One server: its redis-py client, breaker and (async) pipeliner."""

    __slots__ = ("name", "redis", "breaker", "pipeliner")

    def __init__(self, name: str, client, breaker: CircuitBreaker | None):
        self.name = name
        self.redis = client
        self.breaker = breaker
        self.pipeliner: _Pipeliner | None = None


def check_command(key: bytes, capacity: int, refill_per_sec: int, cost: int,
                  period_ms: int) -> tuple:
    """CL.CHECK's arguments; the defaults are left off the wire."""
    command: tuple[str | bytes | int, ...] = ("CL.CHECK", key, capacity, refill_per_sec)
    if cost != 1:
        command += ("COST", cost)
    if period_ms != 1000:
        command += ("PERIOD", period_ms)
    return command


def _names(names: Servers | None, what: str) -> list[str]:
    names = [names] if isinstance(names, str) else list(names or ())
    if not names:
        raise ValueError(f"at least one {what} is needed")
    return names


def _server_list(servers: Servers) -> list[str]:
    names = _names(servers, "server")
    for name in names:
        parse_address(name)
    return names


class _ClientBase:
    """What Client and AsyncClient share: routing, requests, policy."""

    def __init__(self, servers: Servers = DEFAULT_SERVER, password: str | None = None,
                 timeout_ms: float = DEFAULT_TIMEOUT_MS,
                 breaker: CircuitBreaker | None = DEFAULT_BREAKER,
                 fallback: LocalFallback | None = None, *,
                 connect_timeout_ms: float | None = None, preaggregate: int = 0,
                 preaggregate_ttl_ms: int = 1000, vnodes: int = DEFAULT_VNODES,
                 sentinels: Iterable[str | tuple[str, int]] | None = None,
                 service: Servers | None = None, sentinel_password: str | None = None,
                 sentinel_timeout_ms: float = DEFAULT_SENTINEL_TIMEOUT_MS,
                 cluster: Servers | None = None,
                 cluster_timeout_ms: float = DEFAULT_CLUSTER_TIMEOUT_MS,
                 **redis_kwargs):
        if cluster is not None and sentinels is not None:
            raise ValueError("cluster= and sentinels= exclude each other: a cluster's "
                             "nodes say who serves which slot")
        self._cluster = _server_list(cluster) if cluster is not None else None
        names = (_server_list(servers) if sentinels is None else _names(service, "service")
                 ) if cluster is None else []
        self.stats = Stats()
        self.fallback = fallback
        self.timeout_ms = timeout_ms
        self._ring = HashRing(names, vnodes) if len(names) > 1 else None
        self._only = names[0] if len(names) == 1 else None
        self.connect_timeout_ms = connect_timeout_ms or timeout_ms
        options = dict(password=password, retry=self._no_retry(),
                       socket_timeout=self._socket_timeout_ms() / 1000,
                       socket_connect_timeout=self.connect_timeout_ms / 1000)
        # No retries: a failed round trip goes straight to the policy; the
        # breaker, not a retry loop, decides when to try again.
        options.update(redis_kwargs)
        self._options = options
        self._breaker = breaker
        if sentinels is None:
            self._sentinel = None
            clients = {name: self._redis_client(*parse_address(name), options)
                       for name in names}
        else:
            self._sentinel = self._sentinel_manager(sentinel_list(sentinels), dict(
                password=sentinel_password, socket_timeout=sentinel_timeout_ms / 1000,
                socket_connect_timeout=sentinel_timeout_ms / 1000))
            clients = {name: self._sentinel.master_for(name, **options) for name in names}
        self._nodes = {name: self._new_node(name, clients[name]) for name in names}
        self._watcher = (self._switch_watcher(self._sentinel.sentinels, set(names))
                         if self._sentinel is not None else None)
        # Cluster mode: the map, the primaries' nodes in self._nodes, and
        # what questions about the map are asked with.
        self._slot_map: SlotMap[_Node] | None = None
        self._refresh_gate = RefreshGate()
        self._topology_lock = threading.Lock()
        self._cluster_options = dict(options, socket_timeout=cluster_timeout_ms / 1000,
                                     socket_connect_timeout=cluster_timeout_ms / 1000)
        self._closed = False
        self._prefetch = (_Prefetch(preaggregate, preaggregate_ttl_ms / 1000)
                          if preaggregate else None)
        self._failure_log = _FailureLog()

    def _new_node(self, name: str, client) -> _Node:
        breaker = self._breaker
        return _Node(name, client, breaker.copy() if breaker is not None else None)

    def _redis_client(self, host: str, port: int, options: dict):
        raise NotImplementedError

    def _sentinel_manager(self, addresses: list[tuple[str, int]], options: dict):
        raise NotImplementedError

    def _switch_watcher(self, sentinels: list, services: set[str]):
        raise NotImplementedError

    def _master_switched(self, service: str, host: str, port: int) -> None:
        """The sentinels moved service's primary to host:port: the next call
        may try it at once, whatever the breaker's last probe said."""
        self.stats.incr("master_switches")
        log.warning("fastlimit service %s: Sentinel moved the primary to %s:%d",
                    service, host, port)
        breaker = self._nodes[service].breaker
        if breaker is not None:
            breaker.probe_now()

    def _no_retry(self):
        raise NotImplementedError

    def _socket_timeout_ms(self) -> float:
        """redis-py's read timeout."""
        return self.timeout_ms

    # ---- routing ------------------------------------------------------

    @property
    def servers(self) -> list[str]:
        return list(self._nodes)

    @property
    def breakers(self) -> dict[str, CircuitBreaker | None]:
        """Each server's own breaker."""
        return {name: node.breaker for name, node in self._nodes.items()}

    def server_for(self, key: Key) -> str:
        """The server that owns ``key`` (the client key, for ``limit``);
        ClusterMapError in cluster mode while no slot map is known."""
        node = self._node_for(key_bytes(key))
        if node is None:
            raise ClusterMapError("no slot map yet: no cluster node has answered CLUSTER SLOTS")
        return node.name

    def _node_for(self, route_key: bytes) -> _Node | None:
        """The key's node; None in cluster mode before any map is known."""
        if self._only is not None:
            return self._nodes[self._only]
        if self._ring is not None:
            return self._nodes[self._ring.node_for(route_key)]
        slot_map = self._slot_map
        return None if slot_map is None else slot_map.node_for(route_key)

    # ---- cluster mode ---------------------------------------------------

    def _redirect(self, node: _Node, moved: MovedError, hops: int) -> _Node | None:
        """The node to re-send to after node's MOVED reply, or None: not in
        cluster mode, or too many hops (the reply is then an error reply)."""
        if self._cluster is None or hops >= MAX_REDIRECTS or not 0 <= moved.slot_id < SLOTS:
            return None
        self.stats.incr("moved")
        # "MOVED 3999 :6381": an unknown endpoint, the host of the node asked (Redis 7)
        host, port = moved.host or parse_address(node.name)[0], moved.port
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        with self._topology_lock:
            node = self._cluster_node(address)
            if self._slot_map is not None:
                self._slot_map = self._slot_map.moved(moved.slot_id, node)
        self._request_refresh()
        return node

    def _cluster_node(self, address: str) -> _Node:
        """The node of one primary, made on first sight (topology lock held)."""
        node = self._nodes.get(address)
        if node is None:
            client = self._redis_client(*parse_address(address), self._options)
            node = self._nodes[address] = self._new_node(address, client)
        return node

    def _map_sources(self) -> list[str]:
        """Whom to ask for the map, in turn: the primaries known (a MOVED's
        target among them), then the startup nodes."""
        known = [n.name for n in self._slot_map.nodes] if self._slot_map is not None else []
        assert self._cluster is not None
        return list(dict.fromkeys([*known, *self._cluster]))

    def _install_map(self, reply, asked_host: str) -> list[_Node]:
        """A CLUSTER SLOTS reply becomes the map (ClusterMapError if it cannot
        be); returns the nodes it no longer names, for closing."""
        addresses, slots = primaries_by_slot(reply, asked_host)
        with self._topology_lock:
            nodes = [self._cluster_node(address) for address in addresses]
            named = set(addresses)
            retired = [node for name, node in self._nodes.items() if name not in named]
            for node in retired:
                del self._nodes[node.name]
            self._slot_map = SlotMap(nodes, slots)
        self.stats.incr("map_refreshes")
        return retired

    @staticmethod
    def _no_usable_map(problems: list[str]) -> ClusterMapError:
        return ClusterMapError("no cluster node gave a slot map covering every slot: "
                               + "; ".join(problems))

    def _request_refresh(self) -> None:
        """Asks for the map again, in the background (coalesced)."""
        raise NotImplementedError

    def _unmapped(self, request: _Request) -> Decision:
        """No map yet: the failure policy answers, and a refresh is asked for."""
        self._request_refresh()
        return self._degraded(None, request, "no slot map yet")

    # ---- requests -----------------------------------------------------

    def _check_request(self, key: bytes, capacity: int, refill_per_sec: int, cost: int,
                       period_ms: int, on_failure: str) -> _Request:
        check_on_failure(on_failure)
        fallback = self.fallback
        local = None if fallback is None else (
            lambda: fallback.check(key, capacity, refill_per_sec, cost, period_ms))
        return _Request(key, check_command(key, capacity, refill_per_sec, cost, period_ms),
                        capacity, on_failure, local)

    def _limit_request(self, client_key: Key, resource: str, tier: str | None,
                       cost: int, on_failure: str) -> _Request:
        check_on_failure(on_failure)
        client_key = key_bytes(client_key)
        command: tuple[str | bytes | int, ...] = ("CL.LIMIT", client_key, resource)
        if tier is not None:
            command += ("TIER", tier)
        if cost != 1:
            command += ("COST", cost)
        fallback = self.fallback
        local = None if fallback is None else (
            lambda: fallback.limit(client_key, resource, tier, cost))
        return _Request(client_key, command, UNKNOWN_LIMIT, on_failure, local)

    # ---- pre-aggregation (check only) ------------------------------------

    def _prefetchable(self, cost: int) -> bool:
        return self._prefetch is not None and 0 < cost <= self._prefetch.batch

    def _spend_prefetched(self, bucket: tuple, cost: int) -> Decision | None:
        prefetch = self._prefetch
        assert prefetch is not None         # callers ask _prefetchable() first
        decision = prefetch.spend(bucket, cost)
        if decision is not None:
            self.stats.incr("prefetched")
            self.stats.incr("server")
        return decision

    def _batch_request(self, request: _Request, bucket: tuple) -> _Request | None:
        """The request for a whole batch, or None near the limit (ask for
        the call's own cost instead)."""
        prefetch = self._prefetch
        assert prefetch is not None         # callers ask _prefetchable() first
        if prefetch.near_limit(bucket):
            return None
        key, capacity, refill_per_sec, period_ms = bucket
        return request.with_command(check_command(key, capacity, refill_per_sec,
                                                  prefetch.batch, period_ms))

    def _batch_answered(self, bucket: tuple, cost: int, granted: Decision) -> Decision | None:
        """The call's decision from a batch's answer, or None: the batch did
        not fit, ask for the call's own cost."""
        if granted.source != SERVER:
            return granted                  # the failure policy has answered
        prefetch = self._prefetch
        assert prefetch is not None         # callers ask _prefetchable() first
        if granted.allowed:
            return prefetch.keep(bucket, prefetch.batch - cost, granted)
        prefetch.refused(bucket, granted)
        return None

    # ---- outcomes -----------------------------------------------------

    def _round_trip_ok(self, node: _Node, commands: int) -> None:
        self.stats.incr("round_trips")
        self.stats.incr("commands_sent", commands)
        if node.breaker is not None and node.breaker.record_success():
            log.warning("fastlimit server %s answers again: circuit breaker closed", node.name)

    def _round_trip_failed(self, node: _Node, commands: int, error: BaseException) -> None:
        self.stats.incr("round_trips")
        self.stats.incr("commands_sent", commands)
        self.stats.incr("errors")
        if self._cluster is not None:
            self._request_refresh()     # a failover or a reshard may have moved its slots
        if node.breaker is not None and node.breaker.record_failure():
            b = node.breaker
            log.error("fastlimit server %s failed %d times within %.1fs (%s): circuit "
                      "breaker open, calls skip it and probe every %.1fs",
                      node.name, b.failures, b.window_s, _describe(error), b.probe_every_s)

    def _answered(self, node: _Node, request: _Request, reply) -> Decision:
        """A reply from a live server: a decision, or an error reply."""
        if not isinstance(reply, Exception):
            try:
                decision = Decision.from_reply(reply)
            except (TypeError, ValueError) as e:
                reply = ResponseError(f"unexpected reply {reply!r} ({e})")
            else:
                self.stats.incr("server")
                return decision
        # The server is up (the breaker is fine) but could not decide:
        # an older server without CL.LIMIT, or arguments out of bounds.
        self.stats.incr("error_replies")
        return self._degraded(node, request, reply)

    def _skipped(self, node: _Node, request: _Request) -> Decision:
        self.stats.incr("breaker_skips")
        if self._cluster is not None:
            # The map may name another primary by now (a failover): the
            # refresh, not the breaker's next probe, finds out.
            self._request_refresh()
        return self._degraded(node, request, "circuit breaker open")

    def _degraded(self, node: _Node | None, request: _Request,
                  error: BaseException | str) -> Decision:
        """The decision without the server: fallback, else the policy."""
        decision = request.local() if request.local is not None else None
        if decision is None:
            if request.on_failure == "closed":
                decision = Decision(False, request.limit, 0, FAILED_RETRY_MS,
                                    FAILED_RETRY_MS, FAILED_CLOSED)
            else:   # nothing known to be spent: remaining is the limit (-1 if unknown)
                decision = Decision(True, request.limit, request.limit, 0, 0, FAILED_OPEN)
        self.stats.incr(decision.source)
        self._failure_log.record(decision.source, "cluster" if node is None else node.name,
                                 error)
        return decision


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
              period_ms: int = 1000, on_failure: str = "open") -> Decision:
        """``CL.CHECK``: spend ``cost`` tokens of ``key``'s bucket, which holds
        ``capacity`` and gains ``refill_per_sec`` every ``period_ms``."""
        key = key_bytes(key)
        request = self._check_request(key, capacity, refill_per_sec, cost, period_ms,
                                      on_failure)
        if not self._prefetchable(cost):
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
                return self._answered(node, request, reply)
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


class AsyncClient(_ClientBase):
    """asyncio client with automatic pipelining: the checks that many tasks
    issue in the same event-loop iteration are sent to each server as one
    pipeline (no MULTI/EXEC) in one write, and each reply goes back to its
    caller, so a busy process needs few round trips.  ``stats.round_trips``
    counts the pipelines, ``stats.commands_sent`` the checks in them.

    ``timeout_ms`` bounds each pipeline's exchange in event-loop time that
    was free to notice the reply (see ``_LoopTimeBudget``), so a loop that
    is merely busy does not time out a healthy server; connecting and the
    handshake are bounded by ``connect_timeout_ms`` (default: timeout_ms).

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
                    period_ms: int = 1000, on_failure: str = "open") -> Decision:
        """See ``Client.check``."""
        key = key_bytes(key)
        request = self._check_request(key, capacity, refill_per_sec, cost, period_ms,
                                      on_failure)
        if not self._prefetchable(cost):
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
                return self._answered(node, request, reply)
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
