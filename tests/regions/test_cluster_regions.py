"""A region whose tier is a cluster (README "A region that is a
cluster"): region "eu" is three fastlimit shards, region "us" one tier.
us reaches eu by seeds (region-peers eu=cluster:...), asks it for its
slot map and keeps a link to each shard, so that each bucket's spends of
a global rule, and each home check, go to the shard that serves the key;
each eu shard links to us as any tier does.  Buckets on the manual
clock; the links in real time."""

from __future__ import annotations

import json

import pytest
from cluster_rig import FastlimitCluster
from servers import ServerProcess
from wire import Wire, wait_until

from fastlimit._cluster import keyslot

LIMIT = 100
REGIONS = ("--regions", "eu", "us", "--region-partition-ms", "1000")
KEYS = [f"user:{i}" for i in range(24)]


@pytest.fixture
def regions(tmp_path):
    eu = FastlimitCluster(str(tmp_path), 3, 0, "--region", "eu", *REGIONS)
    us = ServerProcess("--manual-clock", "--region", "us", *REGIONS).start()
    try:
        seed = eu.primaries[1].port
        us.client().config_set("region-peers", f"eu=cluster:127.0.0.1:{seed}")
        for node in eu.primaries:
            node.client().config_set("region-peers", f"us=127.0.0.1:{us.port}")
        wait_until(lambda: us.client().info("regions")["region_links_up"] == 1, 30,
                   what="us's links to every eu shard up")
        for node in eu.primaries:
            wait_until(lambda node=node: node.client().info("regions")["region_links_up"] == 1,
                       30, what="each eu shard's link to us up")
        yield eu, us
    finally:
        us.stop()
        eu.stop()


