"""A peer region found through Sentinel (region-peers
<region>=sentinel:<service>@<sentinels>): the link asks the sentinels for
the region's primary at every connect, so when that region fails over,
the link follows its new primary by itself and the spends of global rules
go on crossing.  Real redis-sentinel processes and a real failover
(scripts/ha.py), bounded in time; release build only, as the other
failover tests (they time failovers, and the debug pass traces every line
of the servers)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from servers import PYTHON, failed
from wire import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from ha import SERVICE, HASet  # noqa: E402

pytestmark = pytest.mark.release_only

REGIONS = ("ap", "eu")
GLOBAL = json.dumps({"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": 30,
                     "window_ms": 600_000, "regions": "global"})
REGION_ARGS = ["--manual-clock", "--regions", *REGIONS, "--region-sync-ms", "20"]


def left(c) -> int:
    return c.execute_command("CL.LIMIT", "user:1", "api", "COST", 0)[2]


def test_the_link_follows_a_peer_regions_failover_through_sentinel(make_server, request):
    eu = HASet("fastlimit", python=PYTHON, replicas=1,
               extra=[*REGION_ARGS, "--region", "eu"])
    eu.start()
    try:
        sentinels = ",".join(f"127.0.0.1:{s.port}" for s in eu.sentinels)
        ap = make_server(*REGION_ARGS, "--region", "ap", "--region-peers",
                         f"eu=sentinel:{SERVICE}@{sentinels}")
        a = ap.client()
        primary, standby = eu.services[SERVICE]
        for c in (a, primary.client()):
            c.execute_command("CL.RULE", "SET", "api", GLOBAL)
        wait_until(lambda: standby.client().execute_command("CL.RULE", "GET", "api"),
                   what="the rule on the standby")
        wait_until(lambda: a.info("regions")["peer0"]["port"] == primary.port,
                   what="the link at eu's primary, as its sentinels name it")
        for _ in range(2):
            a.execute_command("CL.LIMIT", "user:1", "api")
        wait_until(lambda: left(standby.client()) == 28, what="ap's spends at eu, replicated")
        primary.signal(signal.SIGKILL)
        wait_until(lambda: eu.primary_port() == standby.port, 30, what="the failover")
        for _ in range(3):
            a.execute_command("CL.LIMIT", "user:1", "api")
        wait_until(lambda: left(standby.client()) == 25, 30,
                   what="ap's later spends at eu's new primary")
        assert a.info("regions")["peer0"]["via"] == f"sentinel:{SERVICE}"
    finally:
        if failed(request):
            print(eu.logs())
        eu.stop()
