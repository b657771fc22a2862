"""fastlimit.Client and AsyncClient in cluster mode, on real fastlimit
cluster processes (manual clock): answers equal one standalone server's, a
stale slot table is followed through MOVED and refreshed, a dead shard's
keys fail by the failure policy while the other shards answer, and the
middleware runs on top unchanged."""

from __future__ import annotations

import asyncio
import signal
import time
from array import array

import pytest
from cluster_rig import FastlimitCluster, cluster_auth_args, ruled_servers, static_map_text
from httpkit import AsgiServer, WsgiServer, request
from servers import ServerProcess
from wire import free_port

from fastlimit._cluster import keyslot
from fastlimit.client import AsyncClient, Client, ClusterMapError
from fastlimit.cluster.client import REFRESH_INTERVAL_S, SLOTS, SlotMap, primaries_by_slot
from fastlimit.decision import FAILED_CLOSED, FAILED_OPEN, SERVER

KEYS = [f"user:{i}".encode() for i in range(3000)]
RULES = {"rules": {"api": {"match": {"resource": "GET /api"}, "capacity": 3,
                           "refill_per_second": 1}}}
# Generous: these tests are about routing, not about a loaded machine's latency.
TIMEOUT_MS = 2000
WAIT_S = 10


def shard_of(cluster, key: bytes) -> int:
    return keyslot(key) * len(cluster.nodes) // SLOTS


def set_clock(ms: int, *nodes) -> None:
    for node in nodes:
        with node.client() as c:
            c.execute_command("DEBUG", "CLOCK", "SET", ms)


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def addr(node) -> str:
    return f"127.0.0.1:{node.port}"


@pytest.fixture(scope="module")
def ruled(tmp_path_factory):
    """Three shards and one standalone server, the same rules on each."""
    cluster, single = ruled_servers(tmp_path_factory.mktemp("ruled-client"), RULES)
    yield cluster, single
    single.stop()
    cluster.stop()


@pytest.fixture
def small_cluster(tmp_path):
    """Three shards of their own, for tests that kill one."""
    cluster = FastlimitCluster(str(tmp_path), 3, 0)
    yield cluster
    cluster.stop()


def calls(prefix: bytes):
    """(method, args) pairs: a check and a rules lookup of every key."""
    for key in KEYS:
        yield "check", (prefix + key, 5, 2)
        yield "limit", (prefix + key, "GET /api")


# ---- answers ------------------------------------------------------------------------

@pytest.mark.untraced
def test_sync_cluster_client_answers_as_one_standalone_server(ruled):
    cluster, single = ruled
    with Client(cluster=addr(cluster.primaries[0]), timeout_ms=TIMEOUT_MS) as ours, \
            Client(addr(single), timeout_ms=TIMEOUT_MS) as plain:
        for t in (0, 0, 400, 1500):
            set_clock(t, *cluster.primaries, single)
            for method, args in calls(b"sync:"):
                assert getattr(ours, method)(*args) == getattr(plain, method)(*args)
        assert ours.servers == [addr(p) for p in cluster.primaries]
        assert {ours.server_for(k) for k in KEYS} == set(ours.servers)
        assert ours.server_for(b"foo") == addr(cluster.primaries[shard_of(cluster, b"foo")])
        assert ours.stats.moved == 0 and ours.stats.map_refreshes == 1
        assert ours.stats.server == 4 * 2 * len(KEYS)


@pytest.mark.untraced
def test_async_cluster_client_answers_as_one_standalone_server_pipelined_per_node(ruled):
    cluster, single = ruled

    async def run():
        async with AsyncClient(cluster=[addr(p) for p in cluster.primaries],
                               timeout_ms=TIMEOUT_MS) as ours, \
                AsyncClient(addr(single), timeout_ms=TIMEOUT_MS) as plain:
            for t in (10_000, 10_000, 10_400, 11_500):
                set_clock(t, *cluster.primaries, single)
                todo = list(calls(b"async:"))
                for start in range(0, len(todo), 1000):
                    batch = todo[start:start + 1000]
                    mine = await asyncio.gather(*(getattr(ours, m)(*a) for m, a in batch))
                    theirs = await asyncio.gather(*(getattr(plain, m)(*a) for m, a in batch))
                    assert mine == theirs
            return ours.stats

    stats = asyncio.run(run())
    assert stats.server == stats.commands_sent == 4 * 2 * len(KEYS)
    assert stats.moved == 0 and stats.map_refreshes == 1
    # one pipeline per node per batch of 1000 calls: 3 nodes x 24 batches
    assert stats.round_trips <= 3 * 4 * 6


