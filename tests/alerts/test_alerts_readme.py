"""The README's "Alerts, and the gateways' own counters" examples, run as
written (the README's ports swapped for free ones): the gateway's lines
serve the client's counters, and the scrape configuration, with the
shipped rules beside it, is one promtool accepts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme import README
from wire import free_port

HEADING = "### Alerts, and the gateways' own counters"
RULES = Path(__file__).resolve().parents[2] / "server" / "prometheus" / "alerts.yaml"
PROMTOOL = "/usr/bin/promtool"


def block(kind: str) -> str:
    text = README.read_text()
    start = text.index(HEADING)
    end = text.index("\n## ", start)
    (found,) = re.findall(rf"```{kind}\n(.*?)```", text[start:end], re.DOTALL)
    return found


def test_the_gateways_lines_serve_the_clients_counters(server):
    port = free_port()
    # As written but for the ports, and the timeout: 5 ms suits a gateway beside
    # its server, not this traced shared one, where one late reply would count
    # a failed_open instead of the check this test looks for.
    code = block("python").replace("127.0.0.1:6380", f"127.0.0.1:{server.port}").replace(
        "9108", str(port)).replace("timeout_ms=5)", "timeout_ms=2000)")
    assert "timeout_ms=2000)" in code
    code += scrape_lines(port)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, env=os.environ.copy())
    assert run.returncode == 0, run.stderr
    assert 'fastlimit_client_decisions_total{client="orders-api",source="server"} 1.0' \
        in run.stdout, run.stdout[-3000:]
    assert f'fastlimit_client_breaker_open{{client="orders-api",server="127.0.0.1:' \
           f'{server.port}"}} 0.0' in run.stdout


def scrape_lines(port: int) -> str:
    """What the test adds after the README's lines: one check, one scrape."""
    return ("\nclient.check('user:42', capacity=10, refill_per_sec=1)\n"
            "import urllib.request\n"
            f"print(urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode())\n")


def test_the_scrape_configuration_with_the_rules_beside_it(tmp_path):
    if not os.path.exists(PROMTOOL):
        pytest.fail("promtool is not installed (Debian's prometheus package has it)")
    (tmp_path / "prometheus.yml").write_text(block("yaml"))
    shutil.copy(RULES, tmp_path / "fastlimit-alerts.yaml")
    run = subprocess.run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS: 18 rules found" in run.stdout, run.stdout
