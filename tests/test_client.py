"""The Python clients (fastlimit.client) against real server processes:
decisions, automatic pipelining, outages (fail open, fail closed, circuit
breaker, local fallback, recovery), consistent hashing, pre-aggregation.

Outages are judged by counting, never by the clock: the breakers run on a
clock the test moves, and network attempts are counted where redis-py
opens sockets and writes to them.

limit() is tested against a server with rules set by CL.RULE, and without
a server (its failure paths).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import signal
import socket
import threading
import time

import pytest
import redis
import redis.asyncio.connection
import redis.connection

from fastlimit import (AsyncClient, CircuitBreaker, Client, Clock, Decision,
                       LocalFallback)
from fastlimit.client import _LoopTimeBudget
from wire import free_port

# Correctness tests must not trip on a slow (debug-build, shared) machine:
# a generous timeout.  Outage tests use a dead or paused server instead.
SLOW_OK_MS = 2000
WORKED_TIMES = (0, 0, 0, 0, 0, 0, 500, 500, 1500, 1500, 1500)
WORKED_ALLOWED = [True] * 5 + [False, True, False, True, True, False]


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dead_address() -> str:
    """A loopback port with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def address(server) -> str:
    return f"127.0.0.1:{server.port}"


class NetworkCounter:
    """Counts every socket redis-py opens and every write it makes."""

    def __init__(self, monkeypatch):
        self.connects = 0
        self.writes = 0
        self._patch(monkeypatch, redis.connection.Connection, "_connect", "connects")
        self._patch(monkeypatch, redis.connection.AbstractConnection,
                    "send_packed_command", "writes")
        self._patch(monkeypatch, redis.asyncio.connection.Connection, "_connect",
                    "connects", is_async=True)
        self._patch(monkeypatch, redis.asyncio.connection.AbstractConnection,
                    "send_packed_command", "writes", is_async=True)

    @property
    def attempts(self) -> int:
        return self.connects + self.writes

    def _patch(self, monkeypatch, cls, name, counter, is_async=False):
        original = getattr(cls, name)
        counting = self

        if is_async:
            async def wrapper(self, *args, **kwargs):
                setattr(counting, counter, getattr(counting, counter) + 1)
                return await original(self, *args, **kwargs)
        else:
            def wrapper(self, *args, **kwargs):
                setattr(counting, counter, getattr(counting, counter) + 1)
                return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, wrapper)


@pytest.fixture
def net(monkeypatch) -> NetworkCounter:
    return NetworkCounter(monkeypatch)


def commandstat_calls(r: redis.Redis, command: str) -> int:
    stats = r.info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


# ---- decisions from the server -------------------------------------------

def test_sync_worked_example(server, r):
    with Client(address(server), timeout_ms=SLOW_OK_MS) as client:
        allowed = []
        for t in WORKED_TIMES:
            r.execute_command("DEBUG", "CLOCK", "SET", t)
            d = client.check("user:42", 5, 2)
            assert d.source == "server"
            allowed.append(d.allowed)
    assert allowed == WORKED_ALLOWED


def test_sync_decision_is_the_servers_reply(server, r):
    with Client(address(server), timeout_ms=SLOW_OK_MS) as client:
        for args, options in [((5, 2), {}), ((5, 2), {"cost": 3}),
                              ((5, 2), {"cost": 9}), ((1000, 1000), {"period_ms": 3_600_000})]:
            expected = r.execute_command("CL.CHECK", "twin", *args,
                                         "COST", options.get("cost", 1),
                                         "PERIOD", options.get("period_ms", 1000))
            d = client.check("mine", *args, **options)
            assert d == Decision.from_reply(expected, "server")
        assert client.stats.server == 4 and client.stats.round_trips == 4


