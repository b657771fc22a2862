"""What an adversarial pass broke in the engine, over the wire: the
CL.LIMIT match cache's memory, peeks that wrote (and so moved a bucket's
expiry, or wrote on a replica), peeks denied after the clock stepped
back, forged lease ids, and shadow rules' allowed count."""

from __future__ import annotations

import json
import random

import pytest
import redis

from wire import wait_until

RULE_DOC = {"match": {"resource": "GET /*"}, "capacity": 1000, "refill_per_second": 1}


def rule(c, rule_id, doc):
    assert c.execute_command("CL.RULE", "SET", rule_id, json.dumps(doc)) in (b"OK", "OK")


def info(c, section):
    return c.info(section)


# ---- the match cache ----------------------------------------------------------------

def test_match_cache_memory_stays_within_its_setting(make_server):
    """2,000 distinct 60 KB resources used to keep 120 MB for good (every
    resource's bytes were cache keys); now the cache holds digests of long
    resources, within rules-cache-size, and RSS stays near where it was."""
    s = make_server("--manual-clock", "--rules-cache-size", "1mb")
    c = s.client(protocol=2)
    rule(c, "r", RULE_DOC)
    rss_before = s.rss_bytes()
    p = c.pipeline(transaction=False)
    for i in range(2000):
        p.execute_command("CL.LIMIT", "c", b"GET /%d" % i + b"y" * 60_000, "COST", 0)
        if i % 10 == 9:
            assert all(reply[0] == 1 for reply in p.execute())
    grown = s.rss_bytes() - rss_before
    memory = info(c, "memory")
    assert 0 < memory["rules_cache_bytes"] <= memory["rules_cache_max_bytes"] == 1024 * 1024
    assert memory["rules_cache_entries"] > 0
    assert grown < 60 * 1024 * 1024, f"RSS grew by {grown >> 20} MB"
    stats = info(c, "stats")
    assert stats["rules_cache_misses"] == 2000


def test_a_resource_no_bucket_key_could_hold_is_refused_before_matching(make_server):
    s = make_server("--manual-clock")
    c = s.client(protocol=2)
    rule(c, "r", RULE_DOC)
    for resource, tier in ((b"y" * 65_536, b"t"), (b"GET /x", b"t" * 65_536)):
        with pytest.raises(redis.ResponseError, match="at most 65535 bytes"):
            c.execute_command("CL.LIMIT", "c", resource, "TIER", tier)
    assert info(c, "stats")["rules_cache_misses"] == 0     # refused before matching
    assert c.execute_command("CL.LIMIT", "c", b"y" * 65_535)[0] == 1


def test_match_cache_hits_and_a_full_cache_keep_the_entries_in_use(make_server):
    s = make_server("--manual-clock", "--rules-cache-size", "64kb")
    c = s.client(protocol=2)
    rule(c, "r", RULE_DOC)
    for i in range(2000):                     # far more than 64 KB of entries
        c.execute_command("CL.LIMIT", "c", "GET /hot", "COST", 0)
        c.execute_command("CL.LIMIT", "c", f"GET /cold/{i}", "COST", 0)
    stats, memory = info(c, "stats"), info(c, "memory")
    assert memory["rules_cache_bytes"] <= 64 * 1024
    assert stats["rules_cache_misses"] == 2001       # the hot one missed once
    assert stats["rules_cache_hits"] == 1999


