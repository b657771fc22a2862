"""CL.CHECK and CL.RESET through a real server: the worked example,
argument errors, COST and PERIOD, binary keys, DBSIZE."""

from __future__ import annotations

import pytest
import redis

from wire import Wire, command


def read_reply(w: Wire):
    """One RESP2 reply: bytes for errors/status lines, lists of ints."""
    line = w.read_line()
    if line[:1] == b"*":
        return [read_reply(w) for _ in range(int(line[1:-2]))]
    if line[:1] == b":":
        return int(line[1:-2])
    return line[:-2]


def check(r, key, *args):
    return r.execute_command("CL.CHECK", key, *args)


def clock(r, ms):
    assert r.execute_command("DEBUG", "CLOCK", "SET", ms) == ms


# ---- the worked example -------------------------------------------------------

def test_worked_example(r):
    expected = [
        (0, [1, 5, 4, 0, 500]), (0, [1, 5, 3, 0, 1000]), (0, [1, 5, 2, 0, 1500]),
        (0, [1, 5, 1, 0, 2000]), (0, [1, 5, 0, 0, 2500]), (0, [0, 5, 0, 500, 2500]),
        (500, [1, 5, 0, 0, 2500]), (500, [0, 5, 0, 500, 2500]),
        (1500, [1, 5, 1, 0, 2000]), (1500, [1, 5, 0, 0, 2500]), (1500, [0, 5, 0, 500, 2500]),
    ]
    got = []
    for now, _ in expected:
        clock(r, now)
        got.append(check(r, "user:1", 5, 2))
    assert [g[0] for g in got] == [1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0]
    assert got == [e for _, e in expected]


def test_worked_example_resp3(server, r):
    c = server.client(protocol=3)
    try:
        assert c.execute_command("CL.CHECK", "k3", 5, 2) == [1, 5, 4, 0, 500]
        assert c.execute_command("CL.CHECK", "k3", 5, 2, "COST", 4) == [1, 5, 0, 0, 2500]
        assert c.execute_command("CL.CHECK", "k3", 5, 2) == [0, 5, 0, 500, 2500]
    finally:
        c.close()


def test_a_limited_request_is_a_normal_reply(r):
    for _ in range(3):
        check(r, "k", 3, 1)
    reply = check(r, "k", 3, 1)
    assert reply == [0, 3, 0, 1000, 3000]


def test_clock_set_applies_to_the_next_command_of_the_same_pipeline(r):
    """DEBUG CLOCK SET moves the clock for every command after it, also when
    both arrive in one read (a pipeline)."""
    p = r.pipeline(transaction=False)
    p.execute_command("CL.CHECK", "k", 1, 1)
    p.execute_command("DEBUG", "CLOCK", "SET", 5000)
    p.execute_command("CL.CHECK", "k", 1, 1)
    p.execute_command("DEBUG", "CLOCK", "ADVANCE", 1000)
    p.execute_command("CL.CHECK", "k", 1, 1)
    assert p.execute() == [[1, 1, 0, 0, 1000], 5000, [1, 1, 0, 0, 1000],
                           6000, [1, 1, 0, 0, 1000]]


# ---- argument errors ------------------------------------------------------------------

