"""Global rules through real tiers: three regions, each a fastlimit tier
whose links (CONFIG SET region-peers, here through TCP proxies that can
stall a link as a partition does) carry the spends of global rules to
the others every region-sync-ms.  Buckets run on the manual clock (a
window never ends during a test); the links run in real time.

- a user who hops regions, each request seen everywhere before the
  next: the fleet admits exactly the limit, each spend debited once;
- the same user at 1,000 checks a second per region, links delayed 0,
  40 and 100 ms one way: at least the limit and at most the README's
  bound from the measured rate and link delay;
- a partition: the global rule falls back to each region's share, and
  on healing the regions exchange what they spent apart, once;
- CL.REGIONSYNC itself: each sequence number applied once per run,
  unknown origins and malformed batches refused;
- the links authenticate as repl-user (a wrong password shows in INFO and
  moves nothing);
- a region's primary fails over to its standby, which carries on; a
  region's tier restarts and catches up on what it missed, once."""

from __future__ import annotations

import json
import socket
import time

import pytest
from proxy import Proxy
from readme import readme_console, run_redis_cli, shown_lines
from wire import Wire, free_port, wait_until

from fastlimit.regions.wire import encode_batches

REGIONS = ("ap", "eu", "us")
SYNC_MS = 20
PARTITION_MS = 1000


class Fleet:
    """One tier per region, linked all to all through a proxy per link."""

    def __init__(self, make_server, *extra: str, peer_args=(), delay: float = 0.0):
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
                    proxy = Proxy(self.servers[other].port, delay=delay)
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
            wait_until(lambda name=name: self.info(name)["region_links_up"] == 2, 30,
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
def fleet(make_server, request):
    """The three tiers; with indirect parametrization, each link's one-way
    delay in seconds (as `tc netem delay` between regions)."""
    f = Fleet(make_server, delay=getattr(request, "param", 0.0))
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


@pytest.mark.untraced      # a bound in real time, with one sync interval of slack
@pytest.mark.parametrize("fleet", [0.0, 0.04, 0.1], indirect=True,
                         ids=["no-delay", "40ms", "100ms"])
def test_a_fast_hopping_user_stays_within_the_stated_bound(fleet):
    limit = 1000
    fleet.set_rule("api", dict(GLOBAL, limit=limit))
    # paced at (at most) 1,000 checks a second per region, so that the run
    # lasts several times the sync interval plus the delay
    requests, allowed, pace = 3 * limit, 0, 1 / 3000
    start = time.monotonic()
    for i in range(requests):
        ahead = start + i * pace - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        allowed += fleet.check(REGIONS[i % 3])
    elapsed = time.monotonic() - start
    wait_until(lambda: all(fleet.info(name)[f"peer{i}"]["queued_batches"] == 0
                           for name in REGIONS for i in range(2)), timeout=5,
               what="every batch acknowledged")
    # the one-way delay, measured: half the slowest acknowledged round trip
    lag_s = max(float(link["lag_max_ms"]) for name in REGIONS
                for key, link in fleet.info(name).items() if key.startswith("peer")) / 2000
    rate = requests / 3 / elapsed                     # each region's checks per second
    # README "Regions": L + (R - 1) * lambda * (sync interval + link delay),
    # with one more interval of slack for the timer's and the loop's delays
    bound = limit + 2 * rate * (2 * SYNC_MS / 1000 + lag_s)
    assert limit <= allowed <= bound, (allowed, bound, rate, lag_s)
    assert bound < 3 * limit, (bound, rate)           # below what regional rules admit


@pytest.mark.parametrize("fleet", [0.04], indirect=True, ids=["40ms"])
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


def test_what_arrived_survives_a_failover_and_a_restart(make_server, tmp_path):
    """Which batches arrived is kept in the tables with their debits: a
    standby promoted after its primary applied a batch, and a tier
    restarted from its snapshot, skip a resend of it."""
    port = free_port()
    kept = ["--snapshot-file", str(tmp_path / "eu.snap"), "--rules-db", str(tmp_path / "eu.db")]
    eu = make_server(*regions_args("eu"), "--port", str(port), *kept)
    standby = make_server(*regions_args("eu"), "--replicaof", "127.0.0.1", str(port))
    eu.client().execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL))
    with Wire.to(port) as w:        # applied; its acknowledgement, say, lost
        assert w.call("CL.REGIONSYNC", "ap", "run1", 1, BATCH) == b":1\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", 2, BATCH) == b":2\r\n"
    wait_until(lambda: limit_left(standby.client()) == LIMIT - 8, what="the debits replicated")
    assert eu.client().execute_command("SAVE")
    eu.stop()
    standby.client().execute_command("REPLICAOF", "NO", "ONE")
    with Wire.to(standby.port) as w:       # the sender sends both again
        assert w.call("CL.REGIONSYNC", "ap", "run1", 1, BATCH) == b":1\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", 2, BATCH) == b":2\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", 3, BATCH) == b":3\r\n"    # a new one
    assert limit_left(standby.client()) == LIMIT - 12
    restarted = make_server(*regions_args("eu"), "--port", str(port), *kept)
    with Wire.to(port) as w:
        assert w.call("CL.REGIONSYNC", "ap", "run1", 2, BATCH) == b":2\r\n"
        assert w.call("CL.REGIONSYNC", "ap", "run1", "1" + "0" * 200, BATCH).startswith(b"-ERR")
        assert w.call("CL.REGIONSYNC", "ap", "r" * 129, 1, BATCH) == \
            b"-ERR CL.REGIONSYNC: a run id of at most 128 bytes\r\n"
    assert limit_left(restarted.client()) == LIMIT - 8
    assert restarted.client().info("regions")["region_batches_received"] == 0


