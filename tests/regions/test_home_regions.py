"""Home rules through real tiers (README "Home rules"): each key of a
"regions": "home" rule lives in one region (the rule's "home", or the
key's hash over the regions), which answers every region's checks of it:
a region asks it over its link (CL.REGIONCHECK) and answers its client
with the home's reply, one round trip later.  While the home is
unreachable, the rules' failure policy answers (not counted).  The
buckets run on the manual clock; the links in real time."""

from __future__ import annotations

import http.client
import json
import time

import pytest
import redis
from proxy import Proxy
from servers import ExtraPortServer, started_servers
from wire import Wire, wait_until

from fastlimit._rules import home_index

REGIONS = ("ap", "eu", "us")
LIMIT = 30


class Tier(ExtraPortServer):
    PORT_FLAG = "--http-port"


@pytest.fixture
def fleet():
    """Three tiers linked all to all through proxies (home checks cross
    them), a silent peer unreachable after 1 s."""
    with started_servers(Tier) as make:
        servers = {n: make("--manual-clock", "--region", n, "--regions", *REGIONS,
                           "--region-partition-ms", "1000", "--region-home-timeout-ms", "2000")
                   for n in REGIONS}
        proxies = {}
        for name, s in servers.items():
            peers = []
            for other in REGIONS:
                if other != name:
                    proxies[(name, other)] = Proxy(servers[other].port)
                    peers.append(f"{other}=127.0.0.1:{proxies[(name, other)].port}")
            s.client().config_set("region-peers", " ".join(peers))
        for s in servers.values():
            wait_until(lambda s=s: s.client().info("regions")["region_links_up"] == 2, 30,
                       what="the links up")
        yield servers, proxies
        for p in proxies.values():
            p.close()


def set_rule(servers, doc: dict, rule_id: str = "api") -> None:
    for s in servers.values():
        assert s.client().execute_command("CL.RULE", "SET", rule_id, json.dumps(doc)) == b"OK"


RULE = {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": LIMIT,
        "window_ms": 600_000, "regions": "home"}


def test_a_hopping_user_is_counted_once_at_the_home(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="eu"))
    c = {n: s.client() for n, s in servers.items()}
    replies = [c[REGIONS[i % 3]].execute_command("CL.LIMIT", "user:1", "api")
               for i in range(3 * LIMIT)]
    assert sum(r[0] for r in replies) == LIMIT                 # not 3 x LIMIT
    assert replies[0] == [1, LIMIT, LIMIT - 1, 0, 600_000]      # the home's own reply
    info = {n: c[n].info("regions") for n in REGIONS}
    assert info["eu"]["region_checks_served"] == 2 * LIMIT      # ap's and us's
    assert info["ap"]["region_checks_asked"] == LIMIT and info["ap"]["region_home_rules"] == 1


def test_without_a_home_each_key_lives_where_its_hash_says(fleet):
    servers, _ = fleet
    set_rule(servers, RULE)
    c = {n: s.client() for n, s in servers.items()}
    keys = [f"user:{i}" for i in range(12)]
    homes = {k: REGIONS[home_index(k.encode(), 3)] for k in keys}
    assert len(set(homes.values())) == 3
    for k in keys:
        for name in REGIONS:
            c[name].execute_command("CL.LIMIT", k, "api", "COST", 2)
    for k in keys:      # each key spent 3 x 2 at its home, whoever asked
        assert c[homes[k]].execute_command("CL.LIMIT", k, "api", "COST", 0)[2] == LIMIT - 6
    served = {n: c[n].info("regions")["region_checks_served"] for n in REGIONS}
    assert served == {n: 2 * sum(h == n for h in homes.values()) for n in REGIONS}


def test_cl_apply_and_detail_are_asked_of_the_home_too(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="us"))
    ap = servers["ap"].client()
    assert ap.execute_command("CL.APPLY", "api", "user:1", "COST", 4)[:3] == [1, LIMIT,
                                                                              LIMIT - 4]
    reply = ap.execute_command("CL.LIMIT", "user:1", "api", "DETAIL")
    assert reply[:3] == [1, LIMIT, LIMIT - 5] and reply[5][0][0] == b"api"
    assert servers["us"].client().info("regions")["region_checks_served"] == 2