def test_a_shed_check_is_a_failure_of_that_check(server, r):
    """An overloaded server's shed reply (remaining -2) is not a decision:
    the check's failure policy answers, and it is counted apart."""
    r.execute_command("DEBUG", "SHED-LEVEL", 1)
    try:
        with Client(address(server), timeout_ms=SLOW_OK_MS, priority="low") as client:
            d = client.check("feed", 5, 1)
            assert (d.allowed, d.source) == (True, "failed_open")
            d = client.check("feed", 5, 1, on_failure="closed")
            assert (d.allowed, d.source) == (False, "failed_closed")
            assert client.stats.shed == 2 and client.stats.server == 0
        with Client(address(server), timeout_ms=SLOW_OK_MS) as normal:
            assert normal.check("feed", 5, 1).remaining == 4     # the bucket was untouched
        with pytest.raises(ValueError, match="priority"):
            Client(address(server), priority="urgent")
    finally:
        r.execute_command("DEBUG", "SHED-LEVEL", "AUTO")


def test_binary_keys_and_password(make_server):
    s = make_server("--manual-clock", "--requirepass", "s3cret")
    with Client(address(s), password="s3cret", timeout_ms=SLOW_OK_MS) as client:
        assert client.check(b"\x00\xffkey", 1, 1).allowed
        assert not client.check(b"\x00\xffkey", 1, 1).allowed
    with Client(address(s), timeout_ms=SLOW_OK_MS) as wrong:
        d = wrong.check("k", 1, 1, on_failure="closed")
        assert d.source == "failed_closed"


def test_sync_client_shared_by_many_threads(server, r):
    with Client(address(server), timeout_ms=SLOW_OK_MS) as client:
        start = threading.Barrier(16)
        allowed = [0] * 16

        def hammer(i: int) -> None:
            start.wait()
            for _ in range(20):
                allowed[i] += client.check("shared", 100, 1).allowed

        workers = [threading.Thread(target=hammer, args=(i,)) for i in range(16)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert sum(allowed) == 100
        assert client.stats.server == 320 and client.stats.round_trips == 320


def test_async_worked_example(server, r):
    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS) as client:
            allowed = []
            for t in WORKED_TIMES:
                r.execute_command("DEBUG", "CLOCK", "SET", t)
                d = await client.check("user:42", 5, 2)
                assert d.source == "server"
                allowed.append(d.allowed)
            return allowed
    assert asyncio.run(scenario()) == WORKED_ALLOWED


def test_async_auto_pipelining_batches_concurrent_checks(server, r, net):
    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS) as client:
            await client.check("warm-up", 1, 1)          # connects, HELLO
            writes, trips = net.writes, client.stats.round_trips
            decisions = await asyncio.gather(*(client.check("hot", 60, 1)
                                               for _ in range(100)))
            return decisions, net.writes - writes, client.stats.round_trips - trips, client.stats

    before = commandstat_calls(r, "cl.check")
    decisions, writes, trips, stats = asyncio.run(scenario())
    assert sum(d.allowed for d in decisions) == 60
    assert {d.source for d in decisions} == {"server"}
    assert writes == 1 and trips == 1            # 100 checks, one write, one round trip
    assert stats.commands_sent == 101
    assert commandstat_calls(r, "cl.check") - before == 101


def test_async_replies_reach_their_own_callers(server, r):
    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS) as client:
            # key i has capacity i+1 and is asked i+2 times, all interleaved
            asks = [i for _ in range(31) for i in range(30)]
            asks = [i for n, i in enumerate(asks) if n // 30 < i + 2]
            decisions = await asyncio.gather(*(client.check(f"k{i}", i + 1, 1) for i in asks))
            return list(zip(asks, decisions)), client.stats.round_trips

    answers, trips = asyncio.run(scenario())
    assert trips == 1
    for i in range(30):
        mine = [d for k, d in answers if k == i]
        assert len(mine) == i + 2 and {d.limit for d in mine} == {i + 1}
        assert [d.allowed for d in mine] == [True] * (i + 1) + [False]
        assert [d.remaining for d in mine] == list(range(i, -1, -1)) + [0]


def test_async_error_reply_is_one_callers_problem(server, r):
    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS) as client:
            return await asyncio.gather(client.check("a", 5, 1),
                                        client.check("b", 0, 1),    # capacity 0: -ERR
                                        client.check("c", 5, 1, on_failure="closed")), client
    (a, b, c), client = asyncio.run(scenario())
    assert a.source == c.source == "server"
    assert b.source == "failed_open"
    assert client.stats.error_replies == 1 and client.stats.errors == 0
    assert not client.breakers[address(server)].is_open


