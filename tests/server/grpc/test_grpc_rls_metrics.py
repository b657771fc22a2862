"""The Envoy rate limit service in /metrics and INFO: calls per domain,
hits per configured limit as the reference's stats count them (never a
series per descriptor value), and the gRPC methods beside the commands."""

from __future__ import annotations

import http.client

from metrics_text import named, samples, value
from rls_messages import descriptor, request
from wire import free_port

T0 = 1_767_830_400_000
CONFIG = """domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ghost
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    rate_limits:
      - {unit: second, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 200, algorithm: token_bucket}
"""


def scrape(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return samples(conn.getresponse().read().decode())
    finally:
        conn.close()


def hit(srv, key: str, value_: str, hits: int | None = None) -> None:
    srv.should_rate_limit(request(b"web", descriptor([(key.encode(), value_.encode())],
                                                     hits_addend=hits)))


def rls_server(make_grpc_server, tmp_path, *args: str):
    config = tmp_path / "rls.yaml"
    config.write_text(CONFIG)
    http_port = free_port()
    srv = make_grpc_server("--manual-clock", "--rls-config", str(config),
                           "--http-port", str(http_port), *args)
    srv.client().execute_command("DEBUG", "CLOCK", "SET", T0)
    return srv, http_port


def test_hits_per_limit_are_the_references_stats_and_no_series_per_value(
        make_grpc_server, tmp_path):
    srv, http_port = rls_server(make_grpc_server, tmp_path)
    for i in range(7):
        hit(srv, "user", f"u{i % 2}")               # u0: 4, u1: 3 - one limit, one series
    hit(srv, "user", "u0", hits=6)                  # u0 at 10: 8 hits past 8, within
    hit(srv, "user", "u0", hits=3)                  # u0 at 13: 3 over
    hit(srv, "ghost", "g")
    hit(srv, "ghost", "g", hits=2)                  # over a shadow limit: answered OK
    hit(srv, "path", "/a")
    series = scrape(http_port)
    user = {"domain": "web", "limit": "web.user"}
    assert [value(series, f"fastlimit_rls_{f}_total", **user) for f in (
        "hits", "within_limit_hits", "near_limit_hits", "over_limit_hits",
        "shadow_mode_hits")] == [16, 13, 2, 3, 0]
    ghost = {"domain": "web", "limit": "web.ghost"}
    assert value(series, "fastlimit_rls_over_limit_hits_total", **ghost) == 2
    assert value(series, "fastlimit_rls_shadow_mode_hits_total", **ghost) == 2
    assert {dict(labels)["limit"] for labels in named(series, "fastlimit_rls_hits_total")} == {
        "web.user", "web.ghost", "web.path", "web.path#1"}
    assert value(series, "fastlimit_rls_calls_total", domain="web") == 12
    assert value(series, "fastlimit_rls_over_limit_calls_total", domain="web") == 1
    grpc_calls = value(series, "fastlimit_commands_total", cmd="should_rate_limit", front="grpc")
    assert grpc_calls == 12
    assert value(series, "fastlimit_command_duration_seconds_count",
                 cmd="should_rate_limit", front="grpc") == 12
    assert value(series, "fastlimit_connected_clients", front="grpc") == 1
    info = srv.client().info("rls")
    assert info["rls_limit_web.user"] == {"total_hits": 16, "within_limit": 13,
                                          "near_limit": 2, "over_limit": 3, "shadow_mode": 0}


def test_limits_past_the_label_cap_are_summed_per_domain(make_grpc_server, tmp_path):
    srv, http_port = rls_server(make_grpc_server, tmp_path, "--metrics-rule-labels", "1")
    hit(srv, "user", "u")
    hit(srv, "path", "/a", hits=5)
    series = scrape(http_port)
    assert named(series, "fastlimit_rls_hits_total") == {
        frozenset({("domain", "web"), ("limit", "web.ghost")}): 0,
        frozenset({("domain", "web"), ("limit", "__other__")}): 1 + 5 + 5}


def test_the_counts_outlive_a_reload_that_keeps_the_limit(make_grpc_server, tmp_path):
    srv, http_port = rls_server(make_grpc_server, tmp_path)
    hit(srv, "user", "u", hits=4)
    (tmp_path / "rls.yaml").write_text(CONFIG.replace("requests_per_unit: 100", "requests_per_unit: 50"))
    srv.client().execute_command("CL.RULE", "RELOAD")
    hit(srv, "user", "u")
    assert value(scrape(http_port), "fastlimit_rls_hits_total", domain="web",
                 limit="web.user") == 5