def test_an_unreachable_home_leaves_the_answer_to_the_failure_policy(fleet):
    servers, proxies = fleet
    set_rule(servers, dict(RULE, home="eu"))
    set_rule(servers, dict(RULE, match={"resource": "login"}, home="eu",
                           on_failure="closed"), "login")
    for (a, b), p in proxies.items():
        if "eu" in (a, b):
            p.stall()
    ap = servers["ap"].client()
    wait_until(lambda: ap.info("regions")["region_partitioned"] == 1, what="eu unreachable")
    assert ap.execute_command("CL.LIMIT", "user:1", "api") == [1, -1, -2, 0, 0]
    assert ap.execute_command("CL.LIMIT", "user:1", "login") == [0, -1, -2, 1000, 0]
    for p in proxies.values():
        p.restore()
    wait_until(lambda: ap.info("regions")["region_partitioned"] == 0, what="eu back")
    assert ap.execute_command("CL.LIMIT", "user:1", "api")[:3] == [1, LIMIT, LIMIT - 1]


def test_an_unreachable_home_leaves_a_small_local_allowance(fleet):
    servers, proxies = fleet
    set_rule(servers, dict(RULE, home="eu", home_allowance=5))
    set_rule(servers, dict(RULE, match={"resource": "login"}, home="eu",
                           on_failure="closed"), "login")
    ap = servers["ap"].client()
    assert ap.execute_command("CL.LIMIT", "user:1", "api", "COST", 2)[:3] == [1, LIMIT,
                                                                              LIMIT - 2]
    for (a, b), p in proxies.items():
        if "eu" in (a, b):
            p.stall()
    wait_until(lambda: ap.info("regions")["region_partitioned"] == 1, what="eu unreachable")
    # counted here against 5 of the rule's 30 tokens, in every form of the check
    replies = [ap.execute_command("CL.LIMIT", "user:1", "api") for _ in range(3)]
    replies.append(ap.execute_command("CL.APPLY", "api", "user:1", "COST", 2))
    assert [r[:3] for r in replies] == [[1, 5, 4], [1, 5, 3], [1, 5, 2], [1, 5, 0]]
    assert ap.execute_command("CL.LIMIT", "user:1", "api")[:3] == [0, 5, 0]
    status, _, body = http_post(servers["ap"].extra_port, "/v1/check",
                                {"client_key": "user:1", "resource": "api"})
    assert status == 200 and (body["allowed"], body["limit"]) == (False, 5), body
    # a check of a home rule with no allowance: the failure policy, uncounted
    assert ap.execute_command("CL.LIMIT", "user:1", "login") == [0, -1, -2, 1000, 0]
    assert ap.info("regions")["region_checks_allowance"] == 6
    for p in proxies.values():
        p.restore()
    wait_until(lambda: ap.info("regions")["region_partitioned"] == 0, what="eu back")
    # the home's count again: the allowance spent nothing of it
    assert ap.execute_command("CL.LIMIT", "user:1", "api")[:3] == [1, LIMIT, LIMIT - 3]


def test_a_home_slower_than_the_timeout_leaves_the_answer_to_the_failure_policy(fleet):
    servers, proxies = fleet
    set_rule(servers, dict(RULE, home="eu"))
    ap = servers["ap"].client()
    ap.config_set("region-home-timeout-ms", 100)
    proxies[("ap", "eu")].set_delay(0.2)                      # a round trip of 400 ms
    start = time.monotonic()
    assert ap.execute_command("CL.LIMIT", "user:1", "api") == [1, -1, -2, 0, 0]
    assert time.monotonic() - start >= 0.09         # the timeout's (the loop's clock's)
    assert ap.info("regions")["region_checks_unanswered"] == 1


def test_a_check_asked_of_its_home_waits_one_round_trip(fleet):
    servers, proxies = fleet
    set_rule(servers, dict(RULE, home="eu"))
    proxies[("ap", "eu")].set_delay(0.05)
    ap = servers["ap"].client()
    start = time.monotonic()
    assert ap.execute_command("CL.LIMIT", "user:1", "api")[0] == 1
    assert time.monotonic() - start >= 0.1                     # 2 x 50 ms, at least
    # the connection's later commands wait for it, in order
    with Wire.to(servers["ap"].port) as w:
        w.send(b"*3\r\n$8\r\nCL.LIMIT\r\n$6\r\nuser:1\r\n$3\r\napi\r\n*1\r\n$4\r\nPING\r\n")
        assert w.read_reply() == b"*5\r\n:1\r\n:30\r\n:28\r\n:0\r\n:600000\r\n"
        assert w.read_reply() == b"+PONG\r\n"


