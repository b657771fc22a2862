"""GET /metrics against real server processes over real HTTP: the exact
series after known commands under the manual clock, the per-rule label's
cap, both exposition formats (promtool lints the text one; a real
Prometheus, Debian's 2.42, scrapes the OpenMetrics one it asks for and
answers PromQL from it), and a scrape's cost with 1,000 rules.

Bounded everywhere: HTTP and socket reads have timeouts, Prometheus is
polled against a deadline, loops have counts.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.parse
from types import SimpleNamespace

import pytest
from metrics_text import named, samples, value
from servers import ServerProcess, stop_process
from wire import Wire, free_port, wait_until

import fastlimit
from fastlimit._protocol import LATENCY_BOUNDS
from fastlimit.server.http.metrics import Exposition, _overload, escape

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
# What Debian's Prometheus 2.42 sends (verified, see ops-security.md §1.2).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROMETHEUS_WAIT = 20.0


# ---- helpers ---------------------------------------------------------------------------------

def start(make_http_server, *args: str) -> tuple[ServerProcess, int]:
    srv = make_http_server("--manual-clock", *args)
    return srv, srv.http_port


def get(port: int, path: str = "/metrics", accept: str | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def scrape(port: int, accept: str | None = None) -> str:
    status, content_type, body = get(port, accept=accept)
    assert status == 200, body
    return body.decode("utf-8")


def call(w: Wire, *args) -> bytes:
    return w.call(*args)


def rule(resource: str, capacity: int, mode: str = "enforce") -> str:
    return json.dumps({"match": {"resource": resource}, "algorithm": "token_bucket",
                       "capacity": capacity, "refill_per_second": 1, "mode": mode})


def set_rules(w: Wire, rules: dict[str, str]) -> None:
    for rule_id, doc in rules.items():
        assert call(w, "CL.RULE", "SET", rule_id, doc).startswith(b"+"), rule_id


def cpu_seconds(server: ServerProcess) -> float:
    with open(f"/proc/{server.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram(series: dict, name: str, **labels: str) -> tuple[list[float], float, float]:
    """(cumulative bucket counts in le order, sum, count)."""
    buckets = [value(series, f"{name}_bucket", **labels, le=le)
               for le in [repr(b) for b in LATENCY_BOUNDS] + ["+Inf"]]
    return buckets, value(series, f"{name}_sum", **labels), value(series, f"{name}_count", **labels)


def assert_histogram_matches_calls(series: dict, cmd: str, front: str, calls: int) -> None:
    buckets, total, count = histogram(series, "fastlimit_command_duration_seconds",
                                      cmd=cmd, front=front)
    assert value(series, "fastlimit_commands_total", cmd=cmd, front=front) == calls
    assert count == calls and buckets[-1] == calls
    assert buckets == sorted(buckets)          # cumulative
    assert (total > 0) == (calls > 0)


# ---- exact series --------------------------------------------------------------------------

def test_series_count_exactly_the_checks_limits_and_errors_run(make_http_server):
    srv, port = start(make_http_server)
    key = "key-that-must-never-be-a-label-7f3a"
    with Wire.to(srv.port) as w:
        set_rules(w, {"api": rule("api", 3), "trial": rule("trial", 1, mode="shadow")})
        call(w, "DEBUG", "CLOCK", "SET", "1000000")
        for _ in range(5):          # capacity 3, no refill at a fixed time: 3 allowed, 2 denied
            call(w, "CL.LIMIT", "user1", "api")
        for _ in range(3):          # a shadow rule denies nothing: 1 allowed, 2 shadow-denied
            call(w, "CL.LIMIT", "user1", "trial")
        for _ in range(4):
            call(w, "CL.CHECK", key, "10", "1")
        assert call(w, "CL.CHECK", key).startswith(b"-ERR wrong number")      # rejected
        assert call(w, "CL.CHECK", key, "10", "1", "COST", "x").startswith(b"-ERR")
    text = scrape(port)
    series = samples(text)
    assert value(series, "fastlimit_decisions_total", rule="api", decision="allowed") == 3
    assert value(series, "fastlimit_decisions_total", rule="api", decision="denied") == 2
    assert value(series, "fastlimit_decisions_total", rule="api", decision="shadow_denied") == 0
    assert value(series, "fastlimit_decisions_total", rule="trial", decision="allowed") == 1
    assert value(series, "fastlimit_decisions_total", rule="trial", decision="shadow_denied") == 2
    assert len(named(series, "fastlimit_decisions_total")) == 6     # no __other__ under the cap
    assert_histogram_matches_calls(series, "cl.limit", "resp", 8)
    # the bad COST ran (and answered an error); the wrong arity was refused
    assert_histogram_matches_calls(series, "cl.check", "resp", 5)
    assert value(series, "fastlimit_command_errors_total", cmd="cl.check", front="resp",
                 reason="rejected") == 1
    assert value(series, "fastlimit_errors_total", err="ERR") == 2
    assert value(series, "fastlimit_rules") == 2
    assert value(series, "fastlimit_rules_version") == 2
    assert value(series, "fastlimit_buckets") == 3     # the inline key, api's and trial's
    assert value(series, "fastlimit_connections_received_total", front="resp") == 1
    assert value(series, "fastlimit_replication_is_primary") == 1
    [(build, one)] = named(series, "fastlimit_build_info").items()
    assert one == 1 and dict(build)["version"] == fastlimit.__version__
    assert key not in text       # keys are never labels


def test_each_call_is_one_observation_of_its_command(make_http_server):
    """Calls are counted when they finish, once: refused and queued
    commands add none, each command inside EXEC is its own call, a sliced
    reply (CONFIG GET *) is one call, and RESETSTAT empties the histograms."""
    srv, port = start(make_http_server)
    with Wire.to(srv.port) as w:
        assert call(w, "MULTI") == b"+OK\r\n"
        for _ in range(3):
            assert call(w, "CL.CHECK", "k", "10", "1") == b"+QUEUED\r\n"
        assert call(w, "EXEC").startswith(b"*3\r\n")
        assert call(w, "CL.CHECK", "k").startswith(b"-ERR wrong number")   # refused
        assert call(w, "CONFIG", "GET", "*").startswith(b"*")
        series = samples(scrape(port))
        assert_histogram_matches_calls(series, "cl.check", "resp", 3)
        assert_histogram_matches_calls(series, "multi", "resp", 1)
        assert_histogram_matches_calls(series, "exec", "resp", 1)
        assert_histogram_matches_calls(series, "config", "resp", 1)
        assert_histogram_matches_calls(series, "config|get", "resp", 1)
        assert value(series, "fastlimit_command_errors_total", cmd="cl.check", front="resp",
                     reason="rejected") == 1
        assert call(w, "CONFIG", "RESETSTAT") == b"+OK\r\n"
    series = samples(scrape(port))
    commands = {dict(labels)["cmd"]
                for labels in resp_only(named(series, "fastlimit_commands_total"))}
    assert commands <= {"config", "config|resetstat"}, commands
    assert ("fastlimit_command_duration_seconds_count",
            frozenset({("cmd", "cl.check"), ("front", "resp")})) not in series


def test_http_calls_are_counted_under_front_http(make_http_server):
    srv = make_http_server("--manual-clock")
    with Wire.to(srv.port) as w:
        set_rules(w, {"api": rule("api", 2)})
    bucket = {"key": "b", "capacity": 3, "refill_per_sec": 1}
    for _ in range(4):
        assert srv.post("/v1/check/bucket", bucket)[0] == 200
    assert srv.post("/v1/check/bucket", {"key": "b"})[0] == 400          # fails, counted
    for _ in range(3):      # the same engine as RESP: 2 allowed, 1 denied
        assert srv.post("/v1/check", {"client_key": "u", "resource": "api"})[0] == 200
    scrape(srv.http_port)
    series = samples(scrape(srv.http_port))
    assert_histogram_matches_calls(series, "check_bucket", "http", 5)
    assert value(series, "fastlimit_command_errors_total", cmd="check_bucket", front="http",
                 reason="failed") == 1
    assert_histogram_matches_calls(series, "check", "http", 3)
    assert_histogram_matches_calls(series, "GET /metrics", "http", 1)   # the scrape before
    assert value(series, "fastlimit_decisions_total", rule="api", decision="allowed") == 2
    assert value(series, "fastlimit_decisions_total", rule="api", decision="denied") == 1
    assert value(series, "fastlimit_connections_received_total", front="http") == 10


def test_metrics_need_the_password_unless_http_metrics_auth_is_no(make_http_server):
    guarded = make_http_server("--requirepass", "s3cret")
    assert get(guarded.http_port)[0] == 401
    status, _, body = guarded.request("GET", "/metrics", headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and b"fastlimit_commands_total" in body
    open_metrics = make_http_server("--requirepass", "s3cret", "--http-metrics-auth", "no")
    assert get(open_metrics.http_port)[0] == 200
    assert open_metrics.request("GET", "/v1/info")[0] == 401       # only /metrics is opened


def test_rule_label_cap_sums_the_rules_past_it_under_other(make_http_server):
    srv, port = start(make_http_server, "--metrics-rule-labels", "2")
    checks = {"r1": 1, "r2": 2, "r3": 3, "r4": 4, "r5": 5}     # capacity 3 each
    with Wire.to(srv.port) as w:
        set_rules(w, {rule_id: rule(rule_id, 3) for rule_id in checks})
        for rule_id, n in checks.items():
            for _ in range(n):
                call(w, "CL.LIMIT", "u", rule_id)
    decisions = named(samples(scrape(port)), "fastlimit_decisions_total")
    by_rule: dict[str, dict[str, float]] = {}
    for labels, v in decisions.items():
        by_rule.setdefault(dict(labels)["rule"], {})[dict(labels)["decision"]] = v
    assert by_rule == {
        "r1": {"allowed": 1, "denied": 0, "shadow_denied": 0},
        "r2": {"allowed": 2, "denied": 0, "shadow_denied": 0},
        "__other__": {"allowed": 3 + 3 + 3, "denied": 0 + 1 + 2, "shadow_denied": 0}}


def test_no_per_rule_series_with_a_cap_of_zero(make_http_server):
    srv, port = start(make_http_server, "--metrics-rule-labels", "0")
    with Wire.to(srv.port) as w:
        set_rules(w, {"a": rule("a", 1), "b": rule("b", 1)})
        for rule_id in ("a", "b", "b"):
            call(w, "CL.LIMIT", "u", rule_id)
    decisions = named(samples(scrape(port)), "fastlimit_decisions_total")
    assert decisions == {
        frozenset({("rule", "__other__"), ("decision", "allowed")}): 2,
        frozenset({("rule", "__other__"), ("decision", "denied")}): 1,
        frozenset({("rule", "__other__"), ("decision", "shadow_denied")}): 0}


def test_snapshot_state_after_a_save(make_http_server, tmp_path):
    srv, port = start(make_http_server, "--snapshot-file", str(tmp_path / "dump.fls"))
    before = samples(scrape(port))
    assert value(before, "fastlimit_snapshot_saves_total") == 0
    assert value(before, "fastlimit_snapshot_in_progress") == 0
    with Wire.to(srv.port) as w:
        assert call(w, "SAVE") == b"+OK\r\n"
    after = samples(scrape(port))
    assert value(after, "fastlimit_snapshot_saves_total") == 1
    assert value(after, "fastlimit_snapshot_last_save_success") == 1
    assert abs(value(after, "fastlimit_snapshot_last_save_timestamp_seconds") - time.time()) < 60


def test_replica_and_primary_show_their_replication_state(make_http_server):
    primary, primary_http = start(make_http_server)
    replica, replica_http = start(make_http_server, "--replicaof", "127.0.0.1", str(primary.port))
    wait_until(lambda: value(samples(scrape(replica_http)), "fastlimit_replication_link_up") == 1,
               PROMETHEUS_WAIT, "the replica's link")
    with Wire.to(primary.port) as w:
        call(w, "CL.CHECK", "k", "10", "1")
    primary_series = samples(scrape(primary_http))
    assert value(primary_series, "fastlimit_replication_is_primary") == 1
    assert value(primary_series, "fastlimit_replication_connected_replicas") == 1
    assert len(named(primary_series, "fastlimit_replica_lag_seconds")) == 1
    offset = value(primary_series, "fastlimit_replication_offset_bytes")
    assert offset > 0
    wait_until(lambda: value(samples(scrape(replica_http)),
                             "fastlimit_replication_offset_bytes") == offset,
               PROMETHEUS_WAIT, "the replica to catch up")
    replica_series = samples(scrape(replica_http))
    assert value(replica_series, "fastlimit_replication_is_primary") == 0
    assert value(replica_series, "fastlimit_replication_sync_in_progress") == 0


# ---- overload shedding ----------------------------------------------------------------------

PRIORITY_NAMES = ("low", "normal", "critical")
SHED_SERIES = [(p, d) for p in PRIORITY_NAMES for d in ("allowed", "denied")]


def shed_counts(series: dict) -> dict[tuple[str, str], float]:
    """fastlimit_shed_checks_total by (priority, decision)."""
    return {(dict(labels)["priority"], dict(labels)["decision"]): v
            for labels, v in named(series, "fastlimit_shed_checks_total").items()}


def ints(reply: bytes) -> list[int]:
    """A RESP array of integers, as CL.CHECK and CL.LIMIT answer."""
    head, *items = reply.split(b"\r\n")[:-1]
    assert head == b"*%d" % len(items) and all(i.startswith(b":") for i in items), reply
    return [int(i[1:]) for i in items]


def test_shed_low_checks_move_the_low_allowed_series_by_exactly_the_number_sent(
        make_http_server):
    """DEBUG SHED-LEVEL 1 sheds PRIORITY low checks (allowed, remaining
    -2) and nothing else: the low/allowed series moves by the number sent,
    the five others not at all, and fastlimit_shed_level follows the level."""
    # shed-threshold 0: only DEBUG SHED-LEVEL sets the level, never the load
    srv, port = start(make_http_server, "--shed-threshold", "0")
    before = samples(scrape(port))
    assert shed_counts(before) == dict.fromkeys(SHED_SERIES, 0)     # every series, from 0
    assert value(before, "fastlimit_shed_level") == 0
    sent = 7
    with Wire.to(srv.port) as w:
        assert call(w, "DEBUG", "SHED-LEVEL", "1") == b"+OK\r\n"
        for i in range(sent):
            assert ints(call(w, "CL.CHECK", f"low{i}", "5", "1", "PRIORITY", "low"))[:3] == \
                [1, 5, -2]
        for priority in ("normal", "critical"):      # not shed at level 1: a real bucket
            assert ints(call(w, "CL.CHECK", priority, "5", "1", "PRIORITY", priority))[:3] == \
                [1, 5, 4]
        held = samples(scrape(port))
        assert call(w, "DEBUG", "SHED-LEVEL", "0") == b"+OK\r\n"
        assert ints(call(w, "CL.CHECK", "low-again", "5", "1", "PRIORITY", "low"))[:3] == \
            [1, 5, 4]
    after = samples(scrape(port))
    assert value(held, "fastlimit_shed_level") == 1
    assert value(after, "fastlimit_shed_level") == 0
    assert shed_counts(held) == shed_counts(after) == {
        **dict.fromkeys(SHED_SERIES, 0), ("low", "allowed"): sent}
    assert value(after, "fastlimit_buckets") == 3        # the shed checks made none


def test_a_fail_closed_rule_s_shed_checks_are_counted_denied(make_http_server):
    """Level 2 sheds normal checks too; a rule with on_failure closed
    answers its shed checks denied, and they are counted so."""
    srv, port = start(make_http_server, "--shed-threshold", "0")
    strict = json.dumps({**json.loads(rule("strict", 5)), "on_failure": "closed"})
    with Wire.to(srv.port) as w:
        set_rules(w, {"strict": strict, "open": rule("open", 5)})
        assert call(w, "DEBUG", "SHED-LEVEL", "2") == b"+OK\r\n"
        for _ in range(3):
            assert ints(call(w, "CL.LIMIT", "u", "strict", "PRIORITY", "normal"))[:3] == \
                [0, -1, -2]
        assert ints(call(w, "CL.LIMIT", "u", "open", "PRIORITY", "normal"))[:3] == [1, -1, -2]
        assert ints(call(w, "CL.CHECK", "k", "5", "1", "PRIORITY", "critical"))[:3] == [1, 5, 4]
    series = samples(scrape(port))
    assert value(series, "fastlimit_shed_level") == 2
    assert shed_counts(series) == {**dict.fromkeys(SHED_SERIES, 0), ("normal", "denied"): 3,
                                   ("normal", "allowed"): 1}


class StubMeter:
    """LoadMeter's two readings, fixed."""

    def figures(self):
        return {"level": 2, "forced": 0, "busy_percent": 37, "lag_us": 1500, "wait_us": 250000,
                "pending_bytes": 4096, "pending_connections": 3, "deferrals": 9,
                "level_changes": 4}

    def shed_counts(self):
        return {"low": (11, 1), "normal": (5, 2), "critical": (0, 0)}