# ---- MOVED ------------------------------------------------------------------------

def poisoned(client) -> None:
    """Every slot on the first primary: the other shards' keys get MOVED."""
    slot_map = client._slot_map
    client._slot_map = SlotMap(slot_map.nodes, array("H", [0]) * SLOTS)


def test_sync_client_follows_moved_from_a_stale_slot_table_and_refreshes_it(ruled):
    cluster, _ = ruled
    set_clock(20_000_000, *cluster.primaries)
    first = addr(cluster.primaries[0])
    with Client(cluster=first, timeout_ms=TIMEOUT_MS) as client:
        poisoned(client)
        assert client.server_for(b"foo") == first
        decision = client.check(b"foo", 10, 1)
        assert (decision.source, decision.allowed, decision.remaining) == (SERVER, True, 9)
        assert client.stats.moved == 1
        owner = addr(cluster.primaries[shard_of(cluster, b"foo")])
        assert client.server_for(b"foo") == owner          # the slot, patched at once
        wait_until(lambda: client.stats.map_refreshes == 2, "the map to be refreshed")
        assert all(client.server_for(k) == addr(cluster.primaries[shard_of(cluster, k)])
                   for k in KEYS)
        assert client.check(b"foo", 10, 1).remaining == 8
        assert client.stats.moved == 1


def test_async_client_follows_moved_from_a_stale_slot_table_and_refreshes_it(ruled):
    cluster, _ = ruled
    set_clock(21_000_000, *cluster.primaries)

    async def run():
        async with AsyncClient(cluster=addr(cluster.primaries[1]),
                               timeout_ms=TIMEOUT_MS) as client:
            await client.initialize()
            poisoned(client)
            keys = [b"moved:" + k for k in KEYS[:600]]
            decisions = await asyncio.gather(*(client.check(k, 5, 1) for k in keys))
            assert all((d.source, d.remaining) == (SERVER, 4) for d in decisions)
            elsewhere = sum(shard_of(cluster, k) != 0 for k in keys)
            # each of those calls was sent to the first primary, then to its own
            assert 0 < client.stats.moved == elsewhere
            for _ in range(WAIT_S * 100):
                if client.stats.map_refreshes >= 2:
                    break
                await asyncio.sleep(0.01)
            # one refresh for the whole burst (and one more asked meanwhile)
            assert 2 <= client.stats.map_refreshes <= 3
            moved = client.stats.moved
            decisions = await asyncio.gather(*(client.check(k, 5, 1) for k in keys))
            assert all(d.remaining == 3 for d in decisions)
            assert client.stats.moved == moved

    asyncio.run(run())


def test_a_moved_loop_ends_after_five_hops_in_the_failure_policy(tmp_path):
    """Two nodes whose maps each say the other serves the slot."""
    a, b = free_port(), free_port()
    nodes = []
    for port, ports in ((a, [[a], [b]]), (b, [[b], [a]])):
        path = tmp_path / f"map-{port}.toml"
        path.write_text(static_map_text(ports))
        nodes.append(ServerProcess("--port", str(port), "--cluster-enabled", "yes",
                                   "--cluster-config-file", str(path),
                                   *cluster_auth_args(str(tmp_path))).start())
    try:
        with Client(cluster=f"127.0.0.1:{a}", timeout_ms=TIMEOUT_MS) as client:
            assert keyslot(b"foo") >= SLOTS // 2             # b's, as a's map says
            decision = client.check(b"foo", 10, 1, on_failure="closed")
            assert (decision.source, decision.allowed) == (FAILED_CLOSED, False)
            assert client.stats.moved == 5 and client.stats.error_replies == 1
            assert client.stats.round_trips == 6
    finally:
        for node in nodes:
            node.stop()


# ---- failures ----------------------------------------------------------------------

