"""Overload through a real server: the PRIORITY option and its errors, the
level -> action table (DEBUG SHED-LEVEL injects the level, as Envoy's
tests inject pressure with a fake resource monitor), a rule's priority and
failure policy, an ACL user's priority as default and ceiling, the HTTP
check endpoints, the counts in INFO, reading order's held-back
connections keeping their replies in order, and the meter raising the
level by itself under a real load and lowering it after."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
import redis
from http_calls import set_rule
from readme import readme_console, run_redis_cli, shown_lines
from wire import Wire, command, wait_until

SHED = -2        # remaining in a shed check's reply


def check(c, key, *options, capacity=10, refill=1):
    return c.execute_command("CL.CHECK", key, capacity, refill, *options)


def info(c, section="shedding") -> dict:
    return c.info(section)


def force(c, level) -> None:
    assert c.execute_command("DEBUG", "SHED-LEVEL", level) == b"OK"


@pytest.fixture
def rs(r):
    """r, with the level given back to the meter and no rule left after
    the test."""
    yield r
    force(r, "AUTO")
    for rule_id in ("a", "b"):
        r.execute_command("CL.RULE", "DEL", rule_id)


# ---- the level -> action table ---------------------------------------------------------

@pytest.mark.parametrize("level, priority, shed", [
    (0, "low", False), (0, "normal", False), (0, "critical", False),
    (1, "low", True), (1, "normal", False), (1, "critical", False),
    (2, "low", True), (2, "normal", True), (2, "critical", False),
    (2, None, True),            # normal by default
    (1, "LOW", True),           # names in any case
    (2, "Critical", False),
])
def test_the_level_sheds_the_priorities_below_it(rs, level, priority, shed):
    force(rs, level)
    options = ("PRIORITY", priority) if priority else ()
    reply = check(rs, "k", *options)
    if shed:
        # allowed (CL.CHECK fails open), not counted: the bucket is untouched
        assert reply == [1, 10, SHED, 0, 0]
        force(rs, 0)
        assert check(rs, "k", "COST", 0) == [1, 10, 10, 0, 0]
    else:
        assert reply == [1, 10, 9, 0, 1000]


def shed_counts(c) -> tuple[int, int]:
    stats = info(c, "stats")
    return stats["shed_checks_low"], stats["shed_checks_normal"]


def test_shed_checks_are_counted_by_priority(rs):
    low, normal = shed_counts(rs)
    force(rs, 2)
    for priority, n in (("low", 3), ("normal", 2), ("critical", 4)):
        for _ in range(n):
            check(rs, "k", "PRIORITY", priority)
    assert shed_counts(rs) == (low + 3, normal + 2)
    section = info(rs)
    assert section["shed_level"] == 2 and section["shed_level_forced"] == 1
    assert section["shed_level_name"] == "low+normal"
    # critical checks are never shed: they spent from the bucket
    assert section["shed_checks_critical"] == {"allowed": 0, "denied": 0}
    force(rs, 0)
    assert check(rs, "k", "COST", 0)[2] == 6


@pytest.mark.parametrize("args, error", [
    (("PRIORITY", "urgent"), "PRIORITY must be low, normal or critical"),
    (("PRIORITY", ""), "PRIORITY must be low, normal or critical"),
    (("PRIORITY", "2"), "PRIORITY must be low, normal or critical"),
    (("PRIORITY",), "syntax error: option 'PRIORITY' needs a value"),
])
def test_priority_errors(rs, args, error):
    for name in (("CL.CHECK", "k", 10, 1), ("CL.LIMIT", "c", "r")):
        with pytest.raises(redis.ResponseError) as e:
            rs.execute_command(*name, *args)
        assert str(e.value) == error


def test_a_bad_check_is_an_error_even_when_it_would_be_shed(rs):
    force(rs, 2)
    with pytest.raises(redis.ResponseError, match="capacity"):
        rs.execute_command("CL.CHECK", "k", 0, 1, "PRIORITY", "low")


# ---- rules: their priority and failure policy ------------------------------------------

def rule(priority=None, on_failure="open", **match):
    doc = {"match": match or {"resource": "GET /a"}, "algorithm": "token_bucket",
           "capacity": 5, "refill_per_second": 1, "on_failure": on_failure}
    if priority:
        doc["priority"] = priority
    return doc


@pytest.mark.parametrize("rule_priority, on_failure, asked, reply", [
    # the rule's priority when the request names none
    (None, "open", None, [1, -1, SHED, 0, 0]),
    ("critical", "open", None, [1, 5, 4, 0, 1000]),
    ("low", "open", None, [1, -1, SHED, 0, 0]),
    # what the request asks wins over the rule's
    ("critical", "open", "low", [1, -1, SHED, 0, 0]),
    ("low", "open", "critical", [1, 5, 4, 0, 1000]),
    # a rule that fails closed denies a shed check
    (None, "closed", None, [0, -1, SHED, 1000, 0]),
])
def test_cl_limit_sheds_by_the_rules(rs, rule_priority, on_failure, asked, reply):
    set_rule(rs, "a", rule(rule_priority, on_failure))
    force(rs, 2)
    options = ("PRIORITY", asked) if asked else ()
    assert rs.execute_command("CL.LIMIT", "u1", "GET /a", *options) == reply


@pytest.mark.parametrize("options, reply", [
    ((), [1, -1, SHED, 0, 0]),                                 # the rule's: low
    (("PRIORITY", "critical"), [1, 5, 4, 0, 1000]),
    (("PRIORITY", "LOW", "DETAIL"), [1, -1, SHED, 0, 0, []]),
])
def test_cl_apply_sheds_as_cl_limit(rs, options, reply):
    set_rule(rs, "a", rule("low"))
    force(rs, 1)
    assert rs.execute_command("CL.APPLY", "a", "u1", *options) == reply


def test_cl_apply_priority_errors(rs):
    set_rule(rs, "a", rule())
    with pytest.raises(redis.ResponseError, match="PRIORITY must be low, normal or critical"):
        rs.execute_command("CL.APPLY", "a", "u1", "PRIORITY", "urgent")
    # a rule CL.APPLY cannot check is the same error whether the node sheds or not
    set_rule(rs, "b", {"algorithm": "concurrency", "limit": 2, "lease_ms": 1000})
    for level in (0, 1):
        force(rs, level)
        with pytest.raises(redis.ResponseError, match="a concurrency rule is used with"):
            rs.execute_command("CL.APPLY", "a,b", "u1", "PRIORITY", "low")


def test_a_shed_cl_limit_with_detail_names_no_rule(rs):
    set_rule(rs, "a", rule())
    force(rs, 1)
    assert rs.execute_command("CL.LIMIT", "u1", "GET /a", "DETAIL", "PRIORITY", "low") == \
        [1, -1, SHED, 0, 0, []]


def test_a_rule_priority_round_trips_and_is_checked(rs):
    set_rule(rs, "a", rule("critical"))
    assert b'"priority":"critical"' in rs.execute_command("CL.RULE", "GET", "a")
    with pytest.raises(redis.ResponseError, match="priority"):
        set_rule(rs, "b", rule("urgent"))


# ---- ACL: a user's priority is its default and its ceiling ------------------------------

def test_a_users_priority_is_its_checks_default_and_ceiling(server, rs):
    rs.execute_command("ACL", "SETUSER", "batch", "on", "nopass", "+@all", "~*",
                       "priority:low")
    try:
        assert "priority:low" in " ".join(x.decode() for x in rs.execute_command("ACL", "LIST"))
        batch = server.client(protocol=2, username="batch", password="x")
        force(rs, 1)
        assert check(batch, "k")[2] == SHED                           # its default
        assert check(batch, "k", "PRIORITY", "critical")[2] == SHED   # capped at low
        assert check(rs, "k", "PRIORITY", "low")[2] == SHED
        assert check(rs, "k")[2] == 9                                 # the default user: normal
        # a change of the user applies to its open connection at once
        rs.execute_command("ACL", "SETUSER", "batch", "resetpriority")
        assert check(batch, "k", "PRIORITY", "critical")[2] == 8
        with pytest.raises(redis.ResponseError, match="Syntax error"):
            rs.execute_command("ACL", "SETUSER", "batch", "priority:urgent")
        batch.close()
    finally:
        rs.execute_command("ACL", "DELUSER", "batch")


# ---- HTTP ---------------------------------------------------------------------------------

def test_http_checks_carry_a_priority_and_say_they_were_shed(hs):
    c = hs.client(protocol=2)
    force(c, 1)
    bucket = {"key": "k", "capacity": 10, "refill_per_sec": 1}
    status, headers, doc = hs.post("/v1/check/bucket", {**bucket, "priority": "low"})
    assert status == 200 and doc["shed"] is True and doc["remaining"] == SHED
    assert headers["x-fastlimit-shed"] == "1"
    status, headers, doc = hs.post("/v1/check/bucket", bucket)
    assert status == 200 and "shed" not in doc and doc["remaining"] == 9
    assert "x-fastlimit-shed" not in headers
    status, _, doc = hs.post("/v1/check/bucket", {**bucket, "priority": "urgent"})
    assert status == 400 and "priority" in str(doc)
    # a rule that fails closed: 429, Retry-After, and the shed header
    set_rule(c, "a", rule(on_failure="closed"))
    status, headers, doc = hs.post("/v1/check?enforce=true", {
        "client_key": "u", "resource": "GET /a", "priority": "low"})
    assert (status, doc["allowed"], doc["shed"]) == (429, False, True), doc
    assert headers["retry-after"] == "1" and headers["x-fastlimit-shed"] == "1"
    # /v1/limits/check: the rules by id, as CL.APPLY
    status, headers, doc = hs.post("/v1/limits/check", {"rule_id": "a", "key": "u",
                                                        "priority": "low"})
    assert (status, doc["allowed"], doc["shed"]) == (200, False, True), doc
    assert shed_counts(c) == (3, 0)
    c.close()


# ---- reading order ---------------------------------------------------------------------------

def test_held_back_connections_keep_their_replies_in_order(rs, server):
    """While saturated a normal connection's reads wait behind critical
    ones; everything it sent is still answered, in order."""
    force(rs, 1)
    before = info(rs)["shed_deferred_reads"]
    n = 3000
    with Wire.to(server.port) as w:
        w.send(b"".join(command("ECHO", i) for i in range(n)))
        replies = [w.read_reply() for _ in range(n)]
    assert replies == [b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(n)]
    assert info(rs)["shed_deferred_reads"] > before


def test_a_critical_connection_is_not_held_back(rs, server):
    force(rs, 1)
    crit = server.client(protocol=2)
    check(crit, "c", "PRIORITY", "critical")      # from now on it reads as critical
    before = info(rs)["shed_deferred_reads"]
    for _ in range(20):
        check(crit, "c", "PRIORITY", "critical")
    # the INFO calls on rs (a normal connection) are the only ones held back
    assert info(rs)["shed_deferred_reads"] - before <= 2
    crit.close()


# ---- the meter, on a real load ---------------------------------------------------------------

@pytest.mark.untraced
def test_the_meter_raises_the_level_under_load_and_lowers_it_after(make_server):
    """Real time: at a threshold of 20% busy a pipelining redis-benchmark
    saturates the node, and an idle one (polled by INFO) does not; the
    level goes back to 0 within the hold (100 ms) plus a window once the
    load stops."""
    s = make_server("--shed-threshold", "20")
    c = s.client(protocol=2)
    load = subprocess.Popen(
        ["redis-benchmark", "-p", str(s.port), "-c", "10", "-P", "16", "-n", "20000000", "-q",
         "CL.CHECK", "k", "100", "100", "PRIORITY", "low"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: c.info("shedding")["shed_level"] >= 1, 10, "the level to rise",
                   interval=0.01)
    finally:
        load.kill()
        load.wait(10)
    deadline = time.monotonic() + 10
    while c.info("shedding")["shed_level"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert c.info("shedding")["shed_level"] == 0
    assert c.info("stats")["shed_checks_low"] > 0
    # off: the level stays 0 whatever the load
    c.config_set("shed-threshold", 0)
    assert c.info("shedding")["shed_level"] == 0
    c.close()


# ---- the README's example ---------------------------------------------------------------------

def test_the_readmes_example_runs_as_written(rs, server):
    for words, shown in readme_console("## Overload: priorities and shedding"):
        out = run_redis_cli(words, server.port)
        if shown:
            assert out.splitlines() == shown_lines(shown), words
        if words[3:5] == ["INFO", "shedding"]:
            assert "shed_level:1" in out
            assert int(re.search(r"shed_checks_low:allowed=(\d+)", out).group(1)) >= 1