def test_cached_and_uncached_matching_agree(make_server):
    """The same requests on a server with the cache and one without:
    identical replies, for short and long resources, with and without
    tiers, across rule changes."""
    servers = [make_server("--manual-clock"), make_server("--manual-clock",
                                                          "--rules-cache-size", "0")]
    clients = [s.client(protocol=2) for s in servers]
    docs = {"get": {"match": {"resource": "GET /*"}, "capacity": 5, "refill_per_second": 1},
            "free": {"match": {"resource": "GET /*", "tier": "free"}, "capacity": 2,
                     "refill_per_second": 1},
            "long": {"match": {"resource": "POST /" + "p" * 300 + "*"}, "capacity": 3,
                     "refill_per_second": 1, "key": "client+resource"}}
    rng = random.Random(9)
    resources = ["GET /a", "GET /" + "b" * 500, "POST /" + "p" * 300 + "x",
                 "POST /" + "p" * 300 + "y" * 400, "PUT /c"]
    replies = [[], []]
    for step in range(400):
        if step % 100 == 0:
            name = rng.choice(list(docs))
            for c in clients:
                rule(c, name, docs[name])
        args = ["CL.LIMIT", rng.choice(["u1", "u2"]), rng.choice(resources)]
        if rng.random() < 0.5:
            args += ["TIER", rng.choice(["free", "pro", "f" * 400])]
        for c, out in zip(clients, replies):
            c.execute_command("DEBUG", "CLOCK", "SET", step * 100)
            out.append(c.execute_command(*args))
    assert replies[0] == replies[1]
    assert info(clients[0], "memory")["rules_cache_entries"] > 0
    assert info(clients[1], "memory")["rules_cache_entries"] == 0


def test_rules_cache_size_is_a_setting(make_server):
    s = make_server("--manual-clock")
    c = s.client(protocol=2)
    assert c.config_get("rules-cache-size") == {"rules-cache-size": str(16 * 1024**2)}
    assert c.config_set("rules-cache-size", "2mb")
    assert info(c, "memory")["rules_cache_max_bytes"] == 2 * 1024**2


# ---- a peek reads, and never writes ---------------------------------------------------

T0 = 200_000_000


def run_changed_parameters(c, key, first, later, touch, sweep):
    """Spends under `first`, optionally peeks under `later` just before the
    old expiry and/or sweeps, then peeks under `later` at +1000 ms."""
    c.execute_command("DEBUG", "CLOCK", "SET", T0)
    c.execute_command("CL.CHECK", key, *first)
    if touch:
        c.execute_command("DEBUG", "CLOCK", "SET", T0 + 990)
        c.execute_command("CL.CHECK", key, *later, "COST", 0)
    c.execute_command("DEBUG", "CLOCK", "SET", T0 + 1000)
    if sweep:
        c.execute_command("DEBUG", "SWEEP")
    return c.execute_command("CL.CHECK", key, *later, "COST", 0)


@pytest.mark.parametrize("first,later", [((10, 10, "COST", 10), (10, 1)),    # slower refill
                                         ((1, 1), (1000, 1))])               # larger capacity
def test_a_bucket_read_under_new_parameters_does_not_depend_on_a_peek(r, first, later):
    """The expiry is the time the bucket is full under the parameters of
    the call that wrote it; a peek under other parameters used to move it,
    so the same read gave 1 token or a full bucket depending on whether
    someone had peeked.  Now every path gives the same answer, swept or
    not."""
    answers = {(touch, sweep): run_changed_parameters(r, f"pk-{touch}-{sweep}", first,
                                                       later, touch, sweep)
               for touch in (False, True) for sweep in (False, True)}
    assert len(set(map(tuple, answers.values()))) == 1, answers
    assert answers[(False, False)][:3] == [1, later[0], later[0]]   # expired: full


def test_a_peek_stores_nothing(r):
    r.execute_command("CL.CHECK", "k", 10, 1, "COST", 4)
    assert r.dbsize() == 1
    r.execute_command("DEBUG", "CLOCK", "SET", 10_000)        # full again, not swept
    assert r.execute_command("CL.CHECK", "k", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]
    assert r.execute_command("CL.CHECK", "other", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]
    assert r.dbsize() == 1
    # k is full: the sweep may take it at any tick from here
    r.execute_command("CL.RESET", "k")
    rule(r, "peek", {"match": {"resource": "PEEK /*"}, "algorithm": "gcra", "burst": 3,
                     "count": 1, "period_ms": 1000})
    try:
        r.execute_command("CL.LIMIT", "c", "PEEK /x", "COST", 0)
        assert r.dbsize() == 0
        r.execute_command("CL.LIMIT", "c", "PEEK /x")
        assert r.dbsize() == 1
    finally:
        r.execute_command("CL.RULE", "DEL", "peek")