ERRORS = [
    # (arguments after CL.CHECK, the exact error line)
    ((), "ERR wrong number of arguments for 'cl.check' command"),
    (("k",), "ERR wrong number of arguments for 'cl.check' command"),
    (("k", "5"), "ERR wrong number of arguments for 'cl.check' command"),
    (("k", "abc", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "1.5", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "", "1"), "ERR capacity is not an integer or out of range"),
    (("k", " 5", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "5x", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "99999999999999999999", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "9223372036854775808", "1"), "ERR capacity is not an integer or out of range"),
    (("k", "0", "1"), "ERR capacity must be an integer from 1 to 10^15"),
    (("k", "-5", "1"), "ERR capacity must be an integer from 1 to 10^15"),
    (("k", "1000000000000001", "1"), "ERR capacity must be an integer from 1 to 10^15"),
    (("k", "9223372036854775807", "1"), "ERR capacity must be an integer from 1 to 10^15"),
    (("k", "5", "x"), "ERR refill_per_sec is not an integer or out of range"),
    (("k", "5", "2.0"), "ERR refill_per_sec is not an integer or out of range"),
    (("k", "5", "0"), "ERR refill_per_sec must be an integer from 1 to 10^15"),
    (("k", "5", "-1"), "ERR refill_per_sec must be an integer from 1 to 10^15"),
    (("k", "5", "1", "COST", "x"), "ERR COST is not an integer or out of range"),
    (("k", "5", "1", "COST", "-1"), "ERR COST must be an integer from 0 to 10^15"),
    (("k", "5", "1", "COST", "99999999999999999999"),
     "ERR COST is not an integer or out of range"),
    (("k", "5", "1", "PERIOD", "1e3"), "ERR PERIOD is not an integer or out of range"),
    (("k", "5", "1", "PERIOD", "0"), "ERR PERIOD must be an integer from 1 to 4294967295 ms"),
    (("k", "5", "1", "PERIOD", "4294967296"),
     "ERR PERIOD must be an integer from 1 to 4294967295 ms"),
    (("k", "1000000000000000", "1", "PERIOD", "2"),
     "ERR rate too slow: refilling the bucket would take more than 10^15 ms"),
    # Not fixed word for word: a syntax error naming the culprit.
    (("k", "5", "1", "FOO", "1"), ("syntax error", "FOO")),
    (("k", "5", "1", "COST"), ("syntax error", "COST")),
    (("k", "5", "1", "COST", "1", "PERIOD"), ("syntax error", "PERIOD")),
    (("k", "5", "1", "1"), ("syntax error", "'1'")),
    (("k", "5", "1", "COSTS", "1"), ("syntax error", "COSTS")),
]


@pytest.mark.parametrize("args,message", ERRORS, ids=[" ".join(a) or "no-args" for a, _ in ERRORS])
def test_argument_errors(server, r, args, message):
    with Wire.to(server.port) as w:
        w.send(command("CL.CHECK", *args))
        line = read_reply(w)
        if isinstance(message, str):
            assert line == b"-" + message.encode()
        else:
            assert line.startswith(b"-ERR ") and all(m.encode() in line for m in message), line
        # The connection goes on, and nothing was stored.
        w.send(command("PING") + command("CL.CHECK", "k", 5, 1) + command("DBSIZE"))
        assert read_reply(w) == b"+PONG"
        assert read_reply(w) == [1, 5, 4, 0, 1000]
        assert read_reply(w) == 1


def test_argument_errors_through_redis_py(r):
    with pytest.raises(redis.ResponseError, match="capacity"):
        check(r, "k", "abc", 1)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("CL.CHECK", "k", 5)
    assert check(r, "k", 5, 1) == [1, 5, 4, 0, 1000]


def test_errors_inside_a_pipeline_do_not_disturb_the_others(r):
    p = r.pipeline(transaction=False)
    p.execute_command("CL.CHECK", "a", 2, 1)
    p.execute_command("CL.CHECK", "a", 0, 1)
    p.execute_command("CL.CHECK", "a", 2, 1)
    p.execute_command("CL.CHECK", "a", 2, 1, "COST", "many")
    p.execute_command("CL.CHECK", "a", 2, 1)
    out = p.execute(raise_on_error=False)
    assert out[0] == [1, 2, 1, 0, 1000]
    assert isinstance(out[1], redis.ResponseError) and "capacity" in str(out[1])
    assert out[2] == [1, 2, 0, 0, 2000]
    assert isinstance(out[3], redis.ResponseError) and "COST" in str(out[3])
    assert out[4] == [0, 2, 0, 1000, 2000]


# ---- COST, PERIOD, options ---------------------------------------------------------------

def test_cost(r):
    assert check(r, "k", 5, 1, "COST", 0) == [1, 5, 5, 0, 0]
    assert r.dbsize() == 0, "COST 0 on a new bucket must not store it"
    assert check(r, "k", 5, 1, "COST", 6) == [0, 5, 5, -1, 0]
    assert check(r, "k", 5, 1, "COST", 3) == [1, 5, 2, 0, 3000]
    assert check(r, "k", 5, 1, "COST", 0) == [1, 5, 2, 0, 3000]
    assert check(r, "k", 5, 1, "COST", 3) == [0, 5, 2, 1000, 3000]
    assert check(r, "k", 5, 1, "COST", 6) == [0, 5, 2, -1, 3000]
    assert check(r, "k", 5, 1, "COST", 2) == [1, 5, 0, 0, 5000]
    clock(r, 5000)
    assert check(r, "k", 5, 1, "COST", 5) == [1, 5, 0, 0, 5000]
    assert check(r, "k", 5, 1, "COST", 1000000000000000) == [0, 5, 0, -1, 5000]


