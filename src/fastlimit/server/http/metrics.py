"""GET /metrics: the Prometheus exposition, written by hand from the
counters the engine already keeps (no metrics library: nothing on the
check path but the plain C counters, and a scrape costs only this
rendering).

Text format 0.0.4 by default; OpenMetrics 1.0 when the scraper's Accept
asks for it (Prometheus 2.x and 3.x both do), which differs in the
counter family names (``foo`` owning the sample ``foo_total``), the
UNIT and info metadata, and the final ``# EOF``.

Labels come from the command table, the fronts (gRPC methods beside
commands), error codes, replicas, rules and the rls-config's domains and
limits, never from descriptor values; the per-rule and per-limit
labels are capped by ``metrics-rule-labels`` (rules past the cap, in id
order, are summed under ``rule="__other__"``, limits under each domain's
``limit="__other__"``; 0 sums all of them there).  Keys are labels in one
family only, ``fastlimit_hotkey_ops_per_second``: the hot-key tracker's
``hotkeys-metrics-keys`` hottest (0 by default: none), each key cut to its
first 64 bytes, so a scrape holds at most that many of them.  The overload
families (overload/) are labelled only by the three check priorities and
the two answers a shed check gets: six series, always all of them.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import re
import resource
import time
from collections.abc import Iterable

from fastlimit import __version__
from fastlimit._load import PRIORITIES
from fastlimit._protocol import LATENCY_BOUNDS, Command
from fastlimit.hotkeys import report
from fastlimit.rls.service import LIMIT_STAT_FIELDS, NEAR_LIMIT_RATIO
from fastlimit.server.http.routes import Request, Response
from fastlimit.server.tls import CERTIFICATE_SETTINGS, certificate_not_after

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OTHER_RULES = "__other__"
DECISIONS = ("allowed", "denied", "shadow_denied")
# The bucket bounds as le label values: Go's float formatting, as the
# official clients write them ("5e-06", "0.0001", "1.0").
LE_VALUES = tuple(repr(b) for b in LATENCY_BOUNDS) + ("+Inf",)
ZERO_Q = re.compile(r"0(\.0{0,3})?")     # RFC 9110 qvalue 0: "not acceptable"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

Sample = tuple[str, int | float]     # (rendered labels, value)


def escape(value: str) -> str:
    """A label value as the exposition formats quote it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(v: int | float) -> str:
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


