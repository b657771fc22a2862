"""Static shares through real servers: three regions, each a fastlimit
tier started with its --region and the fleet's --regions, the same rules
in each, and a user who hops regions on every request at a rate past the
limit.  With "regions": "static" the fleet admits at most the limit in
every window (exactly the sum of the shares when each region's demand
exceeds its share), where a regional rule admits it once per region."""

from __future__ import annotations

import json

import pytest
from readme import readme_console, run_redis_cli, shown_lines

REGIONS = ("ap", "eu", "us")
LIMIT = 100
WINDOW_MS = 60_000


@pytest.fixture
def fleet(make_server):
    """One manual-clock tier per region, clocks at 0, the same rules."""
    clients = {}
    for name in REGIONS:
        server = make_server("--manual-clock", "--region", name, "--regions", *REGIONS)
        clients[name] = server.client()
        clients[name].execute_command("DEBUG", "CLOCK", "SET", 0)
    return clients


def set_everywhere(fleet, rule_id: str, doc: dict) -> None:
    for c in fleet.values():
        assert c.execute_command("CL.RULE", "SET", rule_id, json.dumps(doc)) == b"OK"


def advance_everywhere(fleet, ms: int) -> None:
    for c in fleet.values():
        c.execute_command("DEBUG", "CLOCK", "ADVANCE", ms)


def hop(fleet, resource: str, requests: int, regions=REGIONS) -> dict[str, int]:
    """Requests from one user, each in the next region; allowed per region."""
    allowed = dict.fromkeys(regions, 0)
    for i in range(requests):
        region = regions[i % len(regions)]
        allowed[region] += fleet[region].execute_command("CL.LIMIT", "user:1", resource)[0]
    return allowed


WINDOW = {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": LIMIT,
          "window_ms": WINDOW_MS}


def test_a_hopping_user_gets_the_limit_once_across_regions(fleet):
    set_everywhere(fleet, "api", dict(WINDOW, regions="static", shares={"ap": 2, "eu": 5,
                                                                        "us": 3}))
    for _ in range(3):                     # three windows, each at 3x the limit
        allowed = hop(fleet, "api", 3 * LIMIT)
        assert allowed == {"ap": 20, "eu": 50, "us": 30}
        assert sum(allowed.values()) == LIMIT
        advance_everywhere(fleet, WINDOW_MS)


def test_a_regional_rule_gives_each_region_the_whole_limit(fleet):
    set_everywhere(fleet, "api", WINDOW)
    assert hop(fleet, "api", 3 * LIMIT + 30) == dict.fromkeys(REGIONS, LIMIT)


def test_equal_shares_lose_at_most_one_token_per_region_to_rounding(fleet):
    set_everywhere(fleet, "api", dict(WINDOW, regions="static"))
    allowed = hop(fleet, "api", 3 * LIMIT)
    assert allowed == dict.fromkeys(REGIONS, 33)


def test_a_token_bucket_refills_at_the_regions_shares_of_the_rate(fleet):
    # 90 tokens, 30/s for the fleet: 30 tokens and 10/s a region
    set_everywhere(fleet, "api", {"match": {"resource": "api"}, "capacity": 90,
                                  "refill_per_second": 30, "regions": "static"})
    assert sum(hop(fleet, "api", 300).values()) == 90
    for _ in range(5):
        advance_everywhere(fleet, 1000)
        assert hop(fleet, "api", 300) == dict.fromkeys(REGIONS, 10)


def test_demand_in_one_region_gets_only_that_regions_share(fleet):
    # the price of a zero overshoot: traffic that stays in one region is
    # held to that region's share while the others' go unused
    set_everywhere(fleet, "api", dict(WINDOW, regions="static", shares={"ap": 2, "eu": 5,
                                                                        "us": 3}))
    assert hop(fleet, "api", 3 * LIMIT, regions=("ap",)) == {"ap": 20}


def test_info_regions_shows_the_region_and_each_static_rules_share(fleet):
    set_everywhere(fleet, "api", dict(WINDOW, regions="static", shares={"ap": 2, "eu": 5,
                                                                        "us": 3}))
    set_everywhere(fleet, "other", dict(WINDOW, match={"resource": "other"}))
    info = fleet["eu"].info("regions")
    assert {k: info[k] for k in ("region", "regions", "region_count", "static_rules")} == \
        {"region": "eu", "regions": ["ap", "eu", "us"], "region_count": 3, "static_rules": 1}
    assert info["static0"] == {"id": "api", "share": "5/10"}
    assert "region" in fleet["us"].info()          # one of INFO's default sections


def test_a_region_the_shares_do_not_name_refuses_the_rule(fleet):
    doc = json.dumps(dict(WINDOW, regions="static", shares={"eu": 1, "us": 1}))
    with pytest.raises(Exception, match="no share for this region \\('ap'\\)"):
        fleet["ap"].execute_command("CL.RULE", "SET", "api", doc)
    assert fleet["eu"].execute_command("CL.RULE", "SET", "api", doc) == b"OK"
    assert fleet["ap"].execute_command("CL.RULE", "GET", "api") is None


def test_the_http_check_enforces_the_share(make_http_server):
    server = make_http_server("--manual-clock", "--region", "eu", "--regions", *REGIONS)
    c = server.client()
    c.execute_command("CL.RULE", "SET", "api", json.dumps(dict(WINDOW, regions="static")))
    allowed = sum(server.post("/v1/limits/check", {"rule_id": "api", "key": "user:1"})[2]
                  ["allowed"] for _ in range(40))
    assert allowed == 33


@pytest.mark.parametrize("args, error", [
    (("--regions", "eu", "us"), "regions and region-peers need region"),
    (("--region", "eu", "--regions", "eu", "us", "--region-peers", "ap=127.0.0.1:1"),
     "region-peers: 'ap' must be another of regions (eu us)"),
    (("--region", "eu", "--regions", "eu", "us", "--region-peers", "eu=127.0.0.1:1"),
     "region-peers: 'eu' must be another of regions"),
    (("--region", "eu", "--regions", "eu", "us", "--region-peers", "us=:1"),
     "argument must be <region>=<host>:<port>"),
    (("--region", "eu", "--regions", "eu", "us", "--region-peers", "us=sentinel:127.0.0.1:1"),
     "argument must be <region>=sentinel:<service>@<host>:<port>"),
    (("--region", "ap", "--regions", "eu", "us"), "region 'ap' is not among regions (eu us)"),
    (("--region", "e u"), "a region's name is 1 to 64 characters"),
    (("--region", "eu", "--regions", "eu", "eu"), "regions names a region twice"),
])
def test_settings_errors_refuse_to_start(make_server, args, error):
    with pytest.raises(RuntimeError) as e:
        make_server(*args)
    assert error in str(e.value)


def test_the_readmes_example_runs_as_written(make_server):
    steps = readme_console("## Regions: one budget across regions")
    start, *commands = steps
    assert start[0][:1] == ["fastlimit-server"]
    server = make_server("--manual-clock", *start[0][1:])
    for words, shown in commands:
        assert run_redis_cli(words, server.port).splitlines() == shown_lines(shown), words
