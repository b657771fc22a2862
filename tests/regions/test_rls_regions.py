"""The Envoy rate limit service's limits among regions (README
"Regions"): `regions: static` in a rate_limit enforces this region's equal
share of requests_per_unit (and reports it as the current limit), and
`regions: global` counts every region's hits in every region, as a global
rule does; through the service's /json endpoint of real tiers (the manual
clock holds the window; the links run in real time)."""

from __future__ import annotations

import http.client
import json

import pytest
from servers import ExtraPortServer, started_servers
from wire import wait_until

REGIONS = ("ap", "eu", "us")


class RlsTier(ExtraPortServer):
    PORT_FLAG = "--http-port"

    def check(self, domain: str, key: str, value: str) -> dict:
        body = json.dumps({"domain": domain, "descriptors": [
            {"entries": [{"key": key, "value": value}]}]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.extra_port, timeout=10)
        try:
            conn.request("POST", "/json", body=body)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()


YAML = """domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: %d, regions: %s}
"""


@pytest.fixture
def tiers(tmp_path):
    """make(region, yaml, *args): a started tier of that region."""
    with started_servers(RlsTier) as make:
        def start(region: str, text: str, *args: str) -> RlsTier:
            f = tmp_path / f"{region}.yaml"
            f.write_text(text)
            return make("--manual-clock", "--rls-config", str(f), "--region", region,
                        "--regions", *REGIONS, "--region-sync-ms", "20", *args)
        yield start


def codes(tier: RlsTier, n: int, user: str = "alice") -> list[str]:
    return [tier.check("web", "user", user)["overallCode"] for _ in range(n)]


def test_a_static_limit_is_the_regions_share(tiers):
    tier = tiers("eu", YAML % (9, "static"))
    first = tier.check("web", "user", "alice")
    assert first["statuses"][0]["currentLimit"]["requestsPerUnit"] == 3
    assert codes(tier, 3) == ["OK", "OK", "OVER_LIMIT"]


def test_a_global_limit_counts_every_regions_hits(tiers):
    eu = tiers("eu", YAML % (10, "global"))
    us = tiers("us", YAML % (10, "global"))
    eu.client().config_set("region-peers", f"us=127.0.0.1:{us.port}")
    us.client().config_set("region-peers", f"eu=127.0.0.1:{eu.port}")
    assert codes(eu, 6) == ["OK"] * 6
    wait_until(lambda: us.client().info("regions")["region_tokens_debited"] == 6,
               what="eu's hits at us")
    assert codes(us, 5) == ["OK"] * 4 + ["OVER_LIMIT"]
    # the reference counts a hit over the limit too: all five cross
    wait_until(lambda: eu.client().info("regions")["region_tokens_debited"] == 5,
               what="us's hits at eu")
    assert codes(eu, 1) == ["OVER_LIMIT"]


@pytest.mark.parametrize("text, error", [
    (YAML % (9, "everywhere"), "invalid regions 'everywhere' (one of regional, static, "
                               "global)"),
    (YAML % (9, "home"), "invalid regions 'home' (one of regional, static, global)"),
    (YAML.replace("regions: %s}", "regions: global, algorithm: token_bucket, split: 2}") % 9,
     "a global limit cannot be split"),
    (YAML % (2, "static"), "web.user: a region's share (1/3 of 2) holds no token"),
])
def test_configuration_errors_refuse_to_start(tiers, text, error):
    with pytest.raises(RuntimeError) as e:
        tiers("eu", text)
    assert error in str(e.value)