def test_a_dead_shards_keys_fail_by_policy_while_the_other_shards_answer(small_cluster):
    cluster = small_cluster
    set_clock(0, *cluster.primaries)
    keys = KEYS[:300]
    dead = 1
    with Client(cluster=[addr(p) for p in cluster.primaries], timeout_ms=TIMEOUT_MS) as client:
        cluster.primaries[dead].stop(signal.SIGKILL)
        started = time.monotonic()
        for key in keys:
            closed = client.check(key, 5, 1, on_failure="closed")
            opened = client.check(key, 5, 1, on_failure="open")
            if shard_of(cluster, key) == dead:
                assert (closed.source, closed.allowed) == (FAILED_CLOSED, False)
                assert (opened.source, opened.allowed) == (FAILED_OPEN, True)
            else:
                assert (closed.source, closed.remaining) == (SERVER, 4)
                assert (opened.source, opened.remaining) == (SERVER, 3)
        breakers = client.breakers
        assert breakers[addr(cluster.primaries[dead])].is_open
        assert not any(breakers[addr(p)].is_open for i, p in enumerate(cluster.primaries)
                       if i != dead)
        # the failures and skips asked for refreshes: one start per 100 ms at
        # most, the map unchanged
        wait_until(lambda: not client._refresh_gate._running, "the refreshes to end")
        elapsed = time.monotonic() - started
        assert 2 <= client.stats.map_refreshes <= 2 + elapsed / REFRESH_INTERVAL_S
        assert client.servers == [addr(p) for p in cluster.primaries]


