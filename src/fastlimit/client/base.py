"""What ``Client`` and ``AsyncClient`` share: the constructor's options,
``Stats`` and the failure log, a call's request (``_Request``) and its
server (``_Node``), and ``_ClientBase``: routing (one server, the hash
ring, or the cluster's slot map), the commands, pre-aggregation's check
path, and the outcomes (a reply becomes a ``Decision``; a failed round
trip, an error reply or an open breaker becomes the fallback's or the
failure policy's).  No network I/O of its own: ``sync.py`` and ``aio.py``
talk to the servers."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from redis.exceptions import MovedError, ResponseError

from fastlimit._load import PRIORITIES, SHED_REMAINING
from fastlimit.breaker import CircuitBreaker
from fastlimit.client.prefetch import _Prefetch
from fastlimit.client.split_keys import SplitKeys, random_subkey, split_refusal
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
from fastlimit.failover import parse_address, sentinel_list
from fastlimit.ring import DEFAULT_VNODES, HashRing

if TYPE_CHECKING:
    from fastlimit.client.pipeline import _Pipeliner

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
    split_learned: int = 0   # "-SPLIT k" replies resent on a sub-key (cluster mode)
    shed: int = 0            # checks an overloaded server shed (then the failure policy's)
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

class _Request:
    """One call: the command for the server, the key that picks the server,
    and what to answer if the server cannot."""

    __slots__ = ("route_key", "command", "limit", "on_failure", "local", "split_id")

    def __init__(self, route_key: bytes, command: tuple, limit: int, on_failure: str,
                 local: Callable[[], Decision | None] | None, split_id: tuple | None = None):
        self.route_key = route_key
        self.command = command
        self.limit = limit            # for failed_* decisions; UNKNOWN_LIMIT for limit()
        self.on_failure = on_failure
        self.local = local            # the LocalFallback's answer, if there is one
        self.split_id = split_id      # CL.LIMIT's (client key, resource, tier): SplitKeys

    def with_command(self, command: tuple) -> _Request:
        """Another command for the same call (a pre-fetch batch): the
        fallback still charges the caller's own cost."""
        return _Request(self.route_key, command, self.limit, self.on_failure, self.local,
                        self.split_id)

    def on_subkey(self, sub: bytes) -> _Request:
        """The same call on a sub-key of its key (command[1]), routed by it."""
        return _Request(sub, (self.command[0], sub, *self.command[2:]), self.limit,
                        self.on_failure, self.local)


class _Node:
    """One server: its redis-py client, breaker and (async) pipeliner."""

    __slots__ = ("name", "redis", "breaker", "pipeliner")

    def __init__(self, name: str, client, breaker: CircuitBreaker | None):
        self.name = name
        self.redis = client
        self.breaker = breaker
        self.pipeliner: _Pipeliner | None = None


def check_command(key: bytes, capacity: int, refill_per_sec: int, cost: int,
                  period_ms: int, split: int = 1, priority: str | None = None) -> tuple:
    """CL.CHECK's arguments; the defaults are left off the wire."""
    command: tuple[str | bytes | int, ...] = ("CL.CHECK", key, capacity, refill_per_sec)
    if cost != 1:
        command += ("COST", cost)
    if period_ms != 1000:
        command += ("PERIOD", period_ms)
    if split != 1:
        command += ("SPLIT", split)
    if priority is not None:
        command += ("PRIORITY", priority)
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
                 priority: str | None = None,
                 **redis_kwargs):
        if priority is not None and priority not in PRIORITIES:
            raise ValueError("priority must be one of " + ", ".join(PRIORITIES))
        # every check's PRIORITY (README "Overload"); None: the server's default
        self.priority = priority
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
        self._splits = SplitKeys()

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
                       period_ms: int, on_failure: str, split: int = 1) -> _Request:
        check_on_failure(on_failure)
        fallback = self.fallback
        local = None if fallback is None else (
            lambda: fallback.check(key, capacity, refill_per_sec, cost, period_ms))
        request = _Request(key, check_command(key, capacity, refill_per_sec, cost, period_ms,
                                              split, self.priority), capacity, on_failure, local)
        if split > 1 and self._cluster is not None:
            # its sub-buckets are on several shards: this client picks one
            return request.on_subkey(random_subkey(key, split))
        return request

    def _limit_request(self, client_key: Key, resource: str, tier: str | None,
                       cost: int, on_failure: str) -> _Request:
        check_on_failure(on_failure)
        client_key = key_bytes(client_key)
        command: tuple[str | bytes | int, ...] = ("CL.LIMIT", client_key, resource)
        if tier is not None:
            command += ("TIER", tier)
        if cost != 1:
            command += ("COST", cost)
        if self.priority is not None:
            command += ("PRIORITY", self.priority)
        fallback = self.fallback
        local = None if fallback is None else (
            lambda: fallback.limit(client_key, resource, tier, cost))
        request = _Request(client_key, command, UNKNOWN_LIMIT, on_failure, local,
                           (client_key, resource, tier))
        return self._split_known(request)

    # ---- split keys (cluster mode; split_keys.py) -----------------------

    def _split_known(self, request: _Request) -> _Request:
        """A CL.LIMIT on a key the cluster said is split: on a random sub-key."""
        if self._cluster is None or request.split_id is None:
            return request
        k = self._splits.get(request.split_id)
        return request if k is None else request.on_subkey(random_subkey(request.command[1], k))

    def _split_learned(self, request: _Request, reply, hops: int) -> _Request | None:
        """After a "-SPLIT k" reply, the call to resend on a random sub-key
        (k remembered for the next calls); None for any other reply."""
        k = split_refusal(reply)
        if k is None or request.split_id is None or hops >= MAX_REDIRECTS:
            return None
        self.stats.incr("split_learned")
        self._splits.learn(request.split_id, k)
        return request.on_subkey(random_subkey(request.command[1], k))

    # ---- pre-aggregation (check only) ------------------------------------

    def _prefetchable(self, cost: int, split: int = 1) -> bool:
        # a split bucket's tokens are k buckets' (and shards'): not batched
        return self._prefetch is not None and 0 < cost <= self._prefetch.batch and split == 1

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
                                                  prefetch.batch, period_ms,
                                                  priority=self.priority))

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
                if decision.remaining == SHED_REMAINING:
                    # not counted: an overloaded server's answer by its own
                    # policy; this check's is the caller's to choose
                    self.stats.incr("shed")
                    return self._degraded(node, request, "the server shed the check (overload)")
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