def test_a_busy_loop_does_not_time_out_a_healthy_server(server, r, monkeypatch):
    """The event loop stalls 50 ms right after a pipeline is written (as a
    CPU-bound handler would): with a 5 ms timeout on a plain timer the reply,
    though there, would lose the race against the expired timer."""
    original = redis.asyncio.connection.AbstractConnection.send_packed_command
    stall = {"on": False}

    async def write_then_stall(self, *args, **kwargs):
        await original(self, *args, **kwargs)
        if stall["on"]:
            # Blocks the whole loop: until the reply is there (in the stream
            # already, or on the socket), however slow the server, and then
            # 50 ms past the 5 ms budget.
            if not self._reader._buffer:
                select.select([self._writer.transport.get_extra_info("socket")], [], [], 10)
            time.sleep(0.05)

    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection,
                        "send_packed_command", write_then_stall)

    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS) as client:
            await client.check("warm-up", 1, 1)    # connects, at the pace of a traced server
            client.timeout_ms = 5
            stall["on"] = True
            decisions = [await client.check("k", 5, 1) for _ in range(3)]
            return decisions, client.stats
    decisions, stats = asyncio.run(scenario())
    assert [d.source for d in decisions] == ["server"] * 3
    assert stats.errors == 0


def test_loop_time_budget_still_expires_after_a_stall():
    async def wait_forever(budget_s: float) -> None:
        async with asyncio.timeout(None) as timeout:
            budget = _LoopTimeBudget(timeout, budget_s)
            try:
                time.sleep(budget_s * 10)          # a stall is charged one tick
                await asyncio.sleep(0)
                await asyncio.get_running_loop().create_future()   # never done
            finally:
                budget.cancel()

    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(wait_forever(0.02), timeout=30))


# ---- outages -----------------------------------------------------------

def outage_client(cls, addr, clock, **kwargs):
    return cls(addr, timeout_ms=SLOW_OK_MS,
               breaker=CircuitBreaker(failures=3, window_s=60, probe_every_s=5, clock=clock),
               **kwargs)


def test_sync_outage_breaker_and_recovery(make_server, net, caplog):
    s = make_server("--manual-clock")
    clock = FakeClock()
    client = outage_client(Client, address(s), clock)
    breaker = client.breakers[address(s)]
    assert client.check("p", 5, 1).source == "server"

    s.stop()
    with caplog.at_level(logging.ERROR, logger="fastlimit.client"):
        open_ = client.check("p", 5, 1)
        closed = client.check("login:bob", 5, 1, on_failure="closed")
        client.check("p", 5, 1)
    assert open_ == Decision(True, 5, 5, 0, 0, "failed_open")
    assert closed.source == "failed_closed" and not closed.allowed
    assert closed.retry_after_ms > 0
    assert breaker.is_open and client.stats.errors == 3
    assert any("failed_open" in m for m in caplog.messages)
    assert any("circuit breaker open" in m for m in caplog.messages)

    # Open: no socket, no write, whatever the calls.
    attempts, trips = net.attempts, client.stats.round_trips
    for i in range(100):
        assert client.check(f"p{i}", 5, 1).source == "failed_open"
        assert client.check("login", 5, 1, on_failure="closed").source == "failed_closed"
    assert net.attempts == attempts and client.stats.round_trips == trips
    assert client.stats.breaker_skips == 200

    # The server returns on the same port; the breaker notices at its probe.
    make_server("--manual-clock", "--port", str(s.port))
    clock.now += 4.9
    assert client.check("p", 5, 1).source == "failed_open"
    assert net.attempts == attempts
    clock.now += 0.1
    assert client.check("p", 5, 1).source == "server"         # the probe
    assert not breaker.is_open
    assert client.check("p", 5, 1).source == "server"
    client.close()