class Exposition:
    """The lines of one scrape, family by family, in either format."""

    def __init__(self, openmetrics: bool):
        self.openmetrics = openmetrics
        self.lines: list[str] = []

    def _head(self, family: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {family} {help_text}")
        self.lines.append(f"# TYPE {family} {kind}")
        if self.openmetrics:
            for unit in ("seconds", "bytes"):
                if family.endswith("_" + unit):
                    self.lines.append(f"# UNIT {family} {unit}")

    def _samples(self, name: str, samples: Iterable[Sample]) -> None:
        self.lines.extend(f"{name}{{{labels}}} {number(v)}" if labels else f"{name} {number(v)}"
                          for labels, v in samples)

    def gauge(self, name: str, help_text: str, samples: Iterable[Sample]) -> None:
        self._head(name, "gauge", help_text)
        self._samples(name, samples)

    def counter(self, name: str, help_text: str, samples: Iterable[Sample]) -> None:
        """name ends with _total: the sample name, and in 0.0.4 the family's."""
        self._head(name[:-len("_total")] if self.openmetrics else name, "counter", help_text)
        self._samples(name, samples)

    def info(self, name: str, help_text: str, labels: str) -> None:
        """name ends with _info: an info family in OpenMetrics, a gauge of 1 in 0.0.4."""
        if self.openmetrics:
            self._head(name[:-len("_info")], "info", help_text)
        else:
            self._head(name, "gauge", help_text)
        self._samples(name, [(labels, 1)])

    def histogram(self, name: str, help_text: str,
                  series: Iterable[tuple[str, list[int], float]]) -> None:
        """series: (labels, cumulative counts per LE_VALUES, sum)."""
        self._head(name, "histogram", help_text)
        lines = self.lines
        for labels, counts, total in series:
            sep = "," if labels else ""
            for le, count in zip(LE_VALUES, counts, strict=True):
                lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {count}')
            lines.append(f"{name}_sum{{{labels}}} {number(total)}")
            lines.append(f"{name}_count{{{labels}}} {counts[-1]}")

    def body(self) -> bytes:
        if self.openmetrics:
            self.lines.append("# EOF")
        return ("\n".join(self.lines) + "\n").encode("utf-8", "surrogateescape")


# ---- what is measured ------------------------------------------------------------------

@functools.cache
def _process_start_time() -> float:
    """When the process started, as Prometheus's process collectors read
    it (/proc/self/stat's starttime after the boot time), not when the
    server was ready: a slow start must not look like a restart."""
    with open("/proc/stat") as f:
        boot = int(next(line for line in f if line.startswith("btime")).split()[1])
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _process(out: Exposition, server) -> None:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                [("", ru.ru_utime + ru.ru_stime)])
    try:
        with open("/proc/self/statm") as f:
            vsz, rss = (int(x) * PAGE_SIZE for x in f.read().split()[:2])
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:      # not Linux: what getrusage knows
        vsz, rss, fds = 0, ru.ru_maxrss * 1024, 0
    out.gauge("process_resident_memory_bytes", "Resident memory size in bytes.", [("", rss)])
    out.gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", [("", vsz)])
    out.gauge("process_open_fds", "Number of open file descriptors.", [("", fds)])
    out.gauge("process_max_fds", "Maximum number of open file descriptors.",
              [("", resource.getrlimit(resource.RLIMIT_NOFILE)[0])])
    out.gauge("process_start_time_seconds",
              "Start time of the process since unix epoch in seconds.",
              [("", _process_start_time())])


def _fronts(server) -> list[tuple[str, Iterable[tuple[str, Command]]]]:
    """(front, [(cmd label, Command)]) for RESP, HTTP and gRPC (its
    methods): the same class, so the same counters and histogram."""
    resp = ((c.name, c) for cmd in server.core.commands.values()
            for c in (cmd, *cmd.subcommands.values()))
    return [("resp", resp), ("http", server.http.endpoint_stats.items()),
            ("grpc", server.grpc.endpoint_stats.items())]


def _commands(out: Exposition, server) -> None:
    calls: list[Sample] = []
    errors: list[Sample] = []
    latency: list[tuple[str, list[int], float]] = []
    for front, commands in _fronts(server):
        for name, c in commands:
            if not (c.calls or c.failed_calls or c.rejected_calls):
                continue     # as INFO commandstats: the table's unused commands add no series
            labels = f'cmd="{escape(name)}",front="{front}"'
            calls.append((labels, c.calls))
            errors.append((labels + ',reason="failed"', c.failed_calls))
            errors.append((labels + ',reason="rejected"', c.rejected_calls))
            latency.append((labels, c.latency_buckets(), c.nsec / 1e9))
    out.counter("fastlimit_commands_total", "Calls run, by command and front.", calls)
    out.counter("fastlimit_command_errors_total",
                "Calls that failed (ran and answered an error) or were rejected (refused before "
                "running: arity, auth, READONLY...; not in commands_total).", errors)
    out.histogram("fastlimit_command_duration_seconds",
                  "Time spent in the server running each call, by command and front.", latency)
    out.counter("fastlimit_errors_total", "Error replies by error code (as INFO errorstats).",
                [(f'err="{escape(code)}"', n)
                 for code, n in sorted(server.core.error_counts.items())])