def test_a_shard_whose_primary_moved_is_found_on_the_refreshed_map(tmp_path):
    """The cluster restarted on map version 2, the second shard's primary on
    a new port: its keys fail by policy until a refresh names the new node,
    then are answered there, and the old node is forgotten."""
    ports = [[free_port()] for _ in range(3)]
    moved_to = free_port()

    def start(ports, version):
        path = tmp_path / f"map-v{version}.toml"
        path.write_text(static_map_text(ports, version))
        return [ServerProcess("--port", str(p), "--manual-clock", "--cluster-enabled", "yes",
                              "--cluster-config-file", str(path),
                              *cluster_auth_args(str(tmp_path))).start()
                for [p] in ports]

    nodes = start(ports, 1)
    try:
        key = next(k for k in KEYS if keyslot(k) * 3 // SLOTS == 1)
        with Client(cluster=f"127.0.0.1:{ports[0][0]}", timeout_ms=TIMEOUT_MS) as client:
            assert client.check(key, 5, 1).remaining == 4
            for node in nodes:
                node.stop()
            nodes = start([ports[0], [moved_to], ports[2]], 2)
            assert client.check(key, 5, 1, on_failure="closed").source == FAILED_CLOSED
            wait_until(lambda: client.server_for(key) == f"127.0.0.1:{moved_to}",
                       "a refresh to find the new primary")
            decision = client.check(key, 5, 1, on_failure="closed")
            assert (decision.source, decision.remaining) == (SERVER, 4)   # a new node
            assert set(client.servers) == {f"127.0.0.1:{p}" for p in
                                           (ports[0][0], moved_to, ports[2][0])}
    finally:
        for node in nodes:
            node.stop()


def test_async_dead_shards_keys_fail_by_policy_while_the_other_shards_answer(small_cluster):
    cluster = small_cluster
    set_clock(0, *cluster.primaries)
    keys = KEYS[:600]
    dead = 2

    async def run():
        async with AsyncClient(cluster=addr(cluster.primaries[0]),
                               timeout_ms=TIMEOUT_MS) as client:
            await client.initialize()
            cluster.primaries[dead].stop(signal.SIGKILL)
            for _ in range(3):
                decisions = await asyncio.gather(
                    *(client.check(k, 5, 1, on_failure="closed") for k in keys))
                for key, d in zip(keys, decisions, strict=True):
                    on_dead = shard_of(cluster, key) == dead
                    assert d.source == (FAILED_CLOSED if on_dead else SERVER)
            return client.stats

    stats = asyncio.run(run())
    assert stats.failed_closed == 3 * sum(shard_of(cluster, k) == dead for k in keys)
    assert stats.server == 3 * sum(shard_of(cluster, k) != dead for k in keys)
    assert stats.map_refreshes >= 2


def test_a_client_refuses_a_node_that_is_not_in_cluster_mode(server):
    with pytest.raises(ClusterMapError, match="cluster support disabled"):
        Client(cluster=addr(server), timeout_ms=TIMEOUT_MS)


def test_a_client_with_no_reachable_startup_node_says_so_for_each():
    ports = [free_port(), free_port()]
    with pytest.raises(ClusterMapError) as e:
        Client(cluster=[f"127.0.0.1:{p}" for p in ports], timeout_ms=TIMEOUT_MS)
    assert all(f"127.0.0.1:{p}: ConnectionError" in str(e.value) for p in ports)


def test_an_async_client_without_a_map_answers_by_policy_and_initialize_raises():
    async def run():
        async with AsyncClient(cluster=f"127.0.0.1:{free_port()}",
                               timeout_ms=TIMEOUT_MS) as client:
            decisions = await asyncio.gather(
                client.check(b"a", 5, 1), client.check(b"b", 5, 1, on_failure="closed"))
            assert [d.source for d in decisions] == [FAILED_OPEN, FAILED_CLOSED]
            with pytest.raises(ClusterMapError, match="ConnectionError"):
                await client.initialize()

    asyncio.run(run())


@pytest.mark.parametrize("reply,reason", [
    ([[0, 100, [b"127.0.0.1", 7000, b"id"]]], "covers 101 of 16384 slots; uncovered: 101-16383"),
    ([[0, 16383, [b"127.0.0.1", 7000]], [5, 5, [b"127.0.0.1", 7001]]], "twice"),
    ([[0, 16384, [b"127.0.0.1", 7000]]], "not a slot range"),
    ([[0, 16383]], "no primary"),
    (b"OK", "not a list"),
])
def test_a_slot_map_that_cannot_be_used_is_refused_naming_the_problem(reply, reason):
    with pytest.raises(ClusterMapError, match=reason):
        primaries_by_slot(reply, "127.0.0.1")


def test_an_empty_host_in_cluster_slots_is_the_node_asked():
    addresses, slots = primaries_by_slot([[0, 16383, [b"", 7000]]], "10.0.0.5")
    assert addresses == ["10.0.0.5:7000"] and set(slots) == {0}


# ---- the middleware on top ----------------------------------------------------------

def api_key_app(limiter, limit, asgi: bool):
    from fastlimit.middleware import RateLimitMiddleware, WSGIRateLimitMiddleware, header_key

    if asgi:
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
        return RateLimitMiddleware(app, limiter=limiter, limit=limit,
                                   key=header_key("x-api-key"))

    def wsgi_app(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]
    return WSGIRateLimitMiddleware(wsgi_app, limiter, limit, key=header_key("x-api-key"))


def statuses(port: int, keys: list[str], path: str) -> list[int]:
    return [request(port, path, headers={"X-API-Key": k}).status for k in keys]


def test_the_asgi_middleware_limits_every_shards_keys_on_an_async_cluster_client(ruled):
    from fastlimit.middleware import Limit

    cluster, _ = ruled
    set_clock(30_000_000, *cluster.primaries)
    keys = [f"asgi-{i}" for i in range(12)]
    client = AsyncClient(cluster=addr(cluster.primaries[2]), timeout_ms=TIMEOUT_MS)
    server = AsgiServer(api_key_app(client, Limit(2, 1), asgi=True))
    try:
        assert [statuses(server.port, keys, "/x") for _ in range(3)] == \
            [[200] * 12, [200] * 12, [429] * 12]
    finally:
        server.stop()
    assert client.stats.server == 36 and client.stats.failed_open == 0
    shards = {shard_of(cluster, f"GET /x|{k}".encode()) for k in keys}
    assert shards == {0, 1, 2}


def test_the_wsgi_middleware_limits_by_rules_on_a_sync_cluster_client(ruled):
    from fastlimit.middleware import Rules

    cluster, _ = ruled
    set_clock(31_000_000, *cluster.primaries)
    keys = [f"wsgi-{i}" for i in range(12)]
    with Client(cluster=addr(cluster.primaries[0]), timeout_ms=TIMEOUT_MS) as client:
        server = WsgiServer(api_key_app(client, Rules(), asgi=False))
        try:
            assert [statuses(server.port, keys, "/api") for _ in range(4)] == \
                [[200] * 12] * 3 + [[429] * 12]
        finally:
            server.stop()
        assert client.stats.server == 48 and client.stats.failed_open == 0
    assert {shard_of(cluster, k.encode()) for k in keys} == {0, 1, 2}
