"""The Envoy rate limit service's limits among regions (README
"Regions"): `regions: static` in a rate_limit enforces this region's equal
share of requests_per_unit (and reports it as the current limit), and
`regions: global` counts every region's hits in every region, as a global
rule does; through the service's /json endpoint of real tiers (the manual
clock holds the window; the links run in real time)."""

from __future__ import annotations

import http.client
import json

import grpc
import pytest
import rls_messages as rls
from grpcserver import GrpcServer
from proxy import Proxy
from servers import ExtraPortServer, started_servers
from wire import free_port, wait_until

from fastlimit._rules import home_index

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
                               "global, home)"),
    (YAML.replace("regions: %s}", "regions: global, algorithm: token_bucket, split: 2}") % 9,
     "a global limit cannot be split"),
    (YAML.replace("regions: %s}", "regions: home, algorithm: token_bucket, split: 2}") % 9,
     "a home limit cannot be split"),
    (YAML.replace("regions: %s}", "regions: %s, home: eu}") % (9, "global"),
     "home names a region (1 to 64 of A-Z a-z 0-9 _ -) of a limit with regions: home"),
    (YAML.replace("regions: %s}", "regions: %s, home: mars}") % (9, "home"),
     "web.user: home 'mars' is not one of the regions (ap eu us)"),
    (YAML % (2, "static"), "web.user: a region's share (1/3 of 2) holds no token"),
])
def test_configuration_errors_refuse_to_start(tiers, text, error):
    with pytest.raises(RuntimeError) as e:
        tiers("eu", text)
    assert error in str(e.value)


# ---- home limits: counted in the descriptor's home region, asked from every front ----------

HOME_YAML = """domain: web
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, regions: home, home: eu}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 5, regions: home}
"""


class GrpcTier(GrpcServer):
    """A tier with its gRPC front and /json on an HTTP port too."""

    def __init__(self, *args: str):
        self.http_port = free_port()
        super().__init__(*args, "--http-port", str(self.http_port))

    def json(self, domain: str, key: str, value: str) -> tuple[int, bytes]:
        body = json.dumps({"domain": domain, "descriptors": [
            {"entries": [{"key": key, "value": value}]}]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            conn.request("POST", "/json", body=body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def grpc(self, key: bytes, value: bytes) -> dict:
        return self.should_rate_limit(rls.request(b"web", rls.descriptor([(key, value)])))


@pytest.fixture
def homes(tmp_path):
    """eu and us, linked through proxies, on the manual clock."""
    f = tmp_path / "rls.yaml"
    f.write_text(HOME_YAML)
    with started_servers(GrpcTier) as make:
        tiers = {n: make("--manual-clock", "--rls-config", str(f), "--region", n, "--regions",
                         "eu", "us", "--region-partition-ms", "1000",
                         "--region-home-timeout-ms", "300",
                         # a call asked of another region waits a cross-region round trip
                         "--grpc-deadline-ms", "5000") for n in ("eu", "us")}
        proxies = {n: Proxy(t.port) for n, t in tiers.items()}
        tiers["eu"].client().config_set("region-peers", f"us=127.0.0.1:{proxies['us'].port}")
        tiers["us"].client().config_set("region-peers", f"eu=127.0.0.1:{proxies['eu'].port}")
        for t in tiers.values():
            wait_until(lambda t=t: t.client().info("regions")["region_links_up"] == 1, 30,
                       what="the links up")
        yield tiers, proxies
        for p in proxies.values():
            p.close()


def test_a_home_limit_is_counted_at_its_home_from_every_front(homes):
    tiers, _ = homes
    eu, us = tiers["eu"], tiers["us"]
    answers = [us.grpc(b"user", b"alice")["overall"] for _ in range(3)]
    answers += [json.loads(us.json("web", "user", "alice")[1])["overallCode"]
                for _ in range(2)]
    assert answers == [rls.OK, rls.OK, rls.OK, "OK", "OK"]
    assert us.client().info("regions")["region_checks_asked"] == 5
    assert eu.client().info("regions")["region_checks_served"] == 5
    # eu counted them all: its own next request is the sixth
    assert eu.grpc(b"user", b"alice")["overall"] == rls.OVER_LIMIT
    assert us.client().execute_command("CL.RLS", "DESCRIBE", "web", "user=alice") == [
        b"OVER_LIMIT", [5, b"HOUR", b""], 0, 3600]


def test_without_a_home_each_descriptor_lives_where_its_hash_says(homes):
    tiers, _ = homes
    names = ("eu", "us")
    values = [f"10.0.0.{i}" for i in range(8)]
    homes_of = {v: names[home_index(b"3:web2:ip%d:%s" % (len(v), v.encode()), 2)]
                for v in values}
    assert set(homes_of.values()) == set(names)
    for v in values:
        for t in tiers.values():
            assert t.grpc(b"ip", v.encode())["overall"] == rls.OK
    served = {n: tiers[n].client().info("regions")["region_checks_served"] for n in names}
    assert served == {n: sum(h == n for h in homes_of.values()) for n in names}


def test_an_unreachable_home_fails_the_call_for_envoys_failure_mode(homes):
    tiers, proxies = homes
    proxies["eu"].stall()
    us = tiers["us"]
    with pytest.raises(grpc.RpcError) as e:
        us.grpc(b"user", b"alice")
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "home region eu did not answer" in e.value.details()
    status, body = us.json("web", "user", "alice")
    assert status == 500 and b"home region eu unreachable" in body
    proxies["eu"].restore()