def _clients(out: Exposition, server) -> None:
    core = server.core
    fronts = (("resp", core), ("http", server.http.shared), ("grpc", server.grpc.shared))
    out.gauge("fastlimit_connected_clients", "Client connections open, by front.",
              [('front="resp"', len(core.clients))]
              + [(f'front="{name}"', len(f.connections)) for name, f in fronts[1:]])
    out.gauge("fastlimit_max_clients", "The maxclients setting.", [("", core.maxclients)])
    out.counter("fastlimit_connections_received_total", "Connections accepted, by front.",
                [(f'front="{name}"', f.total_connections) for name, f in fronts])
    out.counter("fastlimit_rejected_connections_total",
                "Connections refused (maxclients, protected mode), by front.",
                [(f'front="{name}"', f.rejected_connections) for name, f in fronts])
    http = server.http.shared
    out.counter("fastlimit_http_requests_total", "HTTP requests read.",
                [("", http.total_requests)])
    out.counter("fastlimit_http_bad_requests_total",
                "HTTP requests that could not be parsed (answered 400, connection closed).",
                [("", http.bad_requests)])
    out.counter("fastlimit_protocol_error_disconnections_total",
                "Connections closed for a protocol error.", [("", core.protocol_errors)])
    out.counter("fastlimit_auth_failures_total", "Failed authentications.",
                [("", server.auth_failures)])
    out.counter("fastlimit_net_input_bytes_total", "Bytes read from RESP clients.",
                [("", core.net_input_bytes)])
    out.counter("fastlimit_net_output_bytes_total", "Bytes written to RESP clients.",
                [("", core.net_output_bytes)])


def _buckets(out: Exposition, server, stats: dict) -> None:
    core = server.core
    out.gauge("fastlimit_buckets", "Buckets held (inline CL.CHECK ones and rules' ones).",
              [("", server.bucket_count())])
    out.gauge("fastlimit_bucket_memory_bytes", "Memory of the bucket tables.",
              [("", core.store.memory_bytes + core.rules.memory_bytes)])
    out.counter("fastlimit_buckets_expired_total", "Buckets removed once full again.",
                [("", core.store.expired_total + core.rules.expired_total)])
    out.counter("fastlimit_buckets_evicted_total", "Buckets evicted under memory pressure.",
                [("", server.maxmemory.evicted)])
    out.counter("fastlimit_sweep_runs_total", "Runs of the expiry sweep.",
                [("", stats.get("sweep_runs", 0))])
    out.gauge("fastlimit_sweep_budget_seconds", "The expiry sweep's time budget per run.",
              [("", stats.get("sweep_last_budget_ms", 0) / 1000)])


def _hotkeys(out: Exposition, server) -> None:
    hk = server.hotkeys
    t = hk.tracker
    out.gauge("fastlimit_hotkeys_tracking", "1 while the hot-key tracker counts checks.",
              [("", int(hk.active))])
    out.gauge("fastlimit_hotkeys_tracker_bytes", "Memory of the hot-key tracker (fixed by "
              "hotkeys-top-k).", [("", t.nbytes)])
    out.counter("fastlimit_hotkeys_sampled_checks_total", "Checks the hot-key tracker counted "
                "since its collection began.", [("", t.sampled)])
    shown = hk.entries(hk.now_ms(), hk.metrics_keys) if hk.metrics_keys else []
    rates: dict[str, float] = {}
    for e in shown:
        labels = f'key="{escape(report.text(e.name))}",source="{e.source}"'
        if e.rule is not None:
            labels += f',rule="{escape(e.rule)}"'
        # keys cut to the same 64 bytes are one series
        rates[labels] = rates.get(labels, 0.0) + e.ops
    out.gauge("fastlimit_hotkey_ops_per_second", "Estimated checks per second of the "
              "hottest keys (hotkeys-metrics-keys of them; key cut to 64 bytes).",
              [(labels, round(v, 3)) for labels, v in rates.items()])


SHED_DECISIONS = ("allowed", "denied")     # the order of LoadMeter.shed_counts()'s pairs


