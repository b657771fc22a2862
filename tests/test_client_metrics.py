"""fastlimit.client.metrics: a Client's and an AsyncClient's counters as
Prometheus reads them (prometheus_client's text exposition, read back
strictly): every decision source, the errors, the breaker per server,
under the names and labels the shipped alert rules use
(server/prometheus/alerts.yaml), equal to client.stats at the scrape."""

from __future__ import annotations

import asyncio

import pytest
from metrics_text import named, samples, value
from prometheus_client import CollectorRegistry, generate_latest
from wire import free_port

from fastlimit import AsyncClient, CircuitBreaker, Client, LocalFallback
from fastlimit.client.metrics import register_prometheus


def scrape(registry) -> dict:
    return samples(generate_latest(registry).decode())


def test_a_clients_counters_under_prometheus_names(r, server):
    registry = CollectorRegistry()
    dead = f"127.0.0.1:{free_port()}"
    live = Client(f"127.0.0.1:{server.port}", timeout_ms=5000)     # a traced server may lag
    failing = Client(dead, timeout_ms=5,
                     breaker=CircuitBreaker(failures=3, window_s=10, probe_every_s=60))
    fallback = Client(dead, timeout_ms=5, fallback=LocalFallback(divisor=2))
    for name, client in (("live", live), ("failing", failing), ("fallback", fallback)):
        register_prometheus(client, name=name, registry=registry)
    try:
        for i in range(5):
            live.check(f"k{i}", capacity=10, refill_per_sec=1)
            failing.check("k", capacity=10, refill_per_sec=1)
            failing.check("k", capacity=10, refill_per_sec=1, on_failure="closed")
        for _ in range(5):      # back to back: the default breaker counts 5 within 1 s
            fallback.check("k", capacity=10, refill_per_sec=1)
        series = scrape(registry)
        decisions = named(series, "fastlimit_client_decisions_total")
        assert decisions[frozenset({("client", "live"), ("source", "server")})] == 5
        assert decisions[frozenset({("client", "failing"), ("source", "failed_open")})] == 5
        assert decisions[frozenset({("client", "failing"), ("source", "failed_closed")})] == 5
        assert decisions[frozenset({("client", "fallback"),
                                    ("source", "local_fallback")})] == 5
        assert len(decisions) == 3 * 4          # every source of every client, zeros included
        for name, client in (("live", live), ("failing", failing), ("fallback", fallback)):
            stats = client.stats
            assert value(series, "fastlimit_client_round_trips_total",
                         client=name) == stats.round_trips
            assert value(series, "fastlimit_client_errors_total", client=name,
                         kind="round_trip") == stats.errors
            assert value(series, "fastlimit_client_breaker_skips_total",
                         client=name) == stats.breaker_skips
            for family in ("commands_sent", "shed_checks", "sentinel_switches", "moved",
                           "slot_map_refreshes", "split_keys_learned",
                           "prefetched_decisions"):
                assert (f"fastlimit_client_{family}_total",
                        frozenset({("client", name)})) in series
        # three failures opened the failing client's breaker; the others skipped the network
        assert failing.stats.errors == 3 and failing.stats.breaker_skips == 7
        assert named(series, "fastlimit_client_breaker_open") == {
            frozenset({("client", "live"), ("server", f"127.0.0.1:{server.port}")}): 0,
            frozenset({("client", "failing"), ("server", dead)}): 1,
            frozenset({("client", "fallback"), ("server", dead)}): 1}     # the default: 5
        # counters move between scrapes, read at the scrape
        live.check("k9", capacity=10, refill_per_sec=1)
        assert value(scrape(registry), "fastlimit_client_decisions_total", client="live",
                     source="server") == 6
    finally:
        for client in (live, failing, fallback):
            client.close()


def test_an_async_client_too(r, server):
    registry = CollectorRegistry()

    async def main():
        client = AsyncClient(f"127.0.0.1:{server.port}", timeout_ms=5000)
        register_prometheus(client, name="a", registry=registry)
        try:
            await asyncio.gather(*(client.check(f"k{i}", capacity=5, refill_per_sec=1)
                                   for i in range(20)))
            return scrape(registry)
        finally:
            await client.aclose()

    series = asyncio.run(main())
    assert value(series, "fastlimit_client_decisions_total", client="a", source="server") == 20
    assert value(series, "fastlimit_client_commands_sent_total", client="a") == 20
    assert value(series, "fastlimit_client_round_trips_total", client="a") < 20   # pipelined


def test_registered_once_per_name_in_a_registry(server):
    registry = CollectorRegistry()
    client = Client(f"127.0.0.1:{server.port}")
    try:
        collector = register_prometheus(client, name="x", registry=registry)
        registry.unregister(collector)
        register_prometheus(client, name="x", registry=registry)
    finally:
        client.close()


def test_without_prometheus_client_the_error_says_what_to_install(server, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_prometheus(name, *args, **kwargs):
        if name.startswith("prometheus_client"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    client = Client(f"127.0.0.1:{server.port}")
    try:
        with pytest.raises(ImportError, match="pip install prometheus-client"):
            register_prometheus(client)
    finally:
        client.close()