def test_period_one_thousand_per_hour(r):
    args = ("reports", 1000, 1000, "PERIOD", 3600000)
    assert check(r, *args, "COST", 1000) == [1, 1000, 0, 0, 3600000]
    assert check(r, *args) == [0, 1000, 0, 3600, 3600000]
    clock(r, 3599)
    assert check(r, *args) == [0, 1000, 0, 1, 3596401]
    clock(r, 3600)
    assert check(r, *args) == [1, 1000, 0, 0, 3600000]
    clock(r, 3600 + 36000)
    assert check(r, *args, "COST", 0) == [1, 1000, 10, 0, 3564000]


def test_period_remainder_is_exact(r):
    # one token every 3 ms
    assert check(r, "k", 1, 1, "PERIOD", 3) == [1, 1, 0, 0, 3]
    for now, expected in [(1, [1, 1, 0, 0, 2]), (2, [1, 1, 0, 0, 1]), (3, [1, 1, 1, 0, 0])]:
        clock(r, now)
        assert check(r, "k", 1, 1, "PERIOD", 3, "COST", 0) == expected
    # the peeks wrote nothing; the remainders add up to a whole token, spent now
    assert check(r, "k", 1, 1, "PERIOD", 3) == [1, 1, 0, 0, 3]


def test_options_are_case_insensitive_and_in_any_order(r):
    assert check(r, "a", 10, 1, "cost", 2, "period", 2000) == [1, 10, 8, 0, 4000]
    assert check(r, "b", 10, 1, "PERIOD", 2000, "Cost", 2) == [1, 10, 8, 0, 4000]
    assert check(r, "c", 10, 1, "PERIOD", 1000) == check(r, "d", 10, 1)


def test_period_change_does_not_mint_tokens(make_server):
    """The remainder carried for PERIOD belongs to the PERIOD it was computed
    with; reading the bucket with another PERIOD must not turn it into
    tokens (a separate server: the debug build may abort on this)."""
    s = make_server("--manual-clock")
    c = s.client(protocol=2)
    try:
        p = 4294967295
        assert c.execute_command("CL.CHECK", "k", 1000, 1000, "COST", 1000, "PERIOD", p)[:3] == [1, 1000, 0]
        c.execute_command("DEBUG", "CLOCK", "SET", 4_000_000)
        # denied: spends nothing, but stores the refill (and its remainder)
        assert c.execute_command("CL.CHECK", "k", 1000, 1000, "COST", 1, "PERIOD", p)[:3] == [0, 1000, 0]
        c.execute_command("DEBUG", "CLOCK", "SET", 4_000_001)
        # 931 milli-tokens carried (the sub-milli-token remainder stays below
        # one milli-token under the new PERIOD), plus 1 ms at 1 token/ms:
        # 1.931 tokens, and ceil(998.069) ms to refill the rest.
        reply = c.execute_command("CL.CHECK", "k", 1000, 1000, "COST", 0)
        assert reply == [1, 1000, 1, 0, 999], reply
    finally:
        c.close()
        assert s.alive(), s.log()


def test_clock_near_its_bound_still_limits(r):
    """The manual clock accepts times up to 4*10^12 ms (year 2096, so that
    expiry seconds fit 32 bits); limiting works there as it does at 0."""
    base = 4 * 10**12 - 10**5
    clock(r, base)
    assert check(r, "late", 2, 1) == [1, 2, 1, 0, 1000]
    assert check(r, "late", 2, 1) == [1, 2, 0, 0, 2000]
    assert check(r, "late", 2, 1) == [0, 2, 0, 1000, 2000]
    clock(r, base + 1000)
    assert check(r, "late", 2, 1) == [1, 2, 0, 0, 2000]
    with pytest.raises(redis.ResponseError, match="out of range"):
        clock(r, 4 * 10**12 + 1)