def test_sync_failed_probe_keeps_the_breaker_open(net):
    clock = FakeClock()
    client = outage_client(Client, dead_address(), clock)
    for _ in range(3):
        client.check("k", 5, 1)
    assert client.stats.errors == 3
    clock.now += 5
    client.check("k", 5, 1)                                     # probe, fails
    assert client.stats.errors == 4
    attempts = net.attempts
    assert client.check("k", 5, 1).source == "failed_open"
    assert net.attempts == attempts
    assert next(iter(client.breakers.values())).is_open


def test_sync_local_fallback_enforces_its_limit(make_server, net):
    s = make_server("--manual-clock")
    clock = FakeClock()
    fallback = LocalFallback(divisor=2, clock=Clock(manual=True))
    client = outage_client(Client, address(s), clock, fallback=fallback)
    assert client.check("k", 10, 1).source == "server"
    s.stop()
    decisions = [client.check("k", 10, 1, on_failure=p) for p in ("open", "closed") * 5]
    assert {d.source for d in decisions} == {"local_fallback"}
    assert sum(d.allowed for d in decisions) == 5              # 10 / 2
    assert client.stats.local_fallback == 10 and client.stats.failed_open == 0
    assert next(iter(client.breakers.values())).is_open
    attempts = net.attempts
    assert not client.check("k", 10, 1).allowed
    assert client.check("other", 10, 1).allowed
    assert net.attempts == attempts
    client.close()


def test_async_outage_breaker_fallback_and_recovery(make_server, net):
    s = make_server("--manual-clock")
    clock = FakeClock()
    fallback = LocalFallback(divisor=4, clock=Clock(manual=True))

    async def scenario():
        client = outage_client(AsyncClient, address(s), clock)
        guarded = outage_client(AsyncClient, address(s), clock, fallback=fallback)
        assert (await client.check("p", 5, 1)).source == "server"
        assert (await guarded.check("g", 8, 1)).source == "server"
        s.stop()

        # Three failed round trips (each a batch) open the breaker.
        for _ in range(3):
            batch = await asyncio.gather(client.check("p", 5, 1),
                                         client.check("sec", 5, 1, on_failure="closed"))
            assert [d.source for d in batch] == ["failed_open", "failed_closed"]
        assert client.stats.errors == 3 and client.breakers[address(s)].is_open

        attempts = net.attempts
        skipped = await asyncio.gather(*(client.check(f"p{i}", 5, 1) for i in range(100)))
        assert {d.source for d in skipped} == {"failed_open"}
        assert net.attempts == attempts and client.stats.breaker_skips == 100

        local = [await guarded.check("g", 8, 1, on_failure="closed") for _ in range(5)]
        assert {d.source for d in local} == {"local_fallback"}
        assert [d.allowed for d in local] == [True, True, False, False, False]  # 8 / 4

        make_server("--manual-clock", "--port", str(s.port))
        clock.now += 5
        assert (await client.check("p", 5, 1)).source == "server"
        assert not client.breakers[address(s)].is_open
        decisions = await asyncio.gather(*(client.check("q", 5, 1) for _ in range(10)))
        assert {d.source for d in decisions} == {"server"}
        assert sum(d.allowed for d in decisions) == 5
        await client.aclose()
        await guarded.aclose()

    asyncio.run(scenario())


@pytest.fixture
def paused_server(make_server):
    """A server that accepts connections but never answers (SIGSTOP)."""
    s = make_server("--manual-clock")
    yield s
    os.kill(s.proc.pid, signal.SIGCONT)


def pause(s) -> None:
    os.kill(s.proc.pid, signal.SIGSTOP)


def test_sync_timeout_fails_open_within_the_timeout(paused_server):
    # seconds, not ms: the check before the pause is on a live, traced server
    client = Client(address(paused_server), timeout_ms=SLOW_OK_MS)
    assert client.check("k", 5, 1).source == "server"           # pooled connection
    pause(paused_server)
    started = time.monotonic()
    d = client.check("k", 5, 1)
    assert d.source == "failed_open"
    assert time.monotonic() - started < 5.0                      # bounded wait only
    assert client.stats.errors == 1


