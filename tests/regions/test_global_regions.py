"""Global rules through real tiers: three regions, each a fastlimit tier
whose links (CONFIG SET region-peers, here through TCP proxies that can
stall a link as a partition does) carry the spends of global rules to
the others every region-sync-ms.  Buckets run on the manual clock (a
window never ends during a test); the links run in real time.

- a user who hops regions, each request seen everywhere before the
  next: the fleet admits exactly the limit, each spend debited once;
- the same user as fast as the client goes: at least the limit and at
  most the README's bound from the measured rate and link lag;
- a partition: the global rule falls back to each region's share, and
  on healing the regions exchange what they spent apart, once;
- CL.REGIONSYNC itself: each sequence number applied once per run,
  unknown origins and malformed batches refused;
- the links authenticate as repl-user (a wrong password shows in INFO and
  moves nothing)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from proxy import Proxy
from readme import readme_console, run_redis_cli, shown_lines
from wire import Wire, wait_until

from fastlimit.regions.wire import encode_batches

REGIONS = ("ap", "eu", "us")
SYNC_MS = 20
PARTITION_MS = 300


class Fleet:
    """One tier per region, linked all to all through a proxy per link."""

    def __init__(self, make_server, *extra: str, peer_args=()):
        self.servers = {name: make_server(
            "--manual-clock", "--region", name, "--regions", *REGIONS,
            "--region-sync-ms", str(SYNC_MS), "--region-partition-ms", str(PARTITION_MS),
            *extra) for name in REGIONS}
        self.c = {name: s.client() for name, s in self.servers.items()}
        self.proxies: dict[tuple[str, str], Proxy] = {}
        for name, c in self.c.items():
            c.execute_command("DEBUG", "CLOCK", "SET", 0)
            for arg in peer_args:
                c.config_set(*arg)
            peers = []
            for other in REGIONS:
                if other != name:
                    proxy = Proxy(self.servers[other].port)
                    self.proxies[(name, other)] = proxy
                    peers.append(f"{other}=127.0.0.1:{proxy.port}")
            c.config_set("region-peers", " ".join(peers))

    def close(self):
        for proxy in self.proxies.values():
            proxy.close()

    def info(self, name: str) -> dict:
        return self.c[name].info("regions")

    def wait_links_up(self) -> None:
        for name in REGIONS:
            wait_until(lambda name=name: self.info(name)["region_links_up"] == 2,
                       what=f"{name}'s links up")

    def set_rule(self, rule_id: str, doc: dict) -> None:
        for c in self.c.values():
            assert c.execute_command("CL.RULE", "SET", rule_id, json.dumps(doc)) == b"OK"

    def check(self, name: str, client: str = "user:1", resource: str = "api") -> int:
        return self.c[name].execute_command("CL.LIMIT", client, resource)[0]

    def remaining(self, client: str = "user:1", resource: str = "api") -> dict[str, int]:
        return {name: c.execute_command("CL.LIMIT", client, resource, "COST", 0)[2]
                for name, c in self.c.items()}

    def converged(self, expected: int, client: str = "user:1") -> bool:
        return set(self.remaining(client).values()) == {expected}

    def partition(self, region: str | None = None) -> None:
        """Stalls every link to and from region (every link: None): both
        ends hear silence."""
        for (a, b), proxy in self.proxies.items():
            if region is None or region in (a, b):
                proxy.stall()

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.restore()


@pytest.fixture
def fleet(make_server):
    f = Fleet(make_server)
    f.wait_links_up()
    yield f
    f.close()


LIMIT = 30
GLOBAL = {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": LIMIT,
          "window_ms": 600_000, "regions": "global"}


def test_a_hopping_user_seen_everywhere_gets_exactly_the_limit(fleet):
    fleet.set_rule("api", GLOBAL)
    allowed = 0
    for i in range(2 * LIMIT):
        allowed += fleet.check(REGIONS[i % 3])
        wait_until(lambda left=LIMIT - allowed: fleet.converged(left), timeout=5,
                   what=f"every region seeing {allowed} spent")
    assert allowed == LIMIT
    for name in REGIONS:
        info = fleet.info(name)
        # each region debited exactly what the other two spent, nothing twice
        assert info["region_tokens_debited"] == 2 * LIMIT // 3, name
        assert info["region_tokens_overdrawn"] == 0, name


def test_a_fast_hopping_user_stays_within_the_stated_bound(fleet):
    limit = 300
    fleet.set_rule("api", dict(GLOBAL, limit=limit))
    requests, allowed = 6 * limit, 0
    start = time.monotonic()
    for i in range(requests):
        allowed += fleet.check(REGIONS[i % 3])
    elapsed = time.monotonic() - start
    wait_until(lambda: len(set(fleet.remaining().values())) == 1, timeout=5,
               what="the regions converging")
    lag_s = max(float(link["lag_ms"]) for name in REGIONS
                for key, link in fleet.info(name).items() if key.startswith("peer")) / 1000
    rate = requests / 3 / elapsed                     # each region's checks per second
    # README "Regions": L + (R - 1) * lambda * (sync interval + link delay),
    # with one more interval of slack for the timer's and the loop's delays
    bound = limit + 2 * rate * (2 * SYNC_MS / 1000 + lag_s)
    assert limit <= allowed <= bound, (allowed, bound, rate, lag_s)
    assert allowed < 3 * limit                        # what regional rules would admit


def test_a_partition_falls_back_to_shares_and_healing_counts_each_spend_once(fleet):
    fleet.set_rule("api", GLOBAL)
    fleet.partition()
    for name in REGIONS:
        wait_until(lambda name=name: fleet.info(name)["region_partitioned"] == 1, timeout=5,
                   what=f"{name} partitioned")
    # apart, each region enforces its share: 10 of 30, so 30 in all
    allowed = {name: sum(fleet.check(name) for _ in range(20)) for name in REGIONS}
    assert allowed == dict.fromkeys(REGIONS, LIMIT // 3)
    fleet.heal()
    for name in REGIONS:
        wait_until(lambda name=name: fleet.info(name)["region_partitioned"] == 0, timeout=5,
                   what=f"{name} whole again")
    # what each spent apart crossed once: every region's view is the fleet's 30
    wait_until(lambda: fleet.converged(0), timeout=5, what="every view at 30 spent")
    for name in REGIONS:
        assert fleet.info(name)["region_tokens_debited"] == 2 * LIMIT // 3, name
        assert fleet.info(name)["region_tokens_overdrawn"] == 0, name
    assert sum(fleet.check(name) for name in REGIONS) == 0


def test_the_whole_policy_keeps_every_region_at_the_limit_while_apart(fleet):
    fleet.set_rule("api", dict(GLOBAL, partition="whole"))
    fleet.partition("eu")
    wait_until(lambda: fleet.info("eu")["region_partitioned"] == 1, timeout=5,
               what="eu partitioned")
    assert sum(fleet.check("eu") for _ in range(40)) == LIMIT     # availability first
    fleet.heal()
    # eu's 30 reach the others, whose buckets were full: they stop too
    wait_until(lambda: fleet.converged(0), timeout=5, what="eu's spends everywhere")
    assert fleet.check("ap") == 0


BATCH = next(encode_batches({(1, b"user:1"): 4}, {1: "api"}))


def test_each_sequence_number_applies_once_per_run(make_server):
    s = make_server("--manual-clock", "--region", "eu", "--regions", *REGIONS)
    c = s.client()
    c.execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL))
    with Wire.to(s.port) as w:
        assert w.call("CL.REGIONSYNC", "ap", "run1", 1, BATCH) == b":1\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", 1, BATCH) == b":1\r\n"    # a resend
        assert w.call("CL.REGIONSYNC", "us", "run9", 1, BATCH) == b":1\r\n"    # its own
        assert w.call("CL.REGIONSYNC", "ap", "run1", 2, BATCH) == b":2\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", 2, BATCH) == b":2\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run2", 1, BATCH) == b":1\r\n"    # ap restarted
        assert c.execute_command("CL.LIMIT", "user:1", "api", "COST", 0)[2] == LIMIT - 16
        for origin, batch, error in [
                ("xx", BATCH, b"-ERR CL.REGIONSYNC from 'xx', which is not another of this "
                              b"tier's regions\r\n"),
                ("eu", BATCH, b"-ERR CL.REGIONSYNC from 'eu', which is not another"),
                ("ap", b"\x01", b"-ERR CL.REGIONSYNC: unreadable batch")]:
            assert w.call("CL.REGIONSYNC", origin, "run3", 1, batch).startswith(error)
        assert w.call("CL.REGIONSYNC", "ap", "run3", "x", BATCH).startswith(b"-ERR")
    assert c.info("regions")["region_batches_received"] == 4


def test_a_tier_without_regions_refuses_region_batches(r):
    assert r.execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL)) == b"OK"
    with pytest.raises(Exception, match="which is not another of this tier's regions"):
        r.execute_command("CL.REGIONSYNC", "ap", "run1", 1, BATCH)


def test_links_authenticate_as_the_replication_user(make_server):
    fleet = Fleet(make_server, "--repl-password", "replpw",
                  peer_args=[("region-user", "replica"), ("region-password", "wrong")])
    try:
        wait_until(lambda: "WRONGPASS" in fleet.info("eu")["peer0"]["last_error"],
                   what="the refused AUTH in INFO")
        fleet.set_rule("api", GLOBAL)
        assert fleet.check("eu") == 1
        time.sleep(5 * SYNC_MS / 1000)
        assert fleet.remaining()["ap"] == LIMIT                   # nothing crossed
        for c in fleet.c.values():
            c.config_set("region-password", "replpw")
        fleet.wait_links_up()
        wait_until(lambda: fleet.converged(LIMIT - 1), what="eu's spend everywhere")
        # the replication user may sync regions and nothing else
        with Wire.to(fleet.servers["ap"].port) as w:
            assert w.call("AUTH", "replica", "replpw") == b"+OK\r\n"
            assert w.call("CL.LIMIT", "user:1", "api").startswith(b"-NOPERM")
    finally:
        fleet.close()


def test_the_readmes_global_example_runs_as_written(make_server):
    (start, *commands) = readme_console("## Regions: one budget across regions", 1)
    args = start[0][1:]
    peers = args.index("--region-peers")
    closed = []
    for _ in range(2):      # the peers' ports, as ports where nothing listens
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed.append(s.getsockname()[1])
    args[peers + 1:peers + 3] = [f"ap=127.0.0.1:{closed[0]}", f"us=127.0.0.1:{closed[1]}"]
    server = make_server("--manual-clock", *args)
    for words, shown in commands:
        assert run_redis_cli(words, server.port).splitlines() == shown_lines(shown), words
    assert server.client().info("regions")["global_rules"] == 1
