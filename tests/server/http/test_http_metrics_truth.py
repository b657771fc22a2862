"""Every series /metrics shows is the counter it claims to show: one
table, a row per family, each checked after traffic that moves it
against its INFO field (or, for the few INFO has not, against /proc or
the requests that caused it).  A family the table has no row for fails
the test, so a new series comes with its check.

INFO is read just before and just after the scrape; a counter must lie
between the two readings (the scrape itself moves a few)."""

from __future__ import annotations

import http.client
import json
import os
import socket

from metrics_text import samples
from wire import Wire, free_port, wait_until

from fastlimit.rls.subsystem import _label

RLS_YAML = """domain: web
descriptors:
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
AUTH = {"Authorization": "Bearer pw"}


def info_of(r) -> dict:
    return r.info("everything", "rules")     # per-rule lines only when named


def field(name: str):
    return lambda i, labels: i[name]


def per_front(resp: str, http_: str, grpc: str):
    names = {"resp": resp, "http": http_, "grpc": grpc}
    return lambda i, labels: i[names[labels["front"]]]


def cmdstat(key: str):
    """A RESP command's commandstats field; an HTTP route's count is the
    requests the test made (INFO has no HTTP commandstats)."""
    def expected(i, labels):
        if labels["front"] == "http":
            if key == "usec":      # some time, less than the test's
                return (1 if HTTP_CALLS.get(labels["cmd"]) else 0), 60e6
            return HTTP_CALLS.get(labels["cmd"], {}).get(key, 0)
        stats = i.get(f"cmdstat_{labels['cmd']}", {})
        if key == "duration_count":
            return stats.get("calls", 0)
        return stats.get(key, 0)
    return expected


def region_peer(key: str, per: int = 1, up: bool = False):
    """A field of the peer<i> line of INFO regions for the label's peer, divided by
    `per` as the exporter divides it (0.9 / 1000, not 0.9 * 1e-3, which is a float
    one ulp above)."""
    def expected(i, labels):
        (peer,) = [v for k, v in i.items() if k.startswith("peer") and isinstance(v, dict)
                   and v["name"] == labels["peer"]]
        return int(peer["state"] == "up") if up else float(peer[key]) / per
    return expected


def usec_range(usec) -> tuple[float, float]:
    low, high = usec if isinstance(usec, tuple) else (usec, usec + 1)
    return low / 1e6, high / 1e6


def rule_decision(i, labels):
    rows = [v for k, v in i.items() if k.startswith("rule") and k[4:].isdigit()]
    [row] = [v for v in rows if v["id"] == labels["rule"]]
    return row[labels["decision"]]


def rls_domain(key: str):
    return lambda i, labels: i[f"rls_domain_{_label(labels['domain'].encode())}"][key]


def rls_limit(key: str):
    return lambda i, labels: i[f"rls_limit_{_label(labels['limit'].encode())}"][key]


def follower(key: str):
    def expected(i, labels):
        [f] = [v for k, v in i.items() if k.startswith("slave") and
               f"{v['ip']}:{v['port']}" == labels["replica"]]
        return f[key]
    return expected


def shed_checks(i, labels):
    """INFO shedding's shed_checks_<priority> (allowed=..,denied=..; INFO
    stats has a sum of the same name for low and normal, but shedding
    comes after it, so its field is the one read)."""
    return i[f"shed_checks_{labels['priority']}"][labels["decision"]]


def window_figure(name: str, scale: float, slack: float):
    """One of the saturation meter's figures of its last closed window:
    a window closes every 20 ms, so the scrape may read another one than
    INFO did; a range, slack either side of the reading (times scale)."""
    return lambda i, labels: (i[name] * scale - slack, i[name] * scale + slack)


def proc_fds(i, labels):
    return len(os.listdir(f"/proc/{i['process_id']}/fd"))


def proc_statm(index: int):
    def expected(i, labels):
        with open(f"/proc/{i['process_id']}/statm") as f:
            return int(f.read().split()[index]) * os.sysconf("SC_PAGE_SIZE")
    return expected


def proc_max_fds(i, labels):
    with open(f"/proc/{i['process_id']}/limits") as f:
        [line] = [x for x in f if x.startswith("Max open files")]
    return int(line.split()[3])


def proc_start(i, labels):
    with open("/proc/stat") as f:
        boot = int([x for x in f if x.startswith("btime")][0].split()[1])
    with open(f"/proc/{i['process_id']}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


# family -> (expected value from INFO, tolerance): tolerance None is "between
# the readings before and after the scrape"; a number is an absolute or,
# below 1, a relative bound against the reading after it.
TABLE = {
    "fastlimit_build_info": (lambda i, labels: int(labels["version"] == i["fastlimit_version"]
                                                   and labels["python_version"]
                                                   == i["python_version"]), None),
    "process_cpu_seconds_total": (lambda i, labels: i["used_cpu_sys"] + i["used_cpu_user"], None),
    "process_resident_memory_bytes": (field("used_memory_rss"), 0.2),
    "process_virtual_memory_bytes": (proc_statm(0), 0.2),
    "process_open_fds": (proc_fds, 3),
    "process_max_fds": (proc_max_fds, 0),
    "process_start_time_seconds": (proc_start, 1.5),
    # the scrape's own connection is open while it is rendered
    "fastlimit_connected_clients": (
        lambda i, labels: per_front("connected_clients", "http_connected_clients",
                                    "grpc_connected_clients")(i, labels)
        + (labels["front"] == "http"), None),
    "fastlimit_max_clients": (field("maxclients"), None),
    "fastlimit_connections_received_total": (
        per_front("total_connections_received", "http_total_connections_received",
                  "grpc_total_connections_received"), None),
    "fastlimit_rejected_connections_total": (
        per_front("rejected_connections", "http_rejected_connections",
                  "grpc_rejected_connections"), None),
    "fastlimit_http_requests_total": (field("http_total_requests"), None),
    "fastlimit_http_bad_requests_total": (field("http_bad_requests"), None),
    "fastlimit_protocol_error_disconnections_total": (field("protocol_error_disconnections"),
                                                      None),
    "fastlimit_auth_failures_total": (field("acl_access_denied_auth"), None),
    "fastlimit_net_input_bytes_total": (field("total_net_input_bytes"), None),
    "fastlimit_net_output_bytes_total": (field("total_net_output_bytes"), None),
    "fastlimit_commands_total": (cmdstat("calls"), None),
    "fastlimit_command_errors_total": (
        lambda i, labels: cmdstat(f"{labels['reason']}_calls")(i, labels), None),
    "fastlimit_command_duration_seconds_count": (cmdstat("duration_count"), None),
    # INFO's usec is the sum's nanoseconds // 1000
    "fastlimit_command_duration_seconds_sum": (
        lambda i, labels: usec_range(cmdstat("usec")(i, labels)), None),
    "fastlimit_command_duration_seconds_bucket": (None, None),       # see the histogram check
    "fastlimit_errors_total": (lambda i, labels: i[f"errorstat_{labels['err']}"]["count"], None),
    "fastlimit_rls_calls_total": (rls_domain("calls"), None),
    "fastlimit_rls_over_limit_calls_total": (rls_domain("over_limit"), None),
    "fastlimit_rls_unknown_domain_calls_total": (field("rls_unknown_domain_calls"), None),
    "fastlimit_rls_hits_total": (rls_limit("total_hits"), None),
    "fastlimit_rls_within_limit_hits_total": (rls_limit("within_limit"), None),
    "fastlimit_rls_near_limit_hits_total": (rls_limit("near_limit"), None),
    "fastlimit_rls_over_limit_hits_total": (rls_limit("over_limit"), None),
    "fastlimit_rls_shadow_mode_hits_total": (rls_limit("shadow_mode"), None),
    "fastlimit_buckets": (field("buckets"), None),
    "fastlimit_bucket_memory_bytes": (field("bucket_table_bytes"), None),
    "fastlimit_buckets_expired_total": (field("expired_keys"), None),
    "fastlimit_buckets_evicted_total": (field("evicted_keys"), None),
    "fastlimit_sweep_runs_total": (field("sweep_runs"), None),
    "fastlimit_sweep_budget_seconds": (lambda i, labels: i["sweep_last_budget_ms"] / 1000, None),
    "fastlimit_decisions_total": (rule_decision, None),
    "fastlimit_rules": (field("rules"), None),
    "fastlimit_rules_version": (field("rules_version"), None),
    "fastlimit_rules_last_change_timestamp_seconds": (
        lambda i, labels: i["rules_last_change_ms"] / 1000, None),
    "fastlimit_rules_cache_entries": (field("rules_cache_entries"), None),
    "fastlimit_rules_cache_bytes": (field("rules_cache_bytes"), None),
    "fastlimit_rules_cache_max_bytes": (field("rules_cache_max_bytes"), None),
    "fastlimit_rules_cache_hits_total": (field("rules_cache_hits"), None),
    "fastlimit_rules_cache_misses_total": (field("rules_cache_misses"), None),
    "fastlimit_hotkeys_tracking": (field("hotkeys_tracking"), None),
    "fastlimit_hotkeys_tracker_bytes": (field("hotkeys_tracker_bytes"), None),
    "fastlimit_hotkeys_sampled_checks_total": (field("hotkeys_sampled_checks"), None),
    # an estimate over a moving window: tests/hotkeys/ checks it against HOTKEYS GET
    "fastlimit_hotkey_ops_per_second": (None, None),
    "fastlimit_shed_checks_total": (shed_checks, None),
    "fastlimit_shed_level": (field("shed_level"), None),
    "fastlimit_loop_busy_ratio": (window_figure("shed_busy_percent", 0.01, 0.5), None),
    "fastlimit_loop_lag_seconds": (window_figure("shed_loop_lag_us", 1e-6, 0.5), None),
    "fastlimit_held_input_wait_seconds": (window_figure("shed_wait_us", 1e-6, 0.5), None),
    "fastlimit_held_input_bytes": (field("shed_pending_bytes"), None),
    "fastlimit_region_link_up": (region_peer("state", up=True), None),
    "fastlimit_region_link_last_reply_seconds": (region_peer("last_reply_ms", 1000), 1.0),
    "fastlimit_region_link_lag_seconds": (region_peer("lag_ms", 1000), None),
    "fastlimit_region_link_bytes_sent_total": (region_peer("bytes_sent"), None),
    "fastlimit_region_link_queued_bytes": (region_peer("queued_bytes"), None),
    "fastlimit_region_link_batches_dropped_total": (region_peer("batches_dropped"), None),
    "fastlimit_region_partitioned": (field("region_partitioned"), None),
    "fastlimit_region_tokens_debited_total": (field("region_tokens_debited"), None),
    "fastlimit_region_tokens_overdrawn_total": (field("region_tokens_overdrawn"), None),
    "fastlimit_replication_is_primary": (lambda i, labels: int(i["role"] == "master"), None),
    "fastlimit_replication_offset_bytes": (field("master_repl_offset"), None),
    "fastlimit_replication_connected_replicas": (field("connected_slaves"), None),
    "fastlimit_replica_acked_offset_bytes": (follower("offset"), None),
    "fastlimit_replica_lag_seconds": (follower("lag"), 1.5),
    "fastlimit_replication_full_syncs_total": (field("repl_full_syncs"), None),
    "fastlimit_replication_dropped_replicas_total": (field("repl_dropped_replicas"), None),
    "fastlimit_replication_link_up": (lambda i, labels: int(i["master_link_status"] == "up"),
                                      None),
    "fastlimit_replication_sync_in_progress": (field("master_sync_in_progress"), None),
    "fastlimit_replication_link_failures": (field("master_link_failures"), None),
    "fastlimit_replication_lag_seconds": (lambda i, labels: i["repl_lag_last_ms"] / 1000, None),
    "fastlimit_replication_records_applied_total": (field("repl_records_applied"), None),
    "fastlimit_snapshot_last_save_timestamp_seconds": (field("rdb_last_save_time"), None),
    "fastlimit_snapshot_in_progress": (field("rdb_bgsave_in_progress"), None),
    "fastlimit_snapshot_last_save_success": (
        lambda i, labels: int(i["rdb_last_bgsave_status"] == "ok"), None),
    "fastlimit_snapshot_saves_total": (field("rdb_saves"), None),
    "fastlimit_windows_keys": (field("windows_keys"), None),
    # cluster mode only, so not shown by this server: CLUSTER INFO's
    # cluster_slots_ok (Cluster.slots_served), which tests/cluster/ checks
    "fastlimit_cluster_slots_served": (None, None),
    # with TLS certificate settings only (this server has none): the files'
    # notAfter, checked against the certificates in tests/alerts/
    "fastlimit_tls_certificate_expiry_timestamp_seconds": (None, None),
}

# The families the traffic below must move (from their value before it);
# the rest are gauges of settings, or of a state this test does not change
# (a replica's link is checked on the replica, after it synced).
MOVED = {
    "process_cpu_seconds_total", "fastlimit_connections_received_total",
    "fastlimit_rejected_connections_total", "fastlimit_http_requests_total",
    "fastlimit_http_bad_requests_total", "fastlimit_protocol_error_disconnections_total",
    "fastlimit_auth_failures_total", "fastlimit_net_input_bytes_total",
    "fastlimit_net_output_bytes_total", "fastlimit_commands_total",
    "fastlimit_command_errors_total", "fastlimit_command_duration_seconds_count",
    "fastlimit_errors_total", "fastlimit_rls_calls_total", "fastlimit_rls_over_limit_calls_total",
    "fastlimit_rls_unknown_domain_calls_total", "fastlimit_rls_hits_total",
    "fastlimit_rls_within_limit_hits_total", "fastlimit_rls_near_limit_hits_total",
    "fastlimit_rls_over_limit_hits_total", "fastlimit_buckets", "fastlimit_buckets_expired_total",
    "fastlimit_buckets_evicted_total", "fastlimit_sweep_runs_total", "fastlimit_decisions_total",
    "fastlimit_rules", "fastlimit_rules_version",
    "fastlimit_rules_last_change_timestamp_seconds", "fastlimit_rules_cache_entries",
    "fastlimit_rules_cache_hits_total", "fastlimit_rules_cache_misses_total",
    "fastlimit_replication_offset_bytes", "fastlimit_replication_connected_replicas",
    "fastlimit_replica_acked_offset_bytes", "fastlimit_replication_full_syncs_total",
    "fastlimit_snapshot_saves_total", "fastlimit_shed_checks_total",
    "fastlimit_region_link_bytes_sent_total",
}

# HTTP route -> what the test's requests to it add (INFO has no HTTP commandstats).
HTTP_CALLS: dict[str, dict[str, int]] = {}


def http_call(port: int, method: str, path: str, body=None, *, route: str):
    """One request; a route counts a call, and a failed one for a status from 400."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=AUTH)
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    stats = HTTP_CALLS.setdefault(route, {"calls": 0, "failed_calls": 0, "rejected_calls": 0,
                                          "duration_count": 0})
    stats["calls"] += 1
    stats["duration_count"] += 1
    stats["failed_calls"] += resp.status >= 400
    return resp.status