def _overload(out: Exposition, server) -> None:
    """The saturation meter's figures, as INFO shedding shows them
    (overload/subsystem.py): the last closed window's, and the shed
    checks by priority and answer."""
    meter = server.overload.meter
    f = meter.figures()
    counts = meter.shed_counts()
    out.counter("fastlimit_shed_checks_total",
                "Checks shed under overload (answered without their buckets), by priority and "
                "answer: allowed, or denied by a fail-closed rule (critical checks are never "
                "shed).",
                [(f'priority="{p}",decision="{d}"', n) for p in PRIORITIES
                 for d, n in zip(SHED_DECISIONS, counts[p], strict=True)])
    out.gauge("fastlimit_shed_level", "The overload level: 0 sheds nothing, 1 sheds PRIORITY "
              "low checks, 2 low and normal ones (DEBUG SHED-LEVEL may hold it).",
              [("", f["level"])])
    out.gauge("fastlimit_loop_busy_ratio", "The share of the last measuring window the event "
              "loop's thread spent on the CPU (0 to 1).", [("", f["busy_percent"] / 100)])
    out.gauge("fastlimit_loop_lag_seconds", "How late the event loop ran the overload probe, "
              "the longest in the last measuring window.", [("", f["lag_us"] / 1e6)])
    out.gauge("fastlimit_held_input_wait_seconds", "The longest a connection's held-back input "
              "waited to be read in the last measuring window (while saturated, critical "
              "connections are read first).", [("", f["wait_us"] / 1e6)])
    out.gauge("fastlimit_held_input_bytes", "Input bytes held back now, not yet read.",
              [("", f["pending_bytes"])])


def _regions(out: Exposition, server) -> None:
    """The region links and what crossed them (regions/subsystem.py), as
    INFO regions shows them; one series per peer region (at most 64)."""
    rs = server.regions_sync
    links = rs.links
    out.gauge("fastlimit_region_link_up", "1 while the link to a peer region is up.",
              [(f'peer="{escape(link.name)}"', int(link.shown_state == "up"))
               for link in links])
    out.gauge("fastlimit_region_link_last_reply_seconds", "Seconds since a peer region last "
              "answered (past region-partition-ms, global rules follow their partition "
              "policy).", [(f'peer="{escape(name)}"', round(age, 3))
                           for name, age in rs.link_ages().items()])
    out.gauge("fastlimit_region_link_lag_seconds", "The round trip of the last batch of "
              "spends a peer region acknowledged.",
              [(f'peer="{escape(link.name)}"', round(link.lag_ms, 1) / 1000) for link in links])
    out.counter("fastlimit_region_link_bytes_sent_total", "Bytes sent to a peer region.",
                [(f'peer="{escape(link.name)}"', link.bytes_sent) for link in links])
    out.gauge("fastlimit_region_link_queued_bytes", "Spends queued for a peer region, not "
              "yet acknowledged.", [(f'peer="{escape(link.name)}"', link.queued_bytes)
                                    for link in links])
    out.counter("fastlimit_region_link_batches_dropped_total", "Batches of spends dropped "
                "past region-buffer-limit.",
                [(f'peer="{escape(link.name)}"', link.batches_dropped) for link in links])
    out.gauge("fastlimit_region_partitioned", "1 while a peer region is unreachable.",
              [("", int(rs.partitioned))])
    out.counter("fastlimit_region_tokens_debited_total", "Tokens other regions spent, debited "
                "here.", [("", rs.tokens_debited)])
    out.counter("fastlimit_region_tokens_overdrawn_total", "Tokens other regions spent that "
                "found the bucket here emptier (the overshoot).", [("", rs.tokens_overdrawn)])


def _rule_decisions(server) -> list[Sample]:
    """Per rule and outcome, the first metrics-rule-labels rules (by id)
    under their own label and the rest summed under __other__."""
    registry = server.rules
    cap = max(0, server.settings.metrics_rule_labels)
    out: list[Sample] = []
    other = dict.fromkeys(DECISIONS, 0)
    for i, rule in enumerate(registry.list()):
        stats = registry.stats(rule.id)
        if i < cap:
            rule_label = f'rule="{escape(rule.id)}",decision='
            out.extend((f'{rule_label}"{d}"', stats[d]) for d in DECISIONS)
        else:
            for d in DECISIONS:
                other[d] += stats[d]
    if len(registry) > cap:
        out.extend((f'rule="{OTHER_RULES}",decision="{d}"', other[d]) for d in DECISIONS)
    return out