def http_post(port: int, path: str, doc: dict) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=json.dumps(doc))
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def test_multi_cannot_wait_on_the_home(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="eu"))
    with pytest.raises(redis.ResponseError, match="waits on its home region"):
        pipe = servers["ap"].client().pipeline(transaction=True)
        pipe.execute_command("CL.LIMIT", "user:1", "api")
        pipe.execute()


def test_the_http_front_asks_the_home_too(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="eu"))
    port = servers["ap"].extra_port
    status, headers, body = http_post(port, "/v1/check?enforce=1",
                                      {"client_key": "user:1", "resource": "api", "cost": 3})
    assert status == 200 and body["allowed"] and body["remaining"] == LIMIT - 3, body
    assert body["rule"] == "api" and headers["RateLimit"].startswith('"api";r=27'), (body,
                                                                                  headers)
    status, _, body = http_post(port, "/v1/limits/check",
                                {"rule_id": "api", "key": "user:1", "cost": LIMIT})
    assert status == 200 and not body["allowed"] and body["remaining"] == LIMIT - 3, body
    assert servers["eu"].client().info("regions")["region_checks_served"] == 2
    # a batch is answered at once: its checks homed elsewhere are refused, named
    status, _, body = http_post(port, "/v1/check/batch", {"checks": [
        {"client_key": "user:1", "resource": "api"}, {"client_key": "user:1",
                                                      "resource": "other"}]})
    refused = body["results"][0]["error"]
    assert status == 200 and refused["status"] == 421, body
    assert "HOME eu: the check's key lives in region eu" in refused["detail"], body
    assert body["results"][1]["allowed"] is True


def test_cl_regioncheck_checks_what_it_is_asked(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="eu"))
    with Wire.to(servers["eu"].port) as w:
        assert w.call("CL.REGIONCHECK", "xx", "CL.LIMIT", "u", "api").startswith(
            b"-ERR CL.REGIONCHECK from 'xx', which is not another")
        assert w.call("CL.REGIONCHECK", "ap", "CL.RESET", "u", "api") == \
            b"-ERR CL.REGIONCHECK runs CL.LIMIT, CL.APPLY or RLS\r\n"
        assert w.call("CL.REGIONCHECK", "ap", "RLS", "web", "{") == \
            b"-ERR CL.REGIONCHECK: unreadable request: Expecting property name enclosed in " \
            b"double quotes: line 1 column 2 (char 1)\r\n"
        assert w.call("CL.REGIONCHECK", "ap", "RLS", "web", '{"h":-1,"d":[]}') == \
            b"-ERR CL.REGIONCHECK: unreadable request: hits are an integer from 0\r\n"
        assert w.call("CL.REGIONCHECK", "ap", "RLS", "web", '{"h":0,"d":[[[[1,2]],null,null]]}') \
            == b"-ERR CL.REGIONCHECK: unreadable request: a descriptor entry is a pair of " \
               b"strings\r\n"
        # a domain this tier does not know: the reference's answer, no limit
        assert w.call("CL.REGIONCHECK", "ap", "RLS", "web", '{"h":0,"d":[[[["a","b"]],null,null]]}'
                      ) == b"*3\r\n:1\r\n*1\r\n*6\r\n:1\r\n:-1\r\n:0\r\n$0\r\n\r\n:0\r\n:0\r\n*0\r\n"
        assert w.call("CL.REGIONCHECK", "ap", "CL.LIMIT", "u", "api").startswith(b"*5\r\n:1")


def test_key_prefixes_pick_the_home_the_longest_first(fleet):
    servers, _ = fleet
    set_rule(servers, dict(RULE, home="eu", home_prefixes={"t:us-": "us", "t:us-west-": "ap"}))
    c = {n: s.client() for n, s in servers.items()}
    homes = {"t:us-west-1": "ap", "t:us-1": "us", "t:eu-1": "eu", "x": "eu"}
    for key in homes:
        for name in REGIONS:
            c[name].execute_command("CL.LIMIT", key, "api")
    for key, home in homes.items():       # every check of a key counted at its home
        assert c[home].execute_command("CL.LIMIT", key, "api", "COST", 0)[2] == LIMIT - 3
    served = {n: c[n].info("regions")["region_checks_served"] for n in REGIONS}
    assert served == {"ap": 2, "us": 2, "eu": 4}