def test_a_tier_without_regions_refuses_region_batches(make_server):
    c = make_server("--manual-clock").client()
    assert c.execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL)) == b"OK"
    with pytest.raises(Exception, match="which is not another of this tier's regions"):
        c.execute_command("CL.REGIONSYNC", "ap", "run1", 1, BATCH)


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


def link_to(c, peers: dict[str, int]) -> None:
    c.config_set("region-peers", " ".join(f"{n}=127.0.0.1:{p}" for n, p in peers.items()))


def regions_args(name: str) -> list[str]:
    return ["--manual-clock", "--region", name, "--regions", *REGIONS,
            "--region-sync-ms", str(SYNC_MS), "--region-partition-ms", str(PARTITION_MS)]


def limit_left(c) -> int:
    return c.execute_command("CL.LIMIT", "user:1", "api", "COST", 0)[2]


def test_a_promoted_standby_carries_on_its_regions_sync(make_server):
    """eu is a primary with a standby; ap and us link to the primary.  The
    primary dies, the standby is promoted and the peers pointed at it:
    it has the region's count (replicated, remote spends included), its
    own spends cross under a new run, and the peers' reach it."""
    ap, us = (make_server(*regions_args(n)) for n in ("ap", "us"))
    eu = make_server(*regions_args("eu"))
    standby = make_server(*regions_args("eu"), "--replicaof", "127.0.0.1", str(eu.port))
    c = {"ap": ap.client(), "us": us.client(), "eu": eu.client(), "standby": standby.client()}
    for name in ("ap", "us", "eu"):
        c[name].execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL))
    wait_until(lambda: c["standby"].execute_command("CL.RULE", "GET", "api"),
               what="the rule on the standby")
    link_to(c["ap"], {"eu": eu.port, "us": us.port})
    link_to(c["us"], {"eu": eu.port, "ap": ap.port})
    link_to(c["eu"], {"ap": ap.port, "us": us.port})
    link_to(c["standby"], {"ap": ap.port, "us": us.port})
    for _ in range(5):
        c["ap"].execute_command("CL.LIMIT", "user:1", "api")
    for _ in range(3):
        c["eu"].execute_command("CL.LIMIT", "user:1", "api")
    wait_until(lambda: {limit_left(c[n]) for n in ("ap", "us", "eu", "standby")}
               == {LIMIT - 8}, what="8 spent, everywhere and on the standby")
    assert c["standby"].info("regions")["region_batches_sent"] == 0      # a replica sends none
    eu.stop()
    c["standby"].execute_command("REPLICAOF", "NO", "ONE")
    link_to(c["ap"], {"eu": standby.port, "us": us.port})
    link_to(c["us"], {"eu": standby.port, "ap": ap.port})
    for _ in range(2):
        c["standby"].execute_command("CL.LIMIT", "user:1", "api")
    c["us"].execute_command("CL.LIMIT", "user:1", "api")
    wait_until(lambda: {limit_left(c[n]) for n in ("ap", "us", "standby")} == {LIMIT - 11},
               what="the promoted standby's and us's spends everywhere")


def test_a_region_whose_tier_restarts_catches_up(make_server, tmp_path):
    """us stops (its buckets and rules saved) while ap and eu spend; their
    links hold the batches, send them again when us is back on its port,
    and us applies each once."""
    port = free_port()
    us = make_server(*regions_args("us"), "--port", str(port),
                     "--snapshot-file", str(tmp_path / "us.snap"),
                     "--rules-db", str(tmp_path / "us.db"))
    ap, eu = (make_server(*regions_args(n)) for n in ("ap", "eu"))
    c = {"ap": ap.client(), "eu": eu.client(), "us": us.client()}
    for cl in c.values():
        cl.execute_command("CL.RULE", "SET", "api", json.dumps(GLOBAL))
    link_to(c["ap"], {"eu": eu.port, "us": port})
    link_to(c["eu"], {"ap": ap.port, "us": port})
    link_to(c["us"], {"ap": ap.port, "eu": eu.port})
    c["us"].execute_command("CL.LIMIT", "user:1", "api")
    wait_until(lambda: limit_left(c["ap"]) == LIMIT - 1, what="us's spend at ap")
    us.stop()
    for _ in range(4):
        c["ap"].execute_command("CL.LIMIT", "user:1", "api")
    c["eu"].execute_command("CL.LIMIT", "user:1", "api")
    wait_until(lambda: limit_left(c["eu"]) == LIMIT - 6, what="ap's spends at eu")
    us.start()
    c["us"] = us.client()
    c["us"].execute_command("DEBUG", "CLOCK", "SET", 0)
    wait_until(lambda: limit_left(c["us"]) == LIMIT - 6, what="us caught up")
    time.sleep(5 * SYNC_MS / 1000)
    assert limit_left(c["us"]) == LIMIT - 6                    # and counted nothing twice
    assert c["us"].info("regions")["region_tokens_debited"] == 5