def test_a_peek_on_a_replica_writes_nothing(make_server):
    """A replica answers COST 0 peeks; it used to store the refilled state
    (a write on a read-only server), which a clock that then stepped back
    could see: 9 tokens instead of the 8 the primary's state gives."""
    primary = make_server("--manual-clock")
    replica = make_server("--manual-clock", "--replicaof", "127.0.0.1", str(primary.port))
    p, c = primary.client(protocol=2), replica.client(protocol=2)
    rule(p, "r", {"match": {"resource": "GET /*"}, "capacity": 10, "refill_per_second": 1})
    wait_until(lambda: c.info("replication").get("master_link_status") == "up")
    assert p.execute_command("CL.LIMIT", "u", "GET /x", "COST", 3)[:3] == [1, 10, 7]
    wait_until(lambda: c.dbsize() == 1)
    c.execute_command("DEBUG", "CLOCK", "SET", 2000)
    assert c.execute_command("CL.LIMIT", "u", "GET /x", "COST", 0)[:3] == [1, 10, 9]
    c.execute_command("DEBUG", "CLOCK", "SET", 1000)
    assert c.execute_command("CL.LIMIT", "u", "GET /x", "COST", 0)[:3] == [1, 10, 8]
    assert c.execute_command("CL.CHECK", "k", 5, 1, "COST", 0) == [1, 5, 5, 0, 0]
    assert c.dbsize() == 1


# ---- GCRA after the clock stepped back ----------------------------------------------

def test_a_gcra_peek_is_allowed_after_the_clock_steps_back(r):
    rule(r, "g", {"match": {"resource": "G /*"}, "algorithm": "gcra", "burst": 1,
                  "count": 1, "period_ms": 1000})
    try:
        r.execute_command("DEBUG", "CLOCK", "SET", 3_000_000)
        assert r.execute_command("CL.LIMIT", "c", "G /", "COST", 2)[0] == 1
        r.execute_command("DEBUG", "CLOCK", "SET", 1_000_000)       # 2000 s back
        peek = r.execute_command("CL.LIMIT", "c", "G /", "COST", 0)
        assert peek[:4] == [1, 2, 0, 0]          # allowed, nothing remaining
        assert peek[4] == 2_002_000              # full again when the clock is back
        assert r.execute_command("CL.LIMIT", "c", "G /")[0] == 0    # no capacity freed
    finally:
        r.execute_command("CL.RULE", "DEL", "g")


# ---- leases and stats ---------------------------------------------------------------

def test_a_forged_lease_id_above_48_bits_frees_nothing(r):
    rule(r, "conc", {"algorithm": "concurrency", "limit": 2, "lease_ms": 60000})
    try:
        lease_id = r.execute_command("CL.ACQUIRE", "conc", "bob")[4]
        for forged in (lease_id + 2**48, lease_id | 1 << 62, lease_id - 2**63):
            assert r.execute_command("CL.RELEASE", "conc", "bob", forged) == 0
        assert r.execute_command("CL.RELEASE", "conc", "bob", lease_id) == 1
    finally:
        r.execute_command("CL.RULE", "DEL", "conc")


def test_shadow_rules_count_what_they_would_allow(r):
    rule(r, "sh", {"match": {"resource": "SH /*"}, "capacity": 1, "refill_per_second": 1,
                   "mode": "shadow"})
    try:
        for _ in range(6):
            r.execute_command("CL.LIMIT", "c", "SH /")
        stats = r.execute_command("CL.RULE", "STATS", "sh")
        stats = dict(zip(stats[::2], stats[1::2])) if isinstance(stats, list) else stats
        stats = {k.decode() if isinstance(k, bytes) else k: v for k, v in stats.items()}
        assert stats == {"allowed": 1, "denied": 0, "shadow_denied": 5}
    finally:
        r.execute_command("CL.RULE", "DEL", "sh")