def test_async_timeout_fails_open_within_the_timeout(paused_server):
    async def scenario():
        async with AsyncClient(address(paused_server), timeout_ms=SLOW_OK_MS) as client:
            assert (await client.check("k", 5, 1)).source == "server"
            pause(paused_server)
            started = time.monotonic()
            batch = await asyncio.gather(*(client.check("k", 5, 1) for _ in range(10)),
                                         client.check("s", 5, 1, on_failure="closed"))
            assert time.monotonic() - started < 5.0
            assert [d.source for d in batch] == ["failed_open"] * 10 + ["failed_closed"]
            assert client.stats.errors == 1                      # one batch, one failure
    asyncio.run(scenario())


@pytest.fixture
def rules_server(make_server):
    """A server of its own (rules in memory), so no other test's rules apply."""
    return make_server("--manual-clock", "--rules-db", "")


def set_rule(server, rule_id: str, rule: dict) -> None:
    assert server.client().execute_command("CL.RULE", "SET", rule_id, json.dumps(rule)) == b"OK"


def test_limit_with_no_matching_rule(rules_server):
    """No rule matches: allowed, limit and remaining -1 (the server's "no rule")."""
    unmatched = Decision(True, -1, -1, 0, 0, "server")
    with Client(address(rules_server), timeout_ms=SLOW_OK_MS) as client:
        assert client.limit("acme", "GET /") == unmatched
        assert client.limit(b"acme", "POST /orders", tier="free", cost=3,
                            on_failure="closed") == unmatched
        assert client.stats.error_replies == 0


def test_limit_enforces_the_servers_rules(rules_server):
    set_rule(rules_server, "orders-free", {
        "match": {"resource": "POST /orders", "tier": "free"},
        "algorithm": "token_bucket", "capacity": 3, "refill_per_second": 1})
    with Client(address(rules_server), timeout_ms=SLOW_OK_MS) as client:
        decisions = [client.limit("acme", "POST /orders", tier="free") for _ in range(4)]
        assert [d.allowed for d in decisions] == [True, True, True, False]
        assert [d.remaining for d in decisions] == [2, 1, 0, 0]
        assert {d.limit for d in decisions} == {3} and decisions[3].retry_after_ms == 1000
        assert client.limit("acme", "POST /orders", tier="paid").limit == -1   # no rule
        assert client.limit("globex", "POST /orders", tier="free", cost=2).remaining == 1
        assert not client.limit("globex", "POST /orders", tier="free", cost=2).allowed

    async def scenario():
        async with AsyncClient(address(rules_server), timeout_ms=SLOW_OK_MS) as client:
            return await asyncio.gather(*(client.limit("initech", "POST /orders", tier="free")
                                          for _ in range(5)))
    decisions = asyncio.run(scenario())
    assert sum(d.allowed for d in decisions) == 3
    assert {d.source for d in decisions} == {"server"}


def test_limit_without_a_server_follows_policy_and_fallback_rules(net):
    fallback = LocalFallback(rules={("POST /orders", "free"): (2, 1)},
                             clock=Clock(manual=True))
    client = Client(dead_address(), breaker=None, fallback=fallback)
    ruled = [client.limit("acme", "POST /orders", tier="free") for _ in range(3)]
    assert [d.allowed for d in ruled] == [True, True, False]
    assert {d.source for d in ruled} == {"local_fallback"}
    unruled = client.limit("acme", "GET /", on_failure="closed")
    assert unruled == Decision(False, -1, 0, 1000, 1000, "failed_closed")
    assert client.limit("acme", "GET /") == Decision(True, -1, -1, 0, 0, "failed_open")
    assert net.connects == 5                                     # no breaker: every call tries


def test_failures_are_logged_at_a_limited_pace(caplog):
    client = Client(dead_address(), breaker=None)
    with caplog.at_level(logging.ERROR, logger="fastlimit.client"):
        client._failure_log.clock = lambda: 0.0                  # time stands still
        client._failure_log._next = 0.0
        for _ in range(50):
            client.check("k", 5, 1)
        client._failure_log.clock = lambda: 1.0                  # a second later
        client.check("k", 5, 1)
    assert client.stats.failed_open == 51
    assert len(caplog.records) == 2
    assert "1 failed_open" in caplog.messages[0]
    assert "50 failed_open" in caplog.messages[1]