# ---- CL.RESET -------------------------------------------------------------------------------

def test_cl_reset(r):
    assert check(r, "k", 5, 1, "COST", 5) == [1, 5, 0, 0, 5000]
    assert check(r, "other", 5, 1) == [1, 5, 4, 0, 1000]
    assert r.dbsize() == 2
    assert r.execute_command("CL.RESET", "k") == 1
    assert r.dbsize() == 1
    assert r.execute_command("CL.RESET", "k") == 0
    assert r.execute_command("CL.RESET", "never-seen") == 0
    assert check(r, "k", 5, 1) == [1, 5, 4, 0, 1000]
    assert check(r, "other", 5, 1, "COST", 0) == [1, 5, 4, 0, 1000]
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'cl.reset'"):
        r.execute_command("CL.RESET")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'cl.reset'"):
        r.execute_command("CL.RESET", "a", "b")


# ---- keys -----------------------------------------------------------------------------------------

BINARY_KEYS = [b"", b"\x00", b"a\x00b", b"a\x00c", b"\r\n", b"x\r\n$5\r\n", b"\xff\xfe",
               b"a", b"A", b"a ", "ключ".encode()]


def test_binary_safe_keys(r):
    for i, key in enumerate(BINARY_KEYS):
        cost = 1 + i % 4
        assert check(r, key, 10, 1, "COST", cost) == [1, 10, 10 - cost, 0, cost * 1000], key
    assert r.dbsize() == len(BINARY_KEYS)
    for i, key in enumerate(BINARY_KEYS):
        assert check(r, key, 10, 1, "COST", 0)[2] == 10 - (1 + i % 4), key
    assert r.execute_command("CL.RESET", b"a\x00b") == 1
    assert check(r, b"a\x00c", 10, 1, "COST", 0)[2] == 10 - (1 + 3 % 4)
    assert check(r, b"a\x00b", 10, 1, "COST", 0)[2] == 10


def test_longest_key(r):
    key = b"\x00\r\n" * 21845   # 65535 bytes
    assert len(key) == 65535
    assert check(r, key, 2, 1) == [1, 2, 1, 0, 1000]
    assert check(r, key, 2, 1) == [1, 2, 0, 0, 2000]
    assert check(r, key[:-1], 2, 1) == [1, 2, 1, 0, 1000]
    assert r.dbsize() == 2
    assert r.execute_command("CL.RESET", key) == 1


@pytest.mark.parametrize("cost", [1, 0, 3])
def test_key_too_long(r, cost):
    with pytest.raises(redis.ResponseError, match="65535"):
        check(r, b"k" * 65536, 2, 1, "COST", cost)
    assert r.dbsize() == 0
    assert r.ping()
    assert check(r, "k", 2, 1) == [1, 2, 1, 0, 1000]


# ---- DBSIZE ---------------------------------------------------------------------------------------

def test_dbsize_counts_stored_buckets(r):
    assert r.dbsize() == 0
    # u:0-9 at 0 ms and the rest at 500 ms: at 1000 ms only the first ten
    # are full again, so whether the background sweep or the reads below
    # forget them, 990 stay
    for start, now in ((0, 0), (10, 500)):
        clock(r, now)
        p = r.pipeline(transaction=False)
        for i in range(start, 1000 if start else 10):
            p.execute_command("CL.CHECK", f"u:{i}", 10, 1)
        assert all(x[0] == 1 for x in p.execute())
    assert r.dbsize() == 1000
    for i in range(100):   # full buckets are not stored
        assert check(r, f"full:{i}", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]
        assert check(r, f"never:{i}", 10, 1, "COST", 11) == [0, 10, 10, -1, 0]
    assert r.dbsize() == 1000
    clock(r, 1000)   # the first 10 refill; spending forgets them (a peek writes nothing)
    for i in range(10):
        assert check(r, f"u:{i}", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]
        assert check(r, f"u:{i}", 10, 1, "COST", 0, "PERIOD", 1) == [1, 10, 10, 0, 0]
    r.execute_command("DEBUG", "SWEEP")
    assert r.dbsize() == 990
    r.flushall()
    assert r.dbsize() == 0
    assert check(r, "u:500", 10, 1, "COST", 0) == [1, 10, 10, 0, 0]