def test_the_meter_s_figures_in_base_units():
    """Percent to a 0..1 ratio, microseconds to seconds, bytes as bytes."""
    out = Exposition(openmetrics=False)
    _overload(out, SimpleNamespace(overload=SimpleNamespace(meter=StubMeter())))
    series = samples("\n".join(out.lines))
    assert value(series, "fastlimit_shed_level") == 2
    assert value(series, "fastlimit_loop_busy_ratio") == 0.37
    assert value(series, "fastlimit_loop_lag_seconds") == 0.0015
    assert value(series, "fastlimit_held_input_wait_seconds") == 0.25
    assert value(series, "fastlimit_held_input_bytes") == 4096
    assert shed_counts(series) == {("low", "allowed"): 11, ("low", "denied"): 1,
                                   ("normal", "allowed"): 5, ("normal", "denied"): 2,
                                   ("critical", "allowed"): 0, ("critical", "denied"): 0}
    assert "# TYPE fastlimit_shed_checks_total counter" in out.lines


def test_label_values_are_escaped():
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    assert escape("plain:id/1") == "plain:id/1"


# ---- formats --------------------------------------------------------------------------------

def busy_server(make_http_server, *args: str) -> tuple[ServerProcess, int]:
    """A server that has run rules, checks and errors, for the format tests."""
    srv, port = start(make_http_server, *args)
    with Wire.to(srv.port) as w:
        set_rules(w, {"api": rule("api", 2), "trial": rule("trial", 1, mode="shadow")})
        for resource in ("api", "api", "api", "trial", "trial"):
            call(w, "CL.LIMIT", "u", resource)
        call(w, "CL.CHECK", "k", "5", "1")
        call(w, "NOSUCHCOMMAND")
    return srv, port