def scrape(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=AUTH)
        resp = conn.getresponse()
        assert resp.status == 200
        return samples(resp.read().decode())
    finally:
        conn.close()


def family(name: str) -> str:
    return name if name in TABLE else name.rsplit("_", 1)[0]


def check(r, port: int, baseline: dict | None = None) -> dict:
    """Every sample against its row; returns the samples."""
    before = info_of(r)
    series = scrape(port)
    after = info_of(r)
    unknown = {name for name, _ in series} - set(TABLE)
    assert not unknown, f"series with no row in the table: {sorted(unknown)}"
    for (name, labelset), value in series.items():
        expected, tolerance = TABLE[name]
        if expected is None:
            continue
        labels = dict(labelset)
        if name.startswith("fastlimit_command") and labels.get("cmd") == "GET /metrics":
            # this scrape: counted when it finished, after it was rendered
            continue
        if tolerance is None:
            readings = [expected(before, labels), expected(after, labels)]
            if isinstance(readings[0], tuple):     # a reading that is a range itself
                readings = [*readings[0], *readings[1]]
            low, high = min(readings), max(readings)
            assert low <= value <= high, (name, labels, low, value, high)
        else:
            want = expected(after, labels)
            bound = tolerance * want if 0 < tolerance < 1 else tolerance
            assert abs(value - want) <= bound, (name, labels, value, want)
    histograms(series)
    if baseline is not None:
        moved = {name for (name, labelset), value in series.items()
                 if baseline.get((name, labelset)) != value}
        assert MOVED <= {family(n) if n not in TABLE else n for n in moved}, \
            sorted(MOVED - moved)
    return series