def _rules(out: Exposition, server, stats: dict, memory: dict) -> None:
    registry = server.rules
    out.counter("fastlimit_decisions_total",
                "Rule decisions by rule and outcome (shadow_denied: a shadow rule would have "
                f"denied); rules past metrics-rule-labels are summed as rule=\"{OTHER_RULES}\".",
                _rule_decisions(server))
    out.gauge("fastlimit_rules", "Rules defined.", [("", len(registry))])
    out.gauge("fastlimit_rules_version", "The rule set's version (one more per change).",
              [("", registry.version)])
    out.gauge("fastlimit_rules_last_change_timestamp_seconds",
              "When the rule set last changed (0: never).",
              [("", registry.last_change_ms / 1000)])
    out.gauge("fastlimit_rules_cache_entries", "Entries of the rules' match cache.",
              [("", memory.get("rules_cache_entries", 0))])
    out.gauge("fastlimit_rules_cache_bytes", "Estimated memory of the rules' match cache.",
              [("", memory.get("rules_cache_bytes", 0))])
    out.gauge("fastlimit_rules_cache_max_bytes", "The match cache's bound.",
              [("", memory.get("rules_cache_max_bytes", 0))])
    out.counter("fastlimit_rules_cache_hits_total", "Match cache hits.",
                [("", stats.get("rules_cache_hits", 0))])
    out.counter("fastlimit_rules_cache_misses_total", "Match cache misses.",
                [("", stats.get("rules_cache_misses", 0))])
    if server.rules_store is not None:
        _rules_store(out, server.rules_store)


STORE_STATES = ("connected", "reconnecting", "down", "connecting")


def _rules_store(out: Exposition, store) -> None:
    """A PostgreSQL rules-store's state, as INFO rules shows it."""
    out.gauge("fastlimit_rules_store_state", "1 for the rules store's current state.",
              [(f'state="{state}"', int(store.state == state)) for state in STORE_STATES])
    out.gauge("fastlimit_rules_store_version", "The highest row version applied.",
              [("", store.last_version)])
    out.gauge("fastlimit_rules_store_lag_seconds",
              "Commit to in force here, of the last notified change.", [("", store.lag_ms / 1000)])
    stale = store.staleness_s()
    out.gauge("fastlimit_rules_store_stale_seconds",
              "Time out of reach of the store (0 while connected; -1: never reached).",
              [("", -1 if stale == float("inf") else round(stale, 3))])
    out.counter("fastlimit_rules_store_notifications_total", "Notifications received.",
                [("", store.notifications)])
    out.counter("fastlimit_rules_store_full_reads_total",
                "Full compares with the table (at each connect and every rules-store-resync).",
                [("", store.full_reads)])
    out.counter("fastlimit_rules_store_connects_total", "Connections made to the store.",
                [("", store.connects)])
    out.counter("fastlimit_rules_store_rows_applied_total", "Rows applied.",
                [("", store.rows_applied)])
    out.counter("fastlimit_rules_store_rows_rejected_total",
                "Rows not applied because they do not validate.", [("", store.rows_rejected)])
    out.gauge("fastlimit_rules_store_rejected_row",
              "1 for each row not applied now (the first ones), by rule id and version.",
              [(f'rule="{escape(rule_id)}",version="{version}"', 1)
               for rule_id, (version, _) in sorted(store.rejected.items())])


