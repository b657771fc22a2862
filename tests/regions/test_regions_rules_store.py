"""One PostgreSQL rules table serving every region (README "Regions"):
each region's tier follows the same table, so a rule written once (by a
CL.RULE SET at any tier) is the same document everywhere, and each region
enforces its own scope of it: a static rule its share, a global rule the
whole limit less the others' spends."""

from __future__ import annotations

import json

from wire import wait_until

REGIONS = ("ap", "eu", "us")
QUICK = ("--rules-store-heartbeat", "0.2", "--rules-store-timeout", "1")


def test_one_rules_table_for_every_region(make_server, pg, tmp_path):
    url = pg.create_database()
    servers = {n: make_server("--manual-clock", "--region", n, "--regions", *REGIONS,
                              "--region-sync-ms", "20", "--rules-store", url,
                              "--rules-db", str(tmp_path / f"cache-{n}.db"), *QUICK)
               for n in REGIONS}
    c = {n: s.client() for n, s in servers.items()}
    for n in REGIONS:
        c[n].config_set("region-peers", " ".join(f"{o}=127.0.0.1:{servers[o].port}"
                                                 for o in REGIONS if o != n))
    static = {"match": {"resource": "api"}, "algorithm": "fixed_window", "limit": 90,
              "window_ms": 600_000, "regions": "static", "shares": {"ap": 1, "eu": 1, "us": 4}}
    world = {"match": {"resource": "world"}, "algorithm": "fixed_window", "limit": 10,
             "window_ms": 600_000, "regions": "global"}
    assert c["eu"].execute_command("CL.RULE", "SET", "api", json.dumps(static)) == b"OK"
    assert c["us"].execute_command("CL.RULE", "SET", "world", json.dumps(world)) == b"OK"
    for n in REGIONS:
        # both: us applies its own write at once, eu's only when notified
        wait_until(lambda n=n: all(c[n].execute_command("CL.RULE", "GET", r)
                                   for r in ("api", "world")), 10, what=f"the rules at {n}")
    # the same document in every region, each its share of it
    docs = {c[n].execute_command("CL.RULE", "GET", "api") for n in REGIONS}
    assert len(docs) == 1
    limits = {n: c[n].execute_command("CL.LIMIT", "u", "api", "COST", 0)[1] for n in REGIONS}
    assert limits == {"ap": 15, "eu": 15, "us": 60}
    # and the global rule's spends cross
    for _ in range(4):
        c["ap"].execute_command("CL.LIMIT", "u", "world")
    wait_until(lambda: {c[n].execute_command("CL.LIMIT", "u", "world", "COST", 0)[2]
                        for n in REGIONS} == {6}, 10, what="ap's spends everywhere")