def shard_of(eu: FastlimitCluster, key: str):
    """The eu primary serving key (the rig splits the slots evenly)."""
    return eu.primaries[keyslot(key.encode()) * 3 // 16384]


def set_rule(eu: FastlimitCluster, us: ServerProcess, doc: dict) -> None:
    for node in (*eu.primaries, us):
        assert node.client().execute_command("CL.RULE", "SET", "api", json.dumps(doc)) == b"OK"


def test_the_peer_cluster_is_reached_by_seeds_and_shown_by_shard(regions):
    eu, us = regions
    shown = us.client().config_get("region-peers")["region-peers"]
    assert shown == f"eu=cluster:127.0.0.1:{eu.primaries[1].port}"
    peer = us.client().info("regions")["peer0"]
    assert (peer["name"], peer["via"], peer["state"]) == ("eu", "cluster", "up"), peer
    # the seed's answer named every primary: a link to each
    assert sorted(peer["shards"].split("+")) == sorted(f"127.0.0.1:{n.port}:up"
                                                       for n in eu.primaries), peer


def test_global_spends_go_to_the_shard_of_their_key_both_ways(regions):
    eu, us = regions
    set_rule(eu, us, {"match": {"resource": "api"}, "algorithm": "fixed_window",
                      "limit": LIMIT, "window_ms": 600_000, "regions": "global"})
    assert len({shard_of(eu, k).port for k in KEYS}) == 3
    c = us.client()
    for key in KEYS:
        assert c.execute_command("CL.LIMIT", key, "api", "COST", 4)[0] == 1

    def debited() -> int:
        return sum(n.client().info("regions")["region_tokens_debited"] for n in eu.primaries)
    wait_until(lambda: debited() == 4 * len(KEYS), 20, what="us's spends at the eu shards")
    for key in KEYS:     # each at its own shard: a peek there sees us's spend
        peek = shard_of(eu, key).client().execute_command("CL.LIMIT", key, "api", "COST", 0)
        assert peek[2] == LIMIT - 4, key
        assert shard_of(eu, key).client().execute_command(
            "CL.LIMIT", key, "api", "COST", 2)[0] == 1
    wait_until(lambda: c.info("regions")["region_tokens_debited"] == 2 * len(KEYS), 20,
               what="the eu shards' spends at us")
    for key in KEYS:
        assert c.execute_command("CL.LIMIT", key, "api", "COST", 0)[2] == LIMIT - 6, key
    for node in eu.primaries:
        assert node.client().info("regions")["region_spends_misrouted"] == 0


def test_home_checks_are_asked_of_the_shard_that_serves_the_key(regions):
    eu, us = regions
    set_rule(eu, us, {"match": {"resource": "api"}, "algorithm": "fixed_window",
                      "limit": LIMIT, "window_ms": 600_000, "regions": "home", "home": "eu"})
    c = us.client()
    for key in KEYS:
        assert c.execute_command("CL.LIMIT", key, "api", "COST", 3)[:3] == [1, LIMIT,
                                                                            LIMIT - 3]
    served = {node.port: node.client().info("regions")["region_checks_served"]
              for node in eu.primaries}
    assert served == {node.port: sum(shard_of(eu, k) is node for k in KEYS)
                      for node in eu.primaries}
    for key in KEYS:    # counted at the key's shard, once
        assert shard_of(eu, key).client().execute_command(
            "CL.LIMIT", key, "api", "COST", 0)[2] == LIMIT - 3


def test_a_shard_answers_moved_for_a_check_of_another_shards_key(regions):
    eu, _ = regions
    key = next(k for k in KEYS if shard_of(eu, k) is not eu.primaries[0])
    with Wire.to(eu.primaries[0].port) as w:
        assert w.call("CL.REGIONCHECK", "us", "CL.LIMIT", key, "api").startswith(b"-MOVED ")


def test_after_a_reshard_checks_follow_moved_and_spends_the_new_map(regions):
    eu, us = regions
    key = next(k for k in KEYS if shard_of(eu, k) is eu.primaries[0])
    slot = keyslot(key.encode())
    with eu.primaries[0].client(socket_timeout=60) as c:
        assert c.execute_command("CL.CLUSTER", "MOVE", f"{slot}-{slot}", "fl-1")
    set_rule(eu, us, {"match": {"resource": "api"}, "algorithm": "fixed_window",
                      "limit": LIMIT, "window_ms": 600_000, "regions": "home", "home": "eu"})
    c = us.client()
    refreshes = c.info("regions")["peer0"]["map_refreshes"]
    # us's map still names shard 0 (unless its 5-second refresh came since the
    # move: a slow build): shard 0 answers MOVED, the link follows it once
    assert c.execute_command("CL.LIMIT", key, "api", "COST", 5)[:3] == [1, LIMIT, LIMIT - 5]
    assert eu.primaries[1].client().info("regions")["region_checks_served"] == 1
    assert eu.primaries[0].client().info("regions")["region_checks_served"] == 0
    moved = c.info("regions")["peer0"]["moved"]
    assert moved == 1 or (moved == 0 and refreshes >= 2)
    # and asks the map again: a global rule's spends go to the new shard
    wait_until(lambda: c.info("regions")["peer0"]["map_refreshes"] >= refreshes + moved, 20,
               what="the map asked again")
    set_rule(eu, us, {"match": {"resource": "api"}, "algorithm": "fixed_window",
                      "limit": LIMIT, "window_ms": 600_000, "regions": "global"})
    c.execute_command("CL.LIMIT", key, "api", "COST", 7)
    wait_until(lambda: eu.primaries[1].client().info("regions")["region_tokens_debited"] == 7,
               20, what="the spend at the key's new shard")
    assert eu.primaries[0].client().info("regions")["region_spends_misrouted"] == 0


def test_with_shards_a_rebalanced_rule_keeps_its_static_share(regions):
    eu, us = regions
    set_rule(eu, us, {"match": {"resource": "api"}, "algorithm": "fixed_window",
                      "limit": LIMIT, "window_ms": 600_000, "regions": "static",
                      "rebalance": True})
    # one coordinator and one demand per region cannot be had with shards:
    # each region its equal share, never the rebalancing floor (5)
    for node in (us, shard_of(eu, "user:1")):
        assert node.client().execute_command("CL.LIMIT", "user:1", "api", "COST", 0)[1] == \
            LIMIT // 2
