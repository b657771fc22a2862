"""A client's counters for Prometheus, through ``prometheus_client``.

    from fastlimit.client.metrics import register_prometheus
    client = Client("10.0.0.5:6380")
    register_prometheus(client, name="orders-api")     # once, at start

The collector reads ``client.stats`` and each server's breaker when
Prometheus scrapes (``prometheus_client``'s default registry unless one
is given), so a check costs nothing beyond the counters the client keeps
anyway.  Names follow Prometheus' conventions (``_total`` counters, one
family per thing counted, what differs in labels); every sample carries
``client`` (the name given here, so that several clients in one process
stay apart).  ``prometheus_client`` is imported here only: the client
library does not need it.

    fastlimit_client_decisions_total{source}       server, failed_open,
                                                    failed_closed, local_fallback
    fastlimit_client_prefetched_decisions_total     of the server's, spent from a
                                                    pre-aggregated batch
    fastlimit_client_round_trips_total              network attempts
    fastlimit_client_commands_sent_total            commands in them
    fastlimit_client_errors_total{kind}             round_trip (refused, timed
                                                    out, dropped), error_reply
    fastlimit_client_breaker_skips_total            calls that skipped the network
    fastlimit_client_shed_checks_total              checks an overloaded server shed
    fastlimit_client_sentinel_switches_total        +switch-master announcements
    fastlimit_client_moved_total                    MOVED replies followed
    fastlimit_client_slot_map_refreshes_total       CLUSTER SLOTS reads
    fastlimit_client_split_keys_learned_total       -SPLIT replies resent
    fastlimit_client_breaker_open{server}           1 while that server's
                                                    breaker is open
"""

from __future__ import annotations

from typing import Any

DECISION_SOURCES = ("server", "failed_open", "failed_closed", "local_fallback")
# (family, help, Stats field): the plain counters
COUNTERS = [
    ("fastlimit_client_prefetched_decisions_total",
     "Decisions from the server spent from a pre-aggregated batch.", "prefetched"),
    ("fastlimit_client_round_trips_total",
     "Network attempts: a sync call, or one async pipeline.", "round_trips"),
    ("fastlimit_client_commands_sent_total", "Commands in those round trips.", "commands_sent"),
    ("fastlimit_client_breaker_skips_total",
     "Calls that skipped the network because their server's breaker was open.",
     "breaker_skips"),
    ("fastlimit_client_shed_checks_total",
     "Checks an overloaded server shed (then answered by the failure policy).", "shed"),
    ("fastlimit_client_sentinel_switches_total",
     "Failovers the sentinels announced (+switch-master).", "master_switches"),
    ("fastlimit_client_moved_total", "MOVED replies followed to another node.", "moved"),
    ("fastlimit_client_slot_map_refreshes_total", "Slot maps read from CLUSTER SLOTS.",
     "map_refreshes"),
    ("fastlimit_client_split_keys_learned_total",
     "-SPLIT replies resent on a sub-key (cluster mode).", "split_learned"),
]


class ClientCollector:
    """A ``prometheus_client`` collector over one client's counters."""

    def __init__(self, client: Any, name: str):
        self.client = client
        self.name = name

    def describe(self) -> list:
        return []          # the families are known only at a scrape (servers come and go)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.client.stats.as_dict()
        decisions = CounterMetricFamily(
            "fastlimit_client_decisions", "Decisions by where they came from.",
            labels=["client", "source"])
        for source in DECISION_SOURCES:
            decisions.add_metric([self.name, source], stats[source])
        yield decisions
        errors = CounterMetricFamily(
            "fastlimit_client_errors", "Failures: round trips that failed (refused, timed "
            "out, dropped) and error replies from a live server.", labels=["client", "kind"])
        errors.add_metric([self.name, "round_trip"], stats["errors"])
        errors.add_metric([self.name, "error_reply"], stats["error_replies"])
        yield errors
        for family, help_text, field in COUNTERS:
            counter = CounterMetricFamily(family.removesuffix("_total"), help_text,
                                          labels=["client"])
            counter.add_metric([self.name], stats[field])
            yield counter
        breakers = GaugeMetricFamily(
            "fastlimit_client_breaker_open", "1 while the server's circuit breaker is open "
            "(calls skip the network until a probe succeeds).", labels=["client", "server"])
        for server, breaker in self._breakers():
            if breaker is not None:
                breakers.add_metric([self.name, server], int(breaker.is_open))
        yield breakers

    def _breakers(self) -> list:
        """The servers' breakers; a cluster client's primaries may change
        while they are read (the map refreshes in another thread)."""
        for _ in range(3):
            try:
                return sorted(self.client.breakers.items())
            except RuntimeError:        # the dict changed size: read it again
                continue
        return []


def register_prometheus(client: Any, name: str = "default", registry: Any = None
                        ) -> ClientCollector:
    """Registers a collector of client's counters (a ``Client`` or an
    ``AsyncClient``) with registry (prometheus_client's default one when
    None); returns it (``registry.unregister(collector)`` removes it).
    ImportError when prometheus_client is not installed."""
    try:
        from prometheus_client import REGISTRY
    except ImportError as e:
        raise ImportError("register_prometheus needs prometheus_client "
                          "(pip install prometheus-client)") from e
    collector = ClientCollector(client, name)
    (registry if registry is not None else REGISTRY).register(collector)
    return collector