# ---- several servers -----------------------------------------------------

def test_consistent_hashing_across_servers(make_server):
    servers = [make_server("--manual-clock") for _ in range(4)]
    three = [address(s) for s in servers[:3]]
    keys = [f"user:{i}" for i in range(600)]
    client = Client(three, timeout_ms=SLOW_OK_MS)

    # Each key's single token is spent on the server the ring picks...
    assert all(client.check(k, 1, 1).allowed for k in keys)
    owners = {k: client.server_for(k) for k in keys}
    for s in servers[:3]:
        n = sum(1 for o in owners.values() if o == address(s))
        assert n > 100                                            # spread
        assert s.client().dbsize() == n                           # exactly there
    # ...and the same server answers the next time.
    assert not any(client.check(k, 1, 1).allowed for k in keys)

    # A fourth server takes about a quarter of the keys, all from the others.
    bigger = Client(three + [address(servers[3])], timeout_ms=SLOW_OK_MS)
    moved = [k for k in keys if bigger.server_for(k) != owners[k]]
    assert 0.15 < len(moved) / len(keys) < 0.35
    assert {bigger.server_for(k) for k in moved} == {address(servers[3])}
    # Keys that stayed keep their state; moved ones start fresh on the new server.
    for k in keys:
        assert bigger.check(k, 1, 1).allowed == (k in moved)
    assert servers[3].client().dbsize() == len(moved)
    client.close()
    bigger.close()


def test_one_dead_server_does_not_trip_the_others(make_server):
    alive = make_server("--manual-clock")
    dead = dead_address()
    clock = FakeClock()
    client = outage_client(Client, [address(alive), dead], clock)
    keys = [f"k{i}" for i in range(200)]
    decisions = {k: client.check(k, 5, 1) for k in keys}
    for k, d in decisions.items():
        assert d.source == ("server" if client.server_for(k) == address(alive) else "failed_open")
    assert client.breakers[dead].is_open
    assert not client.breakers[address(alive)].is_open


# ---- pre-aggregation -----------------------------------------------------

def test_preaggregation_takes_batches_and_never_overshoots_alone(server, r):
    # an hour's TTL: the batches' real-time expiry is not what this counts
    with Client(address(server), timeout_ms=SLOW_OK_MS, preaggregate=10,
                preaggregate_ttl_ms=3_600_000) as client:
        first = client.check("coarse", 25, 1)
        assert first.allowed and first.remaining == 24
        assert r.execute_command("CL.CHECK", "coarse", 25, 1, "COST", 0)[2] == 15
        decisions = [first] + [client.check("coarse", 25, 1) for _ in range(29)]
    assert sum(d.allowed for d in decisions) == 25                # exactly the capacity
    assert [d.remaining for d in decisions[:25]] == list(range(24, -1, -1))
    assert client.stats.prefetched == 18
    # 2 granted batches, then a refused one: from there on, single checks
    assert client.stats.round_trips == 2 + 1 + 10


def test_async_preaggregation(server, r):
    async def scenario():
        async with AsyncClient(address(server), timeout_ms=SLOW_OK_MS,
                               preaggregate=5) as client:
            decisions = [await client.check("coarse", 12, 1) for _ in range(15)]
            return decisions, client.stats
    decisions, stats = asyncio.run(scenario())
    assert sum(d.allowed for d in decisions) == 12
    assert stats.prefetched == 8


def test_async_open_breaker_still_lets_other_tasks_run():
    """With the breaker open, checks answer without the network; a task
    that checks in a loop must still give other tasks their turn."""
    async def main():
        client = AsyncClient(f"127.0.0.1:{free_port()}", timeout_ms=5,
                             breaker=CircuitBreaker(failures=1, window_s=60, probe_every_s=60))
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(ticker())
        decisions = [await client.check("k", 5, 1) for _ in range(200)]
        other.cancel()
        await client.aclose()
        return decisions, ticks

    decisions, ticks = asyncio.run(main())
    assert {d.source for d in decisions} == {"failed_open"}
    assert ticks >= 150