def resp_only(series: dict[frozenset, float]) -> dict[frozenset, float]:
    return {labels: v for labels, v in series.items() if ("front", "http") not in labels}


def promtool_check(body: bytes) -> subprocess.CompletedProcess:
    if not os.path.exists(PROMTOOL):
        pytest.fail("promtool is not installed (Debian's prometheus package has it)")
    return subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True,
                          timeout=30)


def test_promtool_accepts_the_text_format(make_http_server):
    srv, port = busy_server(make_http_server)
    status, content_type, body = get(port)
    assert (status, content_type) == (200, TEXT_TYPE)
    assert body.endswith(b"\n") and b"# EOF" not in body
    checked = promtool_check(body)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, b"", b"")


def test_openmetrics_when_the_scraper_asks_for_it(make_http_server):
    srv, port = busy_server(make_http_server)
    status, content_type, body = get(port, accept=PROMETHEUS_ACCEPT)
    assert (status, content_type) == (200, OPENMETRICS_TYPE)
    text = body.decode()
    assert text.endswith("\n# EOF\n")
    assert "# TYPE fastlimit_commands counter\n" in text         # the family, not the sample
    assert "# TYPE fastlimit_build info\n" in text
    assert "# UNIT fastlimit_command_duration_seconds seconds\n" in text
    assert "\r" not in text
    # the same numbers as the text format (but for the scrapes themselves)
    plain = samples(scrape(port))
    om = samples(text)
    for name in ("fastlimit_decisions_total", "fastlimit_commands_total",
                 "fastlimit_command_duration_seconds_count"):
        assert resp_only(named(om, name)) == resp_only(named(plain, name)) != {}
    # only OpenMetrics 1.x, and only if not refused
    for accept in ("text/plain", "*/*", "application/openmetrics-text;version=0.0.1",
                   "application/openmetrics-text;q=0", "application/json"):
        assert get(port, accept=accept)[1] == TEXT_TYPE, accept
    for accept in ("application/openmetrics-text", "Application/OpenMetrics-Text; Version=1.0.0",
                   "text/plain;q=0.5, application/openmetrics-text;version=1.0.0;q=0.9"):
        assert get(port, accept=accept)[1] == OPENMETRICS_TYPE, accept