def _replication(out: Exposition, server, repl: dict) -> None:
    primary = repl.get("role") == "master"
    out.gauge("fastlimit_replication_is_primary", "1 on a primary, 0 on a replica.",
              [("", int(primary))])
    out.gauge("fastlimit_replication_offset_bytes", "The replication stream's offset.",
              [("", repl.get("master_repl_offset", 0))])
    out.gauge("fastlimit_replication_connected_replicas", "Replicas following this node.",
              [("", repl.get("connected_slaves", 0))])
    now = time.monotonic()
    followers = list(server.replication.followers.values())
    out.gauge("fastlimit_replica_acked_offset_bytes",
              "The offset each replica last acknowledged.",
              [(f'replica="{escape(f"{f.ip}:{f.port}")}"', f.ack_offset) for f in followers])
    out.gauge("fastlimit_replica_lag_seconds", "Time since each replica's last acknowledgement.",
              [(f'replica="{escape(f"{f.ip}:{f.port}")}"', round(now - f.last_ack, 3))
               for f in followers])
    if primary:
        out.counter("fastlimit_replication_full_syncs_total", "Full copies sent to replicas.",
                    [("", repl.get("repl_full_syncs", 0))])
        out.counter("fastlimit_replication_dropped_replicas_total",
                    "Replicas dropped for falling too far behind.",
                    [("", repl.get("repl_dropped_replicas", 0))])
        return
    out.gauge("fastlimit_replication_link_up", "1 while the link to the primary is up.",
              [("", int(repl.get("master_link_status") == "up"))])
    out.gauge("fastlimit_replication_sync_in_progress", "1 during a full copy from the primary.",
              [("", repl.get("master_sync_in_progress", 0))])
    out.gauge("fastlimit_replication_link_failures", "Failed link attempts in a row.",
              [("", repl.get("master_link_failures", 0))])
    out.gauge("fastlimit_replication_lag_seconds",
              "How far behind the primary the last applied batch was.",
              [("", repl.get("repl_lag_last_ms", 0) / 1000)])
    out.counter("fastlimit_replication_records_applied_total",
                "Records applied from the primary's stream.",
                [("", repl.get("repl_records_applied", 0))])


def _rls_limits(server) -> dict[str, list[Sample]]:
    """Per LIMIT_STAT_FIELDS, the hits of each configured limit (the
    first metrics-rule-labels limits, by domain and name, under their own
    label; each domain's rest summed as limit="__other__")."""
    cap = max(0, server.settings.metrics_rule_labels)
    out: dict[str, list[Sample]] = {f: [] for f in LIMIT_STAT_FIELDS}
    other: dict[bytes, list[int]] = {}
    for i, ((domain, name, index), st) in enumerate(server.rls.service.limit_stats()):
        if i >= cap:
            sums = other.setdefault(domain, [0] * len(LIMIT_STAT_FIELDS))
            for j, f in enumerate(LIMIT_STAT_FIELDS):
                sums[j] += getattr(st, f)
            continue
        labels = (f'domain="{escape(domain.decode("utf-8", "replace"))}",'
                  f'limit="{escape(name if not index else f"{name}#{index}")}"')
        for f in LIMIT_STAT_FIELDS:
            out[f].append((labels, getattr(st, f)))
    for domain, sums in sorted(other.items()):
        labels = f'domain="{escape(domain.decode("utf-8", "replace"))}",limit="{OTHER_RULES}"'
        for f, n in zip(LIMIT_STAT_FIELDS, sums, strict=True):
            out[f].append((labels, n))
    return out


def _rls(out: Exposition, server) -> None:
    service = server.rls.service
    domains = sorted(service.stats.items())
    label = [f'domain="{escape(name.decode("utf-8", "replace"))}"' for name, _ in domains]
    out.counter("fastlimit_rls_calls_total", "ShouldRateLimit calls, by domain.",
                [(lb, s.calls) for lb, (_, s) in zip(label, domains, strict=True)])
    out.counter("fastlimit_rls_over_limit_calls_total",
                "ShouldRateLimit calls answered OVER_LIMIT, by domain.",
                [(lb, s.over_limit) for lb, (_, s) in zip(label, domains, strict=True)])
    out.counter("fastlimit_rls_unknown_domain_calls_total",
                "ShouldRateLimit calls for a domain not configured.",
                [("", service.unknown_domain)])
    hits = _rls_limits(server)
    for field, help_text in (
            ("total_hits", "Hits counted, by domain and limit (the reference's total_hits)."),
            ("within_limit", "Hits within the limit."),
            ("near_limit", f"Hits past {NEAR_LIMIT_RATIO:g} of the limit, within it or not."),
            ("over_limit", "Hits over the limit."),
            ("shadow_mode", "Hits over a shadow_mode limit, answered OK.")):
        name = "fastlimit_rls_hits_total" if field == "total_hits" else \
            f"fastlimit_rls_{field}_hits_total"
        out.counter(name, help_text, hits[field])


