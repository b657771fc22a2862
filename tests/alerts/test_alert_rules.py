"""The Prometheus alerting rules shipped in server/prometheus/alerts.yaml:
promtool accepts them and their unit tests (alerts_test.yaml: each rule
fires on the series that mean trouble, after its `for`, and not on a
healthy one's) pass; every rule has a test that expects it to fire; and
a real Prometheus, scraping a real fastlimit server and a gateway whose
fastlimit.Client exports its counters (fastlimit.client.metrics), raises
the gateway alerts when that client fails open, and none for the healthy
server and the healthy client."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from servers import stop_process
from wire import free_port, wait_until

from fastlimit import Client
from fastlimit.client.metrics import register_prometheus

RULES_DIR = Path(__file__).resolve().parents[2] / "server" / "prometheus"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if not os.path.exists(PROMTOOL):
        pytest.fail("promtool is not installed (Debian's prometheus package has it)")
    return subprocess.run([PROMTOOL, *args], cwd=RULES_DIR, capture_output=True, text=True,
                          timeout=60)


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    checked = promtool("check", "rules", "alerts.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_has_a_unit_test_that_fires_it():
    rules = yaml.safe_load((RULES_DIR / "alerts.yaml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((RULES_DIR / "alerts_test.yaml").read_text())
    fired = {t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"]
             if t["exp_alerts"]}
    assert names == fired, names ^ fired
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule
            assert rule["annotations"]["summary"], rule


# ---- a real Prometheus ---------------------------------------------------------------------

def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Gateway:
    """Clients checking in a thread, their counters served by
    prometheus_client's HTTP server on a free port (as a gateway would)."""

    def __init__(self, clients: dict[str, Client]):
        from prometheus_client import CollectorRegistry, start_http_server

        self.registry = CollectorRegistry()
        for name, client in clients.items():
            register_prometheus(client, name=name, registry=self.registry)
        self.port = free_port()
        self.http, self.http_thread = start_http_server(self.port, addr="127.0.0.1",
                                                        registry=self.registry)
        self.clients = clients
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        i = 0
        while not self.stopping.wait(0.01):
            for client in self.clients.values():
                client.check(f"user:{i % 10}", capacity=100, refill_per_sec=100)
            i += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.http.shutdown()
        for client in self.clients.values():
            client.close()


class Prometheus:
    """Debian's prometheus scraping every second, the shipped rules
    evaluated every second, its data in tmp."""

    def __init__(self, tmp_path, fastlimit_port: int, gateway_port: int):
        if not os.path.exists(PROMETHEUS):
            pytest.fail("prometheus is not installed (apt-get install prometheus)")
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{RULES_DIR / 'alerts.yaml'}']\n"
            "scrape_configs:\n"
            "  - job_name: fastlimit\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{fastlimit_port}']\n"
            "  - job_name: api\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{gateway_port}']\n")
        self.log_path = tmp_path / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def api(self, path: str, **params: str):
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            status, body = get(self.port, f"/api/v1/{path}{query}")
        except OSError:
            return None
        assert status == 200, body
        return json.loads(body)["data"]

    def alerts(self) -> list[dict]:
        data = self.api("alerts")
        return data["alerts"] if data else []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)


def test_a_real_prometheus_raises_the_gateway_alerts_of_a_client_failing_open(
        make_http_server, tmp_path):
    server = make_http_server()
    dead = f"127.0.0.1:{free_port()}"          # nothing listens there
    gateway = Gateway({"orders": Client(dead, timeout_ms=5),
                       # generous: a late reply of the traced server would fail open
                       "search": Client(f"127.0.0.1:{server.port}", timeout_ms=2000)})
    prometheus = Prometheus(tmp_path, server.http_port, gateway.port)
    try:
        def raised() -> list[dict]:
            alerts = prometheus.alerts()
            names = {a["labels"]["alertname"] for a in alerts}
            return alerts if {"FastlimitGatewayFailingOpen", "FastlimitGatewayBreakerOpen",
                              "FastlimitGatewayErrors"} <= names else []

        try:
            alerts = wait_until(raised, 60, "Prometheus to raise the gateway's alerts",
                                interval=0.5)
        except AssertionError:
            raise AssertionError(f"alerts: {prometheus.alerts()}\ntargets: "
                                 f"{prometheus.api('targets')}\n{prometheus.log()}") from None
        # pending: their `for` (minutes) has not passed; the expressions hold.
        # The gateway's alerts only: a slow (debug, traced) server may meanwhile
        # raise one of its own (shedding, a scrape that timed out)
        alerts = [a for a in alerts if a["labels"]["alertname"].startswith("FastlimitGateway")]
        assert {(a["labels"]["alertname"], a["labels"]["client"]) for a in alerts} == {
            ("FastlimitGatewayFailingOpen", "orders"), ("FastlimitGatewayBreakerOpen", "orders"),
            ("FastlimitGatewayErrors", "orders")}, alerts
        breaker = next(a for a in alerts if a["labels"]["alertname"] ==
                       "FastlimitGatewayBreakerOpen")
        assert breaker["labels"]["server"] == dead and breaker["labels"]["job"] == "api"
        # both scraped; a scrape of the traced server that timed out is followed
        # by another a second later
        wait_until(lambda: sorted((t["labels"]["job"], t["health"]) for t in
                                  prometheus.api("targets")["activeTargets"]) ==
                   [("api", "up"), ("fastlimit", "up")], 30, "both targets up", interval=0.5)
        # the healthy client's decisions came from the server
        data = prometheus.api("query", query='fastlimit_client_decisions_total'
                                             '{client="search",source="server"}')
        assert float(data["result"][0]["value"][1]) > 0
    finally:
        prometheus.stop()
        gateway.stop()
    assert gateway.clients["orders"].stats.failed_open > 0
    time.sleep(0)


def test_the_certificates_expiry_is_on_metrics_for_the_expiry_alerts(make_http_server, tmp_path):
    from certs import EXPIRED_AT, make_certs
    from metrics_text import named, samples

    certs = make_certs(str(tmp_path))
    server = make_http_server("--tls-cert-file", certs.expired_server.cert,
                              "--tls-key-file", certs.expired_server.key,
                              "--tls-ca-cert-file", certs.ca)
    status, body = get(server.http_port, "/metrics")
    assert status == 200
    expiry = named(samples(body.decode()), "fastlimit_tls_certificate_expiry_timestamp_seconds")
    assert expiry[frozenset({("setting", "tls-cert-file")})] == EXPIRED_AT.timestamp()
    assert expiry[frozenset({("setting", "tls-ca-cert-file")})] > time.time() + 86400
    assert len(expiry) == 2                 # no tls-client-cert-file here
    # a renewed file is read again (CONFIG SET names it; the scrape reads the file)
    server.client().config_set("tls-cert-file", certs.server.cert, "tls-key-file",
                               certs.server.key)
    status, body = get(server.http_port, "/metrics")
    renewed = named(samples(body.decode()), "fastlimit_tls_certificate_expiry_timestamp_seconds")
    assert renewed[frozenset({("setting", "tls-cert-file")})] > time.time()
