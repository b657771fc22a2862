"""CL.LIMIT and the other rule-based checks through a real server.

Named rules (CL.RULE SET) checked with CL.LIMIT over the wire in RESP2
and RESP3: which rule binds the reply, the DETAIL breakdown, matching by
tier, resource glob and client glob, COST, the reply when nothing
matches and the argument errors.  Then the all-or-nothing promise (a
deny by one rule leaves the others' tokens untouched, also under many
concurrent connections), shadow rules with their counters and denial
sample, rule changes taking effect on the next check, checks by rule id
(CL.APPLY), the concurrency limiter's leases (CL.ACQUIRE, CL.RELEASE),
redis-cell's CL.THROTTLE, and a pipeline that mixes checks with rule
changes.

The shared manual-clock server (`server`, `r`) keeps its rules across
tests (FLUSHALL only empties buckets), so every rule a test sets goes
through the `rules` fixture, which deletes it afterwards.  Tests that
read the server-wide denial sample start a server of their own.
"""

from __future__ import annotations

import json
import threading

import pytest
import redis

from wire import Wire, command

NO_RULE = [1, -1, -1, 0, 0]     # allowed, and no enforcing rule limits it


# ---- helpers -----------------------------------------------------------------------

def text(value):
    """A reply with every bulk string decoded, so RESP2 and RESP3 replies
    (and hiredis or not) compare alike."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, (list, tuple)):
        return [text(v) for v in value]
    if isinstance(value, dict):
        return {text(k): text(v) for k, v in value.items()}
    return value


def rule_doc(doc=None, *, resource=None, tier=None, client=None, **fields) -> dict:
    """Any rule document: `fields` are the algorithm's, `match` is built
    from resource, tier and client."""
    match = {k: v for k, v in (("resource", resource), ("tier", tier), ("client", client))
             if v is not None}
    return {"match": match, **(doc or {}), **fields}


def tb(capacity, rate=1, **kw) -> dict:
    """A token-bucket rule document: capacity tokens, rate per second."""
    return rule_doc({"algorithm": "token_bucket", "capacity": capacity,
                     "refill_per_second": rate}, **kw)


def limit(c, client, resource, *options):
    return text(c.execute_command("CL.LIMIT", client, resource, *options))


def apply(c, ids, client, *options):
    return text(c.execute_command("CL.APPLY", ids, client, *options))


def stats(c, rule_id) -> dict:
    reply = text(c.execute_command("CL.RULE", "STATS", rule_id))
    if isinstance(reply, list):            # RESP2: a flat array of pairs
        reply = dict(zip(reply[::2], reply[1::2]))
    return reply


def clock(c, ms):
    c.execute_command("DEBUG", "CLOCK", "SET", ms)


def detail_ids(reply) -> list[str]:
    return [row[0] for row in reply[5]]


def error_of(c, *args) -> str:
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command(*args)
    return str(e.value)


class Rules:
    """Sets rules on a server and deletes them again at teardown."""

    def __init__(self, client):
        self.client = client
        self.ids: list[str] = []

    def set(self, rule_id: str, doc: dict) -> None:
        reply = self.client.execute_command("CL.RULE", "SET", rule_id, json.dumps(doc))
        assert reply in (b"OK", "OK", True), reply
        if rule_id not in self.ids:
            self.ids.append(rule_id)

    def delete(self, rule_id: str) -> int:
        return self.client.execute_command("CL.RULE", "DEL", rule_id)

    def cleanup(self) -> None:
        for rule_id in self.ids:
            self.client.execute_command("CL.RULE", "DEL", rule_id)


@pytest.fixture
def rules(server, r):
    """Rules on the shared server, deleted after the test (FLUSHALL does
    not delete rules)."""
    admin = server.client(protocol=2)
    rs = Rules(admin)
    yield rs
    rs.cleanup()
    leftover = admin.execute_command("CL.RULE", "LIST")
    admin.close()
    assert leftover == [], f"rules left on the shared server: {leftover}"


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
def c(server, r, request):
    """A redis-py client of the parametrized protocol on the flushed
    shared server (r has flushed it and set the clock to 0)."""
    client = server.client(protocol=request.param)
    yield client
    client.close()


@pytest.fixture
def fresh(make_server):
    """A server of its own (empty denial sample, no rules of other
    tests), with a RESP2 client and a Rules helper."""
    s = make_server("--manual-clock")
    client = s.client(protocol=2)
    yield s, client, Rules(client)
    client.close()


# ---- CL.LIMIT: replies ------------------------------------------------------------

def test_no_matching_rule(c, rules):
    assert limit(c, "nm-user", "NOMATCH /x") == NO_RULE
    assert limit(c, "nm-user", "NOMATCH /x", "COST", 10**15) == NO_RULE
    assert limit(c, "nm-user", "NOMATCH /x", "TIER", "free", "DETAIL") == [*NO_RULE, []]
    # a concurrency rule is never checked by CL.LIMIT (leases are explicit)
    rules.set("nm-leases", rule_doc({"algorithm": "concurrency", "limit": 1, "lease_ms": 100},
                                    resource="NOMATCH /*"))
    assert limit(c, "nm-user", "NOMATCH /x", "DETAIL") == [*NO_RULE, []]
    # only a shadow rule matches: nothing limits, but the row is there
    rules.set("nm-shadow", tb(1, resource="NOMATCH /*", mode="shadow"))
    assert limit(c, "nm-user", "NOMATCH /x", "DETAIL") == [
        *NO_RULE, [["nm-shadow", "shadow", 1, 0, 0, 1000]]]
    assert limit(c, "nm-user", "NOMATCH /x", "DETAIL") == [
        *NO_RULE, [["nm-shadow", "shadow", 0, 0, 1000, 1000]]]


# Two rules on one resource; a sequence of (cost, reply) at clock 0.
# bind-a: 3 tokens, 1 per second; bind-b: 4 tokens, 1 per 10 s.
BINDING_STEPS = [
    (1, [1, 3, 2, 0, 1000]),        # allowed: a has fewer remaining (2 < 3)
    (1, [1, 3, 1, 0, 2000]),
    (1, [1, 3, 0, 0, 3000]),        # a 0, b 1
    (1, [0, 3, 0, 1000, 3000]),     # denied by a only (b would allow)
    (2, [0, 4, 1, 10000, 30000]),   # both deny: b waits longer (10 s > 2 s)
    (4, [0, 3, 0, -1, 3000]),       # a can never pass 4 (-1 is the longest wait)
    (0, [1, 3, 0, 0, 3000]),        # nothing was spent by the denials
]


def test_binding_rule(c, rules):
    rules.set("bind-a", tb(3, 1, resource="BIND /x"))
    rules.set("bind-b", {"match": {"resource": "BIND /x"}, "capacity": 4, "refill": 1,
                         "period_ms": 10000})
    got = [limit(c, "bind-user", "BIND /x", "COST", cost) for cost, _ in BINDING_STEPS]
    assert got == [reply for _, reply in BINDING_STEPS]
    assert limit(c, "bind-user", "BIND /x", "COST", 0, "DETAIL") == [
        1, 3, 0, 0, 3000,
        [["bind-a", "enforce", 1, 0, 0, 3000], ["bind-b", "enforce", 1, 1, 0, 30000]]]


def test_binding_rule_ties_go_to_the_first_rule_by_id(c, rules):
    rules.set("tie-b", tb(2, 1, resource="TIE /x"))
    rules.set("tie-a", tb(2, 2, resource="TIE /x"))
    # equal remaining: the first in id order (tie-a, refilling at 2/s)
    assert limit(c, "tie-user", "TIE /x") == [1, 2, 1, 0, 500]
    # both can never pass 3: equal -1 waits, the first by id binds
    assert limit(c, "tie-user", "TIE /x", "COST", 3) == [0, 2, 1, -1, 500]


def test_detail_bytes_on_the_wire(server, r, rules):
    """The exact frame: five integers then one array of six-element rows
    (rule id and mode as bulk strings), the same in RESP2 and RESP3."""
    rules.set("wire-a", tb(2, 1, resource="WIRE /x"))
    rules.set("wire-b", tb(5, 1, resource="WIRE /*", mode="shadow"))
    expected = (b"*6\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n*2\r\n"
                b"*6\r\n$6\r\nwire-a\r\n$7\r\nenforce\r\n:1\r\n:1\r\n:0\r\n:1000\r\n"
                b"*6\r\n$6\r\nwire-b\r\n$6\r\nshadow\r\n:1\r\n:4\r\n:0\r\n:1000\r\n")
    for proto, client in ((2, "wire-u2"), (3, "wire-u3")):
        with Wire.to(server.port) as w:
            if proto == 3:
                assert w.call("HELLO", 3).startswith(b"%")
            assert w.call("CL.LIMIT", client, "WIRE /x", "DETAIL") == expected
            assert w.call("CL.LIMIT", client, "WIRE /x", "COST", 0) == (
                b"*5\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n")
            assert w.call("CL.LIMIT", client, "WIRE /nothing-enforces") == (
                b"*5\r\n:1\r\n:-1\r\n:-1\r\n:0\r\n:0\r\n")
            assert w.call("CL.LIMIT", client, "OTHER", "DETAIL") == (
                b"*6\r\n:1\r\n:-1\r\n:-1\r\n:0\r\n:0\r\n*0\r\n")


# (tier option, rule ids that apply).  tier-free applies only with TIER
# free exactly; tier-any (no tier) with any tier and with none.
TIER_CASES = [
    (None, ["tier-any"]),
    ("free", ["tier-any", "tier-free"]),
    ("pro", ["tier-any", "tier-pro"]),
    ("FREE", ["tier-any"]),
    ("free ", ["tier-any"]),
    ("", ["tier-any"]),
]


@pytest.mark.parametrize("tier,expected", TIER_CASES)
def test_tier_matching(c, rules, tier, expected):
    rules.set("tier-any", tb(10, resource="TIER /x"))
    rules.set("tier-free", tb(2, resource="TIER /x", tier="free"))
    rules.set("tier-pro", tb(5, resource="TIER /x", tier="pro"))
    options = ["TIER", tier] if tier is not None else []
    reply = limit(c, "tier-user", "TIER /x", *options, "DETAIL")
    assert detail_ids(reply) == expected
    binding = {"tier-any": 10, "tier-free": 2, "tier-pro": 5}
    assert reply[1] == min(binding[i] for i in expected)


# (resource, rule ids that apply).  Globs are fnmatch's, case-sensitive,
# and * crosses '/'.
RESOURCE_CASES = [
    ("GET /products/1", ["g-all", "g-products"]),
    ("GET /products/1/reviews", ["g-all", "g-products"]),
    ("GET /products/", ["g-all", "g-products"]),
    ("GET /products", ["g-all"]),
    ("get /products/1", ["g-all"]),
    ("GET /items/7", ["g-all", "g-item"]),
    ("GET /items/77", ["g-all"]),
    ("POST /v1/orders", ["g-all", "g-exact", "g-version"]),
    ("POST /v2/orders", ["g-all", "g-version"]),
    ("POST /v3/orders", ["g-all"]),
    ("", ["g-all"]),
]


@pytest.mark.parametrize("resource,expected", RESOURCE_CASES)
def test_resource_globs(c, rules, resource, expected):
    rules.set("g-all", tb(100, resource="*"))
    rules.set("g-products", tb(10, resource="GET /products/*"))
    rules.set("g-item", tb(10, resource="GET /items/?"))
    rules.set("g-version", tb(10, resource="POST /v[12]/orders"))
    rules.set("g-exact", tb(10, resource="POST /v1/orders"))
    assert detail_ids(limit(c, "glob-user", resource, "DETAIL")) == expected


# (client key, rule ids that apply)
CLIENT_CASES = [
    ("ip:10.0.0.1", ["cg-any", "cg-net10"]),
    ("ip:10.", ["cg-any", "cg-net10"]),
    ("ip:100.0.0.1", ["cg-any"]),
    ("IP:10.0.0.1", ["cg-any"]),
    ("user:3", ["cg-any", "cg-low-users"]),
    ("user:39", ["cg-any", "cg-low-users"]),
    ("user:5", ["cg-any"]),
    ("user:", ["cg-any"]),
]


@pytest.mark.parametrize("client,expected", CLIENT_CASES)
def test_client_globs(c, rules, client, expected):
    rules.set("cg-any", tb(100, resource="CG /x"))
    rules.set("cg-net10", tb(10, resource="CG /x", client="ip:10.*"))
    rules.set("cg-low-users", tb(10, resource="CG /x", client="user:[0-4]*"))
    assert detail_ids(limit(c, client, "CG /x", "DETAIL")) == expected


def test_client_glob_rules_count_per_client(c, rules):
    rules.set("cgc", tb(2, resource="CGC /x", client="ip:10.*"))
    assert limit(c, "ip:10.0.0.1", "CGC /x") == [1, 2, 1, 0, 1000]
    assert limit(c, "ip:10.0.0.1", "CGC /x") == [1, 2, 0, 0, 2000]
    assert limit(c, "ip:10.0.0.1", "CGC /x") == [0, 2, 0, 1000, 2000]
    assert limit(c, "ip:10.0.0.2", "CGC /x") == [1, 2, 1, 0, 1000]    # its own bucket
    assert limit(c, "ip:11.0.0.1", "CGC /x") == NO_RULE


def test_key_scope_client_and_client_plus_resource(c, rules):
    rules.set("scope-client", tb(3, resource="SCOPE /*"))
    rules.set("scope-both", tb(2, resource="SCOPE /*", key="client+resource"))
    # client scope: one bucket across resources; client+resource: one per resource
    assert limit(c, "sc", "SCOPE /a", "DETAIL")[5] == [
        ["scope-both", "enforce", 1, 1, 0, 1000], ["scope-client", "enforce", 1, 2, 0, 1000]]
    assert limit(c, "sc", "SCOPE /b", "DETAIL")[5] == [
        ["scope-both", "enforce", 1, 1, 0, 1000], ["scope-client", "enforce", 1, 1, 0, 2000]]
    assert limit(c, "sc", "SCOPE /a", "DETAIL")[5] == [
        ["scope-both", "enforce", 1, 0, 0, 2000], ["scope-client", "enforce", 1, 0, 0, 3000]]
    assert limit(c, "sc", "SCOPE /c") == [0, 3, 0, 1000, 3000]


def test_cost(c, rules):
    rules.set("cost", tb(10, 2, resource="COST /x"))
    # COST 0 reports without spending, however often
    for _ in range(3):
        assert limit(c, "cost-user", "COST /x", "COST", 0) == [1, 10, 10, 0, 0]
    assert limit(c, "cost-user", "COST /x", "COST", 4) == [1, 10, 6, 0, 2000]
    assert limit(c, "cost-user", "COST /x", "COST", 0) == [1, 10, 6, 0, 2000]
    # more than is there: the wait for the missing 3 tokens at 2/s
    assert limit(c, "cost-user", "COST /x", "COST", 9) == [0, 10, 6, 1500, 2000]
    # more than the capacity: it can never pass
    assert limit(c, "cost-user", "COST /x", "COST", 11) == [0, 10, 6, -1, 2000]
    assert limit(c, "cost-user", "COST /x", "COST", 10**15) == [0, 10, 6, -1, 2000]
    assert limit(c, "cost-user", "COST /x", "COST", 6) == [1, 10, 0, 0, 5000]
    assert limit(c, "cost-user", "COST /x", "COST", 0) == [1, 10, 0, 0, 5000]
    clock(c, 5000)
    assert limit(c, "cost-user", "COST /x", "COST", 10) == [1, 10, 0, 0, 5000]
    assert stats(c, "cost") == {"allowed": 8, "denied": 3, "shadow_denied": 0}


def test_options_in_any_order_and_any_case(c, rules):
    rules.set("opt", tb(5, resource="OPT /x", tier="gold"))
    assert limit(c, "opt-u", "OPT /x", "detail", "cost", 2, "tier", "gold") == [
        1, 5, 3, 0, 2000, [["opt", "enforce", 1, 3, 0, 2000]]]
    assert limit(c, "opt-u", "OPT /x", "Cost", 0, "DeTaIl", "TiEr", "gold") == [
        1, 5, 3, 0, 2000, [["opt", "enforce", 1, 3, 0, 2000]]]
    # the last TIER given wins
    assert limit(c, "opt-u", "OPT /x", "TIER", "gold", "TIER", "lead") == NO_RULE


# (arguments after CL.LIMIT, the exact error line)
ARGUMENT_ERRORS = [
    (["u", "ERR /x", "FOO", "1"],
     b"-ERR syntax error: unknown option 'FOO', expected TIER, COST, DETAIL or PRIORITY\r\n"),
    (["u", "ERR /x", "DETAIL", "NOPE", "2"],
     b"-ERR syntax error: unknown option 'NOPE', expected TIER, COST, DETAIL or PRIORITY\r\n"),
    (["u", "ERR /x", "COST"], b"-ERR syntax error: option 'COST' needs a value\r\n"),
    (["u", "ERR /x", "TIER"], b"-ERR syntax error: option 'TIER' needs a value\r\n"),
    (["u", "ERR /x", "COST", "1", "TIER"],
     b"-ERR syntax error: option 'TIER' needs a value\r\n"),
    (["u", "ERR /x", "FOO"], b"-ERR syntax error: option 'FOO' needs a value\r\n"),
    (["u", "ERR /x", "COST", "x"], b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u", "ERR /x", "COST", "1.5"], b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u", "ERR /x", "COST", ""], b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u", "ERR /x", "COST", "-1"], b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u", "ERR /x", "COST", "9223372036854775808"],
     b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u", "ERR /x", "COST", "DETAIL"], b"-ERR COST must be an integer from 0 to 10^15\r\n"),
    (["u"], b"-ERR wrong number of arguments for 'cl.limit' command\r\n"),
    ([], b"-ERR wrong number of arguments for 'cl.limit' command\r\n"),
]


@pytest.mark.parametrize("args,error", ARGUMENT_ERRORS)
def test_argument_errors_leave_the_connection_usable(server, r, rules, args, error):
    rules.set("err", tb(3, resource="ERR /*"))
    with Wire.to(server.port) as w:
        w.send(command("CL.LIMIT", *args) + command("PING") +
               command("CL.LIMIT", "u", "ERR /x", "COST", 0))
        assert w.read_reply() == error
        assert w.read_reply() == b"+PONG\r\n"
        # nothing was spent by the refused command
        assert w.read_reply() == b"*5\r\n:1\r\n:3\r\n:3\r\n:0\r\n:0\r\n"
        assert w.is_open()


def test_redis_py_raises_the_errors_and_goes_on(c, rules):
    rules.set("err-py", tb(3, resource="ERRPY /*"))
    assert error_of(c, "CL.LIMIT", "u", "ERRPY /x", "COST", "abc") == (
        "COST must be an integer from 0 to 10^15")
    assert error_of(c, "CL.LIMIT", "u", "ERRPY /x", "BOGUS", "1") == (
        "syntax error: unknown option 'BOGUS', expected TIER, COST, DETAIL or PRIORITY")
    assert error_of(c, "CL.LIMIT", "u", "ERRPY /x", "TIER") == (
        "syntax error: option 'TIER' needs a value")
    assert limit(c, "u", "ERRPY /x") == [1, 3, 2, 0, 1000]


def test_cost_above_10_15_is_refused_as_by_cl_apply_and_cl_check(c, rules):
    """CL.LIMIT's own error says COST is 0..10^15, and CL.APPLY and
    CL.CHECK refuse 10^15 + 1; CL.LIMIT must not take it either."""
    rules.set("big-cost", tb(3, resource="BIGCOST /x"))
    message = "COST must be an integer from 0 to 10^15"
    assert error_of(c, "CL.APPLY", "big-cost", "u", "COST", 10**15 + 1) == message
    assert error_of(c, "CL.CHECK", "k", 3, 1, "COST", 10**15 + 1) == message
    assert limit(c, "u", "BIGCOST /x", "COST", 10**15) == [0, 3, 3, -1, 0]
    assert error_of(c, "CL.LIMIT", "u", "BIGCOST /x", "COST", 10**15 + 1) == message
    assert error_of(c, "CL.LIMIT", "u", "BIGCOST /x", "COST", 2**63 - 1) == message


def test_client_key_too_long(c, rules):
    rules.set("long", tb(3, resource="LONG /x"))
    # a client-scoped bucket key is a 4-byte rule number and the client key
    assert limit(c, "k" * 65531, "LONG /x") == [1, 3, 2, 0, 1000]
    assert error_of(c, "CL.LIMIT", "k" * 65532, "LONG /x") == (
        "client key and resource are longer than 65535 bytes")
    assert limit(c, "k" * 65532, "NOT LONG /x") == NO_RULE      # no rule, no key
    assert limit(c, "u", "LONG /x") == [1, 3, 2, 0, 1000]


def test_match_cache_keeps_resource_and_tier_apart(c, rules):
    """Matches are cached by (resource, tier).  A resource and a tier that
    run together into the same bytes must still be told apart: rule
    'nul' matches resource 'nul' in any tier, never resource
    'nul\\0Tb'."""
    rules.set("nul", tb(1, resource="nul"))
    assert detail_ids(limit(c, "u1", b"nul", "TIER", b"b\x00N", "DETAIL")) == ["nul"]
    assert detail_ids(limit(c, "u2", b"nul\x00Tb", "DETAIL")) == []
    # and the other way round: a first miss must not hide the rule
    rules.set("nul", tb(2, resource="nul"))               # (clears the cache)
    assert detail_ids(limit(c, "u3", b"nul\x00Tb", "DETAIL")) == []
    assert detail_ids(limit(c, "u4", b"nul", "TIER", b"b\x00N", "DETAIL")) == ["nul"]


def test_cl_limit_in_multi_exec(c, rules):
    """CL.LIMIT is queued by MULTI like CL.CHECK and runs at EXEC."""
    rules.set("multi", tb(2, resource="MULTI /x"))
    p = c.pipeline(transaction=True)
    p.execute_command("CL.LIMIT", "mu", "MULTI /x")
    p.execute_command("CL.LIMIT", "mu", "MULTI /x", "DETAIL")
    p.execute_command("CL.LIMIT", "mu", "MULTI /x")
    assert text(p.execute()) == [
        [1, 2, 1, 0, 1000], [1, 2, 0, 0, 2000, [["multi", "enforce", 1, 0, 0, 2000]]],
        [0, 2, 0, 1000, 2000]]



def test_cl_limit_is_queued_in_multi_and_discard_spends_nothing(server, r, rules):
    rules.set("mq", tb(2, resource="MQ /x"))
    with Wire.to(server.port) as w:
        w.send(command("MULTI") + command("CL.LIMIT", "mq-u", "MQ /x") + command("DISCARD"))
        assert [w.read_reply() for _ in range(3)] == [b"+OK\r\n", b"+QUEUED\r\n",
                                                      b"+OK\r\n"]
        assert w.call("CL.LIMIT", "mq-u", "MQ /x", "COST", 0) == (
            b"*5\r\n:1\r\n:2\r\n:2\r\n:0\r\n:0\r\n")
        w.send(command("MULTI") + command("CL.LIMIT", "mq-u", "MQ /x") +
               command("CL.CHECK", "mq-k", 5, 1) + command("EXEC"))
        assert [w.read_reply() for _ in range(4)] == [
            b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n",
            b"*2\r\n*5\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n"
            b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:1000\r\n"]

# ---- all or nothing ------------------------------------------------------------------

def test_a_deny_leaves_the_other_rules_untouched(c, rules):
    rules.set("atom-small", tb(5, 1, resource="ATOM /x"))
    rules.set("atom-big", tb(100, 10, resource="ATOM /x"))
    for i in range(5):
        assert limit(c, "atom-user", "ATOM /x") == [1, 5, 4 - i, 0, 1000 * (i + 1)]
    for _ in range(10):
        assert limit(c, "atom-user", "ATOM /x", "DETAIL") == [
            0, 5, 0, 1000, 5000,
            [["atom-big", "enforce", 1, 95, 0, 500],
             ["atom-small", "enforce", 0, 0, 1000, 5000]]]
    assert limit(c, "atom-user", "ATOM /x", "COST", 0, "DETAIL") == [
        1, 5, 0, 0, 5000,
        [["atom-big", "enforce", 1, 95, 0, 500], ["atom-small", "enforce", 1, 0, 0, 5000]]]
    assert limit(c, "atom-user", "ATOM /x", "COST", 200, "DETAIL") == [
        0, 100, 95, -1, 500,
        [["atom-big", "enforce", 0, 95, -1, 500], ["atom-small", "enforce", 0, 0, -1, 5000]]]
    assert stats(c, "atom-small") == {"allowed": 6, "denied": 11, "shadow_denied": 0}
    assert stats(c, "atom-big") == {"allowed": 6, "denied": 1, "shadow_denied": 0}
    # big refilled its 5 tokens in 500 ms; small has 1 of its 5 back after 1 s
    clock(c, 1000)
    assert limit(c, "atom-user", "ATOM /x", "DETAIL") == [
        1, 5, 0, 0, 5000,
        [["atom-big", "enforce", 1, 99, 0, 100], ["atom-small", "enforce", 1, 0, 0, 5000]]]


THREADS, PER_THREAD = 40, 50


def test_atomic_under_concurrent_connections(server, c, rules):
    """Clock frozen, 40 connections each sending 50 CL.LIMIT one by one:
    exactly 300 pass, and the big rule lost exactly those 300."""
    rules.set("conc-small", tb(300, 1, resource="CONC /x"))
    rules.set("conc-big", tb(1000, 1, resource="CONC /x"))
    start = threading.Barrier(THREADS)
    allowed = [0] * THREADS
    errors = []

    def worker(i):
        try:
            client = server.client(protocol=2)
            client.ping()
            start.wait(10)
            for _ in range(PER_THREAD):
                reply = client.execute_command("CL.LIMIT", "conc-user", "CONC /x")
                allowed[i] += reply[0]
            client.close()
        except Exception as e:     # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(allowed) == 300
    assert stats(c, "conc-small") == {"allowed": 300, "denied": 1700, "shadow_denied": 0}
    assert stats(c, "conc-big") == {"allowed": 300, "denied": 0, "shadow_denied": 0}
    assert limit(c, "conc-user", "CONC /x", "COST", 0, "DETAIL") == [
        1, 300, 0, 0, 300000,
        [["conc-big", "enforce", 1, 700, 0, 300000],
         ["conc-small", "enforce", 1, 0, 0, 300000]]]


def test_atomic_under_pipelined_connections(server, c, rules):
    """The same with each connection's 50 checks written at once, so the
    server interleaves whole batches of different connections."""
    rules.set("pipe-small", tb(300, 1, resource="PIPEC /x"))
    rules.set("pipe-big", tb(1000, 1, resource="PIPEC /x"))
    batch = command("CL.LIMIT", "pipe-user", "PIPEC /x") * PER_THREAD
    wires = [Wire.to(server.port) for _ in range(THREADS)]
    try:
        for w in wires:
            w.send(batch)
        replies = [w.read_reply() for w in wires for _ in range(PER_THREAD)]
    finally:
        for w in wires:
            w.close()
    assert len(replies) == THREADS * PER_THREAD
    assert sum(reply.startswith(b"*5\r\n:1\r\n") for reply in replies) == 300
    assert sum(reply.startswith(b"*5\r\n:0\r\n") for reply in replies) == 1700
    assert limit(c, "pipe-user", "PIPEC /x", "COST", 0, "DETAIL")[5] == [
        ["pipe-big", "enforce", 1, 700, 0, 300000],
        ["pipe-small", "enforce", 1, 0, 0, 300000]]


# ---- shadow rules -----------------------------------------------------------------

def test_shadow_rules_never_deny_and_are_counted_and_sampled(fresh):
    _, c, rules = fresh
    rules.set("sh-trial", tb(1, 1, resource="SH /x", mode="shadow"))
    rules.set("sh-enforced", tb(3, 1, resource="SH /x"))
    replies = []
    for t in (1, 2, 3, 4):
        clock(c, t)
        replies.append(limit(c, "sh-user", "SH /x", "DETAIL"))
    # the enforcing rule binds (refilling 1 token/s, i.e. 1 milli-token/ms)
    assert [rep[:5] for rep in replies] == [
        [1, 3, 2, 0, 1000], [1, 3, 1, 0, 1999], [1, 3, 0, 0, 2998], [0, 3, 0, 997, 2997]]
    trial_rows = [rep[5][1] for rep in replies]
    assert trial_rows == [["sh-trial", "shadow", 1, 0, 0, 1000],
                          ["sh-trial", "shadow", 0, 0, 999, 999],
                          ["sh-trial", "shadow", 0, 0, 998, 998],
                          ["sh-trial", "shadow", 0, 0, 997, 997]]
    assert stats(c, "sh-trial")["shadow_denied"] == 3
    assert stats(c, "sh-trial")["denied"] == 0
    assert stats(c, "sh-enforced") == {"allowed": 3, "denied": 1, "shadow_denied": 0}
    denials = text(c.execute_command("CL.RULE", "DENIALS"))
    assert sorted(denials[:2]) == [[4, "sh-enforced", "sh-user", 1],
                                   [4, "sh-trial", "sh-user", 1]]
    assert denials[2:] == [[3, "sh-trial", "sh-user", 1], [2, "sh-trial", "sh-user", 1]]
    assert text(c.execute_command("CL.RULE", "DENIALS", 3))[2] == [
        3, "sh-trial", "sh-user", 1]
    # a shadow rule alone never denies, whatever the cost
    rules.delete("sh-enforced")
    assert limit(c, "sh-user", "SH /x", "COST", 50) == NO_RULE
    assert stats(c, "sh-trial")["shadow_denied"] == 4
    # a would-be denial spent nothing: one token back 1 s after the first spend
    clock(c, 1001)
    assert limit(c, "sh-user", "SH /x", "DETAIL")[5] == [["sh-trial", "shadow", 1, 0, 0, 1000]]
    # STATS of every rule, in RESP3 a map
    resp3 = fresh[0].client(protocol=3)
    all_stats = text(resp3.execute_command("CL.RULE", "STATS"))
    resp3.close()
    assert list(all_stats) == ["sh-trial"]
    assert {k: all_stats["sh-trial"][k] for k in ("denied", "shadow_denied")} == {
        "denied": 0, "shadow_denied": 4}


def test_shadow_mode_switch_keeps_the_bucket(c, rules):
    rules.set("sw", tb(2, 1, resource="SW /x"))
    assert limit(c, "sw-u", "SW /x") == [1, 2, 1, 0, 1000]
    assert limit(c, "sw-u", "SW /x") == [1, 2, 0, 0, 2000]
    assert limit(c, "sw-u", "SW /x") == [0, 2, 0, 1000, 2000]
    rules.set("sw", tb(2, 1, resource="SW /x", mode="shadow"))
    assert limit(c, "sw-u", "SW /x", "DETAIL") == [
        *NO_RULE, [["sw", "shadow", 0, 0, 1000, 2000]]]
    rules.set("sw", tb(2, 1, resource="SW /x"))
    assert limit(c, "sw-u", "SW /x") == [0, 2, 0, 1000, 2000]
    assert stats(c, "sw") == {"allowed": 2, "denied": 2, "shadow_denied": 1}


def test_denials_are_newest_first_within_one_millisecond(fresh):
    """CL.RULE DENIALS is documented newest first; denials in the same
    millisecond (common under load, and always with a frozen clock)
    must come newest first too."""
    _, c, rules = fresh
    rules.set("dn", tb(1, 1, resource="DN /x"))
    for client in ("first", "second", "third"):
        limit(c, client, "DN /x")
        limit(c, client, "DN /x")                 # denied
    assert text(c.execute_command("CL.RULE", "DENIALS")) == [
        [0, "dn", "third", 1], [0, "dn", "second", 1], [0, "dn", "first", 1]]
    assert text(c.execute_command("CL.RULE", "DENIALS", 1)) == [[0, "dn", "third", 1]]


# ---- rule changes ---------------------------------------------------------------------

# (capacity before, tokens spent at 0 ms, capacity after, COST 0 reply
# right after the change).  Tokens are kept, capped to the new capacity.
CAPACITY_CHANGES = [
    (10, 8, 20, [1, 20, 2, 0, 18000]),    # raised: 2 tokens, 18 to refill
    (10, 8, 5, [1, 5, 2, 0, 3000]),       # lowered above the tokens: 2 kept
    (10, 2, 5, [1, 5, 5, 0, 0]),          # lowered below the tokens: capped to 5
    (10, 10, 5, [1, 5, 0, 0, 5000]),      # empty stays empty
    (10, 0, 3, [1, 3, 3, 0, 0]),          # never used: full at the new capacity
    (10, 5, 10, [1, 10, 5, 0, 5000]),     # the same numbers: nothing changes
]


@pytest.mark.parametrize("before,spent,after,reply", CAPACITY_CHANGES)
def test_capacity_change_takes_effect_on_the_next_check(c, rules, before, spent, after,
                                                       reply):
    rules.set("cap", tb(before, 1, resource="CAP /x"))
    if spent:
        assert limit(c, "cap-u", "CAP /x", "COST", spent)[0] == 1
    rules.set("cap", tb(after, 1, resource="CAP /x"))
    assert limit(c, "cap-u", "CAP /x", "COST", 0) == reply
    assert limit(c, "cap-u", "CAP /x", "COST", 0) == reply


def test_raised_capacity_refills_to_the_new_capacity(c, rules):
    rules.set("raise", tb(10, 1, resource="RAISE /x"))
    limit(c, "rs", "RAISE /x", "COST", 8)
    rules.set("raise", tb(20, 2, resource="RAISE /x"))      # and a faster refill
    clock(c, 3000)
    assert limit(c, "rs", "RAISE /x", "COST", 0) == [1, 20, 8, 0, 6000]
    clock(c, 6000)
    assert limit(c, "rs", "RAISE /x", "COST", 15) == [0, 20, 14, 500, 3000]
    assert limit(c, "rs", "RAISE /x", "COST", 14) == [1, 20, 0, 0, 10000]


def test_changing_the_match_keeps_the_buckets(c, rules):
    rules.set("mv", tb(3, 1, resource="MV /a"))
    assert limit(c, "mv-u", "MV /a", "COST", 2) == [1, 3, 1, 0, 2000]
    assert limit(c, "mv-u", "MV /b") == NO_RULE
    rules.set("mv", tb(3, 1, resource="MV /*"))
    assert limit(c, "mv-u", "MV /b") == [1, 3, 0, 0, 3000]
    assert limit(c, "mv-u", "MV /a") == [0, 3, 0, 1000, 3000]
    assert limit(c, "mv-u", "MV /b", "TIER", "x") == [0, 3, 0, 1000, 3000]
    rules.set("mv", tb(3, 1, resource="MV /*", tier="gold"))
    assert limit(c, "mv-u", "MV /b") == NO_RULE
    assert limit(c, "mv-u", "MV /b", "TIER", "gold") == [0, 3, 0, 1000, 3000]


def test_deleting_a_rule_drops_its_buckets(c, rules):
    rules.set("gone", tb(3, 1, resource="GONE /x"))
    for remaining in (2, 1, 0):
        assert limit(c, "gone-u", "GONE /x")[:3] == [1, 3, remaining]
    assert limit(c, "gone-u", "GONE /x")[0] == 0
    assert rules.delete("gone") == 1
    assert rules.delete("gone") == 0
    assert limit(c, "gone-u", "GONE /x", "DETAIL") == [*NO_RULE, []]
    assert error_of(c, "CL.APPLY", "gone", "gone-u") == "no such rule 'gone'"
    assert c.execute_command("CL.RULE", "STATS", "gone") is None
    rules.set("gone", tb(3, 1, resource="GONE /x"))        # the same rule: a new, full bucket
    assert limit(c, "gone-u", "GONE /x") == [1, 3, 2, 0, 1000]
    assert stats(c, "gone") == {"allowed": 1, "denied": 0, "shadow_denied": 0}


def test_changing_algorithm_or_key_scope_starts_afresh(c, rules):
    rules.set("alg", tb(3, 1, resource="ALG /x"))
    limit(c, "alg-u", "ALG /x", "COST", 3)
    assert limit(c, "alg-u", "ALG /x")[0] == 0
    rules.set("alg", tb(3, 1, resource="ALG /x", key="client+resource"))
    assert limit(c, "alg-u", "ALG /x") == [1, 3, 2, 0, 1000]
    rules.set("alg", rule_doc({"algorithm": "fixed_window", "limit": 3, "window_ms": 1000},
                              resource="ALG /x"))
    assert limit(c, "alg-u", "ALG /x") == [1, 3, 2, 0, 1000]
    clock(c, 250)
    assert limit(c, "alg-u", "ALG /x", "COST", 2) == [1, 3, 0, 0, 750]
    assert limit(c, "alg-u", "ALG /x") == [0, 3, 0, 750, 750]
    # a lowered window limit caps what was counted
    rules.set("alg", rule_doc({"algorithm": "fixed_window", "limit": 2, "window_ms": 1000},
                              resource="ALG /x"))
    assert limit(c, "alg-u", "ALG /x", "COST", 0) == [1, 2, 0, 0, 750]
    # counters survive the algorithm changes: 1 + 1 + 2 allowed, 2 denied
    assert stats(c, "alg") == {"allowed": 5, "denied": 2, "shadow_denied": 0}


def test_an_invalid_change_keeps_the_rule_in_force(c, rules):
    rules.set("keep", tb(2, 1, resource="KEEP /x"))
    limit(c, "keep-u", "KEEP /x")
    assert error_of(c, "CL.RULE", "SET", "keep", json.dumps(tb(0, resource="KEEP /x"))) == (
        "invalid rule 'keep': capacity: must be an integer from 1 to 10^15")
    assert error_of(c, "CL.RULE", "SET", "keep", '{"capacity": 2').startswith(
        "invalid rule 'keep': not valid JSON")
    assert limit(c, "keep-u", "KEEP /x") == [1, 2, 0, 0, 2000]


# ---- CL.APPLY -----------------------------------------------------------------------

def test_cl_apply_checks_the_named_rules_all_or_nothing(c, rules):
    rules.set("ap-a", tb(2, 1, resource="AP /never-matched"))
    rules.set("ap-b", tb(5, 1, resource="AP /other"))
    # ids in the order given; the binding rule as for CL.LIMIT
    assert apply(c, "ap-b,ap-a", "ap-u", "DETAIL") == [
        1, 2, 1, 0, 1000,
        [["ap-b", "enforce", 1, 4, 0, 1000], ["ap-a", "enforce", 1, 1, 0, 1000]]]
    assert apply(c, "ap-a,ap-b", "ap-u") == [1, 2, 0, 0, 2000]
    assert apply(c, "ap-a,ap-b", "ap-u", "DETAIL") == [
        0, 2, 0, 1000, 2000,
        [["ap-a", "enforce", 0, 0, 1000, 2000], ["ap-b", "enforce", 1, 3, 0, 2000]]]
    # ap-b alone still has its 3: the denial above spent nothing
    assert apply(c, "ap-b", "ap-u", "COST", 3) == [1, 5, 0, 0, 5000]
    # an id named twice is checked and spent once
    rules.set("ap-c", tb(3, 1))
    assert apply(c, "ap-c,ap-c", "ap-u", "DETAIL") == [
        1, 3, 2, 0, 1000, [["ap-c", "enforce", 1, 2, 0, 1000]]]
    # CL.APPLY and CL.LIMIT share a rule's buckets (ap-c matches any resource)
    assert limit(c, "ap-u", "ANY /thing") == [1, 3, 1, 0, 2000]
    assert apply(c, "ap-c", "ap-u", "COST", 0) == [1, 3, 1, 0, 2000]
    assert apply(c, "ap-c", "ap-u", "COST", 4) == [0, 3, 1, -1, 2000]


def test_cl_apply_with_a_resource_scoped_rule(c, rules):
    rules.set("apr", tb(1, 1, resource="APR /*", key="client+resource"))
    assert apply(c, "apr", "u", "RESOURCE", "APR /a") == [1, 1, 0, 0, 1000]
    assert apply(c, "apr", "u", "RESOURCE", "APR /a") == [0, 1, 0, 1000, 1000]
    assert limit(c, "u", "APR /a") == [0, 1, 0, 1000, 1000]        # the same bucket
    assert apply(c, "apr", "u", "RESOURCE", "APR /b") == [1, 1, 0, 0, 1000]
    assert apply(c, "apr", "u") == [1, 1, 0, 0, 1000]                 # resource ""


def test_cl_apply_errors_spend_nothing(c, rules):
    rules.set("ape", tb(2, 1))
    rules.set("ape-leases", rule_doc({"algorithm": "concurrency", "limit": 2, "lease_ms": 1000}))
    assert error_of(c, "CL.APPLY", "nope", "u") == "no such rule 'nope'"
    assert error_of(c, "CL.APPLY", "ape,nope", "u") == "no such rule 'nope'"
    assert error_of(c, "CL.APPLY", "ape,", "u") == "no such rule ''"
    assert error_of(c, "CL.APPLY", "ape,ape-leases", "u") == (
        "a concurrency rule is used with CL.ACQUIRE and CL.RELEASE")
    assert error_of(c, "CL.APPLY", "ape", "u", "COST", -1) == (
        "COST must be an integer from 0 to 10^15")
    assert error_of(c, "CL.APPLY", "ape", "u", "COST", "x") == (
        "COST must be an integer from 0 to 10^15")
    assert error_of(c, "CL.APPLY", "ape", "u", "TIER", "free") == "syntax error at 'TIER'"
    assert error_of(c, "CL.APPLY", "ape", "u", "COST") == "syntax error at 'COST'"
    assert error_of(c, "CL.APPLY", "ape") == (
        "wrong number of arguments for 'cl.apply' command")
    assert apply(c, "ape", "u", "COST", 0) == [1, 2, 2, 0, 0]


# ---- CL.ACQUIRE / CL.RELEASE ------------------------------------------------------------

LEASE = 1 << 16      # a lease id is (generation << 16) | slot


def test_leases_limit_release_and_expire(c, rules):
    rules.set("lease", rule_doc({"algorithm": "concurrency", "limit": 2, "lease_ms": 1000}))

    def acquire(client="job-u", *options):
        return text(c.execute_command("CL.ACQUIRE", "lease", client, *options))

    def release(lease_id, client="job-u"):
        return c.execute_command("CL.RELEASE", "lease", client, lease_id)

    assert acquire() == [1, 2, 1, 0, 1 * LEASE + 0]                 # expires at 1000
    clock(c, 500)
    assert acquire() == [1, 2, 0, 0, 2 * LEASE + 1]                 # expires at 1500
    clock(c, 600)
    assert acquire() == [0, 2, 0, 400, -1]
    assert acquire("other-u") == [1, 2, 1, 0, 3 * LEASE + 0]        # per client
    clock(c, 999)
    assert acquire() == [0, 2, 0, 1, -1]
    clock(c, 1000)                                                  # the first ran out
    assert release(1 * LEASE) == 0
    assert acquire() == [1, 2, 0, 0, 4 * LEASE + 0]
    assert release(1 * LEASE) == 0                                  # stale: slot 0 is reused
    assert release(2 * LEASE + 1) == 1
    assert release(2 * LEASE + 1) == 0                              # released once
    assert release(2 * LEASE + 1, "other-u") == 0
    assert acquire() == [1, 2, 0, 0, 5 * LEASE + 1]
    assert acquire() == [0, 2, 0, 1000, -1]
    assert release(4 * LEASE) == 1
    assert release(-1) == 0
    assert release(7 * LEASE + 1023) == 0                          # a slot past the limit
    assert stats(c, "lease") == {"allowed": 5, "denied": 3, "shadow_denied": 0}
    # the leases do not take part in CL.LIMIT
    assert limit(c, "job-u", "ANY") == NO_RULE


def test_lease_errors(c, rules):
    rules.set("le-tb", tb(1, 1, resource="LE /x"))
    rules.set("le", rule_doc({"algorithm": "concurrency", "limit": 1, "lease_ms": 1000}))
    assert error_of(c, "CL.ACQUIRE", "nope", "u") == "no such rule 'nope'"
    assert error_of(c, "CL.ACQUIRE", "le-tb", "u") == "rule 'le-tb' is not a concurrency rule"
    assert error_of(c, "CL.RELEASE", "le-tb", "u", 1) == "rule 'le-tb' is not a concurrency rule"
    assert error_of(c, "CL.RELEASE", "le", "u", "abc") == (
        "lease id is not an integer or out of range")
    assert error_of(c, "CL.ACQUIRE", "le", "u", "COST", 1) == "syntax error at 'COST'"
    assert error_of(c, "CL.RELEASE", "le", "u") == (
        "wrong number of arguments for 'cl.release' command")
    assert text(c.execute_command("CL.ACQUIRE", "le", "u")) == [1, 1, 0, 0, LEASE]


def test_release_with_a_lease_id_out_of_range(c, rules):
    """A lease id no acquire could have given (beyond 64 bits) was never
    held: the reply is 0 (or a clear error), not an internal error."""
    rules.set("lr", rule_doc({"algorithm": "concurrency", "limit": 1, "lease_ms": 1000}))
    assert text(c.execute_command("CL.ACQUIRE", "lr", "u")) == [1, 1, 0, 0, LEASE]
    for lease_id in (2**63, -(2**63) - 1, 10**30):
        try:
            reply = c.execute_command("CL.RELEASE", "lr", "u", lease_id)
        except redis.ResponseError as e:
            assert "internal error" not in str(e), f"lease id {lease_id}: {e}"
        else:
            assert reply == 0
    assert c.execute_command("CL.RELEASE", "lr", "u", LEASE) == 1


# ---- CL.THROTTLE ----------------------------------------------------------------------

# redis-cell's README: 15 burst, 30 per 60 s, so one token per 2 s and a
# limit of 16; [limited, limit, remaining, retry_after_s (-1 if
# allowed), reset_after_s].  Steps at (seconds, quantity, reply).
THROTTLE_STEPS = [
    (0, 1, [0, 16, 15, -1, 2]),       # the README's example reply
    (0, 14, [0, 16, 1, -1, 30]),
    (0, 1, [0, 16, 0, -1, 32]),
    (0, 1, [1, 16, 0, 2, 32]),        # limited: one token back in 2 s
    (0, 0, [0, 16, 0, -1, 32]),       # quantity 0 reports
    (2, 1, [0, 16, 0, -1, 32]),
    (3, 2, [1, 16, 0, 3, 31]),        # 2 tokens: 4 s after the last, from 3 s
    (32, 1, [0, 16, 14, -1, 4]),      # 29 s later: all but this one's 2 s drained
    (100, 17, [1, 16, 16, -1, 0]),    # more than the limit: never
]


def test_cl_throttle_redis_cell_table(c):
    got = []
    for seconds, quantity, _ in THROTTLE_STEPS:
        clock(c, seconds * 1000)
        got.append(text(c.execute_command("CL.THROTTLE", "user123", 15, 30, 60, quantity)))
    assert got == [reply for _, _, reply in THROTTLE_STEPS]


def test_cl_throttle_quantity_defaults_to_one(c):
    assert text(c.execute_command("CL.THROTTLE", "user456", 15, 30, 60)) == [0, 16, 15, -1, 2]
    assert text(c.execute_command("CL.THROTTLE", "one-a-sec", 0, 1, 1)) == [0, 1, 0, -1, 1]
    assert text(c.execute_command("CL.THROTTLE", "one-a-sec", 0, 1, 1)) == [1, 1, 0, 1, 1]


THROTTLE_ERRORS = [
    (["k", 15, 0, 60], "count per period must be an integer from 1 to 1000000"),
    (["k", 15, 30, 0], "period must be an integer from 1 to 4294967 seconds"),
    (["k", -1, 30, 60], "max_burst must be an integer from 0 to 1000000000"),
    (["k", 15, 30, 60, "x"], "quantity is not an integer or out of range"),
    (["k", 15, 30], "wrong number of arguments for 'cl.throttle' command"),
]


@pytest.mark.parametrize("args,message", THROTTLE_ERRORS)
def test_cl_throttle_errors(c, args, message):
    assert error_of(c, "CL.THROTTLE", *args) == message
    assert c.ping()


def test_cl_throttle_refuses_extra_arguments(c):
    """redis-cell takes <key> <max_burst> <count> <period> [<quantity>]
    and refuses more; a sixth argument must not be ignored silently."""
    with pytest.raises(redis.ResponseError):
        c.execute_command("CL.THROTTLE", "extra", 15, 30, 60, 1, 7)
    # and nothing was spent
    assert text(c.execute_command("CL.THROTTLE", "extra", 15, 30, 60, 0)) == [0, 16, 16, -1, 0]


# ---- pipelines ---------------------------------------------------------------------------

def test_pipeline_mixing_checks_and_rule_changes_runs_in_order(server, r, rules):
    rules.ids.append("pl")       # deleted at teardown whatever happens here
    doc2 = json.dumps(tb(2, 1, resource="PL /*"))
    doc5 = json.dumps(tb(5, 1, resource="PL /*"))
    steps = [
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:1\r\n:-1\r\n:-1\r\n:0\r\n:0\r\n"),
        (("CL.RULE", "SET", "pl", doc2), b"+OK\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n"),
        (("CL.LIMIT", "pl-u", "PL /y"), b"*5\r\n:1\r\n:2\r\n:0\r\n:0\r\n:2000\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:0\r\n:2\r\n:0\r\n:1000\r\n:2000\r\n"),
        (("CL.RULE", "SET", "pl", doc5), b"+OK\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x", "COST", 0), b"*5\r\n:1\r\n:5\r\n:0\r\n:0\r\n:5000\r\n"),
        (("DEBUG", "CLOCK", "SET", 1000), b":1000\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:1\r\n:5\r\n:0\r\n:0\r\n:5000\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:0\r\n:5\r\n:0\r\n:1000\r\n:5000\r\n"),
        (("CL.RULE", "DEL", "pl"), b":1\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:1\r\n:-1\r\n:-1\r\n:0\r\n:0\r\n"),
        (("CL.RULE", "SET", "pl", doc2), b"+OK\r\n"),
        (("CL.LIMIT", "pl-u", "PL /x", "DETAIL"),
         b"*6\r\n:1\r\n:2\r\n:1\r\n:0\r\n:1000\r\n*1\r\n"
         b"*6\r\n$2\r\npl\r\n$7\r\nenforce\r\n:1\r\n:1\r\n:0\r\n:1000\r\n"),
        (("CL.RULE", "SET", "pl", '{"capacity": 0}'), None),
        (("CL.LIMIT", "pl-u", "PL /x"), b"*5\r\n:1\r\n:2\r\n:0\r\n:0\r\n:2000\r\n"),
        (("CL.RULE", "STATS", "pl"),
         b"*6\r\n$7\r\nallowed\r\n:2\r\n$6\r\ndenied\r\n:0\r\n$13\r\nshadow_denied\r\n:0\r\n"),
    ]
    with Wire.to(server.port) as w:
        w.send(b"".join(command(*args) for args, _ in steps))   # one write
        replies = [w.read_reply() for _ in steps]
    for (args, expected), reply in zip(steps, replies):
        if expected is None:
            assert reply.startswith(b"-ERR invalid rule 'pl': "), (args, reply)
        else:
            assert reply == expected, (args, reply)