def histograms(series: dict) -> None:
    buckets: dict[frozenset, list[tuple[float, float]]] = {}
    for (name, labelset), value in series.items():
        if name == "fastlimit_command_duration_seconds_bucket":
            labels = dict(labelset)
            le = labels.pop("le")
            buckets.setdefault(frozenset(labels.items()), []).append(
                (float("inf") if le == "+Inf" else float(le), value))
    for labels, points in buckets.items():
        counts = [c for _, c in sorted(points)]
        assert counts == sorted(counts)
        assert counts[-1] == series[("fastlimit_command_duration_seconds_count", labels)]


def traffic(srv, r, port: int, grpc_port: int) -> None:
    """Moves every family of MOVED."""
    rule = {"match": {"resource": "api"}, "algorithm": "token_bucket", "capacity": 2,
            "refill_per_second": 1}
    r.execute_command("CL.RULE", "SET", "api", json.dumps(rule))
    r.execute_command("CL.RULE", "SET", "trial", json.dumps(
        {**rule, "match": {"resource": "trial"}, "capacity": 1, "mode": "shadow"}))
    for _ in range(3):
        r.execute_command("CL.LIMIT", "u", "api")          # 2 allowed, 1 denied
    for _ in range(2):
        r.execute_command("CL.LIMIT", "u", "trial")        # 1 allowed, 1 shadow-denied
    r.execute_command("CL.CHECK", "short", 1, 1)
    # a global rule's spend crosses to the peer region
    r.execute_command("CL.RULE", "SET", "world", json.dumps(
        {**rule, "match": {"resource": "world"}, "regions": "global"}))
    r.execute_command("CL.LIMIT", "u", "world")
    wait_until(lambda: info_of(r)["peer0"]["batches_acked"] > 0, what="the spend acknowledged")
    # shedding, the level held by DEBUG SHED-LEVEL: low checks shed at 1
    # (allowed), a fail-closed rule's normal check at 2 (denied)
    r.execute_command("CL.RULE", "SET", "strict", json.dumps(
        {**rule, "match": {"resource": "strict"}, "on_failure": "closed"}))
    r.execute_command("DEBUG", "SHED-LEVEL", 1)
    for _ in range(2):
        assert r.execute_command("CL.CHECK", "shed", 5, 1, "PRIORITY", "low")[2] == -2
    r.execute_command("DEBUG", "SHED-LEVEL", 2)
    assert r.execute_command("CL.LIMIT", "u", "strict", "PRIORITY", "normal")[:3] == [0, -1, -2]
    r.execute_command("DEBUG", "SHED-LEVEL", 0)
    r.execute_command("DEBUG", "SHED-LEVEL", "AUTO")
    with Wire.to(srv.port) as w:
        w.call("AUTH", "pw")
        assert w.call("CL.CHECK", "k").startswith(b"-ERR")                 # rejected
        assert w.call("CL.CHECK", "k", 5, 1, "COST", "x").startswith(b"-ERR")   # failed
        assert w.call("AUTH", "wrong").startswith(b"-WRONGPASS")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"*1\r\n$x\r\n")                       # a protocol error
        assert s.recv(1000).startswith(b"-ERR Protocol error")
    http_call(port, "POST", "/v1/check", b'{"client_key":"h","resource":"api"}',
              route="check")
    http_call(port, "POST", "/v1/check", b"{", route="check")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x00garbage\r\n\r\n")                # a bad request
        s.recv(1000)
    http_call(port, "POST", "/json", json.dumps(
        {"domain": "web", "descriptors": [{"entries": [{"key": "path", "value": "/"}]}]}),
        route="POST /json")
    http_call(port, "POST", "/json", json.dumps(
        {"domain": "web", "descriptors": [{"entries": [{"key": "path", "value": "/"}]}]}),
        route="POST /json")                   # over its limit: 429
    http_call(port, "POST", "/json", json.dumps(
        {"domain": "nope", "descriptors": [{"entries": [{"key": "path", "value": "/"}]}]}),
        route="POST /json")
    socket.create_connection(("127.0.0.1", grpc_port), timeout=5).close()
    # rejected on every front: maxclients 1, with a connection open on each
    held = [socket.create_connection(("127.0.0.1", p), timeout=5)
            for p in (port, grpc_port)]
    wait_until(lambda: r.info("clients")["http_connected_clients"] == 1
               and r.info("clients")["grpc_connected_clients"] == 1, what="the held connections")
    r.config_set("maxclients", 1)
    for p in (srv.port, port, grpc_port):
        with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
            s.settimeout(5)
            try:
                s.recv(1000)
            except (ConnectionResetError, TimeoutError):
                pass
    r.config_set("maxclients", 10000)
    for s in held:
        s.close()
    # expiry: the short bucket is full again a second on, and the sweep removes it
    r.execute_command("DEBUG", "CLOCK", "ADVANCE", 5000)
    wait_until(lambda: r.info("stats")["expired_keys"] >= 1, what="the sweep to expire")
    # eviction: a flood, then a lower bound that the ticks evict down to
    with Wire.to(srv.port) as w:
        w.call("AUTH", "pw")
        w.send(b"".join(b"*4\r\n$8\r\nCL.CHECK\r\n$%d\r\n%s\r\n$2\r\n10\r\n$1\r\n1\r\n"
                        % (len(k), k) for k in (b"flood:%d" % i for i in range(3000))))
        for _ in range(3000):
            w.read_reply()
    dataset = r.info("memory")["used_memory_dataset"]
    r.config_set("maxmemory", int(dataset * 0.8))
    wait_until(lambda: r.info("stats")["evicted_keys"] > 0, what="an eviction")
    r.config_set("maxmemory", 0)
    r.execute_command("SAVE")