# ---- a real Prometheus ---------------------------------------------------------------------

class Prometheus:
    """Debian's prometheus with its own config and data directory in tmp."""

    def __init__(self, tmp_path, target_port: int):
        if not os.path.exists(PROMETHEUS):
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: fastlimit\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n")
        self.log_path = tmp_path / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path: str, **params: str):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            status, _, body = get(self.port, f"/api/v1/{path}{query}")
        except OSError:
            return None        # not listening yet
        assert status == 200, body
        return json.loads(body)["data"]

    def query(self, promql: str) -> dict[frozenset, float]:
        data = self.api("query", query=promql)
        if data is None:
            return {}
        return {frozenset((k, v) for k, v in r["metric"].items()
                          if k not in ("__name__", "instance", "job")): float(r["value"][1])
                for r in data["result"]}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)


def test_a_real_prometheus_scrapes_the_per_rule_counters(make_http_server, tmp_path):
    srv, port = start(make_http_server)
    with Wire.to(srv.port) as w:
        set_rules(w, {"login": rule("login", 4), "search": rule("search", 10)})
        for _ in range(7):
            call(w, "CL.LIMIT", "alice", "login")      # 4 allowed, 3 denied
        for _ in range(6):
            call(w, "CL.LIMIT", "alice", "search")     # 6 allowed
    prometheus = Prometheus(tmp_path, port)
    try:
        expected = {
            frozenset({("rule", "login"), ("decision", "allowed")}): 4.0,
            frozenset({("rule", "login"), ("decision", "denied")}): 3.0,
            frozenset({("rule", "search"), ("decision", "allowed")}): 6.0,
            frozenset({("rule", "search"), ("decision", "denied")}): 0.0}
        seen: list = []

        def scraped():
            seen[:] = [prometheus.query('fastlimit_decisions_total{decision!="shadow_denied"}'),
                       prometheus.api("targets")]
            return seen[0] == expected

        try:
            wait_until(scraped, PROMETHEUS_WAIT, "Prometheus to scrape the per-rule counters",
                       interval=0.25)
        except AssertionError:
            raise AssertionError(f"Prometheus saw {seen}\n{prometheus.log()}") from None
        targets = prometheus.api("targets")["activeTargets"]
        assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")]
        # PromQL over the histogram: the latency is in the first buckets
        assert prometheus.query('sum by (cmd) (fastlimit_command_duration_seconds_count'
                                '{cmd="cl.limit"})') == {frozenset({("cmd", "cl.limit")}): 13.0}
    finally:
        prometheus.stop()


# ---- cost -----------------------------------------------------------------------------------

@pytest.mark.untraced
def test_a_scrape_with_1000_rules_is_cheap(make_http_server):
    srv, port = start(make_http_server)
    with Wire.to(srv.port) as w:
        pipeline = b"".join(
            b"*4\r\n$7\r\nCL.RULE\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
            % (len(i), i, len(d), d) for i, d in
            ((f"rule{n:04d}".encode(), rule(f"res{n}", 5).encode()) for n in range(1000)))
        w.send(pipeline)
        for _ in range(1000):
            assert w.read_reply().startswith(b"+")
        for n in range(0, 1000, 10):
            call(w, "CL.LIMIT", "u", f"res{n}")
    scrape(port)      # warm
    scrapes = 20
    cpu_before = cpu_seconds(srv)
    for _ in range(scrapes):
        text = scrape(port)
    per_scrape = (cpu_seconds(srv) - cpu_before) / scrapes
    print(f"server CPU per /metrics scrape with 1,000 rules: {per_scrape * 1000:.1f} ms "
          f"({len(text)} bytes)")
    assert len(named(samples(text), "fastlimit_decisions_total")) == 3000
    assert per_scrape < 0.05