def _snapshot(out: Exposition, persistence: dict) -> None:
    out.gauge("fastlimit_snapshot_last_save_timestamp_seconds",
              "When the last snapshot was saved (0: never).",
              [("", persistence.get("rdb_last_save_time", 0))])
    out.gauge("fastlimit_snapshot_in_progress", "1 while a snapshot is being written.",
              [("", persistence.get("rdb_bgsave_in_progress", 0))])
    out.gauge("fastlimit_snapshot_last_save_success", "1 if the last snapshot save succeeded.",
              [("", int(persistence.get("rdb_last_bgsave_status", "ok") == "ok"))])
    out.counter("fastlimit_snapshot_saves_total", "Snapshots saved.",
                [("", persistence.get("rdb_saves", 0))])


def _cluster(out: Exposition, server) -> None:
    """Cluster mode only: how many of the 16384 slots have a known primary
    (fewer: some keys are answered by no one; readyz fails too)."""
    cluster = server.cluster
    if cluster.enabled:
        out.gauge("fastlimit_cluster_slots_served",
                  "Hash slots with a known primary (16384 when every key is served).",
                  [("", cluster.slots_served())])


def _tls(out: Exposition, server) -> None:
    """When each configured certificate file's (first) certificate expires:
    the file as it is now, which a reload (CONFIG SET, SIGHUP) would load."""
    rows = []
    for setting in CERTIFICATE_SETTINGS:
        path = getattr(server.settings, setting.replace("-", "_"))
        not_after = certificate_not_after(path) if path else None
        if not_after is not None:
            rows.append((f'setting="{setting}"', not_after))
    if rows:
        out.gauge("fastlimit_tls_certificate_expiry_timestamp_seconds",
                  "When the certificate of each TLS setting stops being valid (notAfter).",
                  rows)


def _windows(out: Exposition, server) -> None:
    store = server.windows.store
    out.gauge("fastlimit_windows_keys",
              "Windowed counters held (the limits library's strategies: CL.FIXED, "
              "CL.MOVING, CL.SLIDING).", [("", len(store))])


def render(server, openmetrics: bool) -> bytes:
    """One scrape of `server` (fastlimit.server.app.Server)."""
    out = Exposition(openmetrics)
    out.info("fastlimit_build_info", "The running fastlimit build.",
             f'version="{escape(__version__)}",python_version='
             f'"{escape(platform.python_version())}",event_loop="{escape(server.loop_name)}"')
    _process(out, server)
    # The subsystems' INFO fields (sweep, rules cache, replication,
    # snapshots): the numbers INFO shows, read the same way.
    sections = server.subsystem_info(
        frozenset(("stats", "memory", "persistence", "replication")), frozenset())
    stats, memory = sections.get("stats", {}), sections.get("memory", {})
    _clients(out, server)
    _commands(out, server)
    _rls(out, server)
    _buckets(out, server, stats)
    _rules(out, server, stats, memory)
    _hotkeys(out, server)
    _overload(out, server)
    _regions(out, server)
    _replication(out, server, sections.get("replication", {}))
    _snapshot(out, sections.get("persistence", {}))
    _windows(out, server)
    _cluster(out, server)
    _tls(out, server)
    return out.body()


def wants_openmetrics(accept: str) -> bool:
    """Whether an Accept header takes OpenMetrics 1.x (as client_python
    decides: the media type with no version or a version from 1 on), and
    does not refuse it with q=0."""
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        options = {name.strip().lower(): value.strip()
                   for name, _, value in (p.partition("=") for p in params)}
        if ZERO_Q.fullmatch(options.get("q", "1")):
            continue
        major = options.get("version", "1").partition(".")[0]
        if major.isascii() and major.isdigit() and major.lstrip("0"):
            return True
    return False


def metrics(req: Request) -> Response:
    openmetrics = wants_openmetrics(req.headers.get("accept", ""))
    return Response(200, render(req.server, openmetrics),
                    OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE)


ROUTES = [("GET", "/metrics", metrics)]