def test_every_series_is_the_counter_it_claims_to_show(make_http_server, tmp_path):
    rls = tmp_path / "rls.yaml"
    rls.write_text(RLS_YAML)
    grpc_port = free_port()
    # a peer region, which the server's region link sends its spends to
    peer = make_http_server("--manual-clock", "--region", "us", "--regions", "eu", "us")
    # shed-threshold 0: the shed level is DEBUG SHED-LEVEL's only, never
    # the load's (a gauge that could move between INFO and the scrape)
    srv = make_http_server("--manual-clock", "--requirepass", "pw", "--rls-config", str(rls),
                           "--grpc-port", str(grpc_port), "--shed-threshold", "0",
                           "--snapshot-file", str(tmp_path / "dump.fls"),
                           "--region", "eu", "--regions", "eu", "us",
                           "--region-peers", f"us=127.0.0.1:{peer.port}")
    r = srv.client(password="pw")
    HTTP_CALLS.clear()
    baseline = check(r, srv.http_port)
    replica = make_http_server("--manual-clock", "--masterauth", "pw", "--shed-threshold", "0",
                               "--replicaof", "127.0.0.1", str(srv.port))
    rr = replica.client()
    wait_until(lambda: rr.info("replication")["master_link_status"] == "up",
               what="the replica's link")
    traffic(srv, r, srv.http_port, grpc_port)
    wait_until(lambda: rr.info("replication")["repl_records_applied"] > 0
               and info_of(r)["slave0"]["offset"] == info_of(r)["master_repl_offset"],
               what="the replica to catch up")
    check(r, srv.http_port, baseline)
    assert scrape(srv.http_port)[("fastlimit_region_link_up", frozenset({("peer", "us")}))] == 1
    # the replica's own view of its link
    HTTP_CALLS.clear()
    series = check(rr, replica.http_port)
    assert series[("fastlimit_replication_link_up", frozenset())] == 1
    assert series[("fastlimit_replication_records_applied_total", frozenset())] > 0
    assert series[("fastlimit_buckets_evicted_total", frozenset())] >= 0
    assert series[("fastlimit_replication_is_primary", frozenset())] == 0
