"""Split keys through a real server: CL.CHECK ... SPLIT k (its sub-key
naming, the two choices, its errors), a split rule over CL.LIMIT and the
HTTP check endpoints, a live change of k with CL.RULE SET that keeps
what was spent (the registry moving the split's epoch), and a split
rule's sub-buckets surviving a restart from the snapshot."""

from __future__ import annotations

import json
import signal

import pytest
import redis

FW = {"algorithm": "fixed_window", "window_ms": 60_000}


def check(c, key, capacity, refill, *options):
    return c.execute_command("CL.CHECK", key, capacity, refill, *options)


def sub_remaining(c, key: str, capacity: int, k: int) -> list[int]:
    """Each sub-bucket's own remaining (a peek shows k times it)."""
    return [check(c, f"{key}#{i}", capacity, 1, "COST", 0, "SPLIT", k)[2] // k
            for i in range(k)]


def limit_allowed(c, client: str, resource: str, n: int) -> int:
    return sum(c.execute_command("CL.LIMIT", client, resource)[0] for _ in range(n))


def test_cl_check_split(r):
    # a sub-key names its sub-bucket: a quarter of the capacity, a quarter of the rate
    assert check(r, "ip:1#2", 40, 4, "COST", 10, "SPLIT", 4) == [1, 40, 0, 0, 10_000]
    assert sub_remaining(r, "ip:1", 40, 4) == [10, 10, 0, 10]
    # empty: the check goes to one other sub-bucket
    assert check(r, "ip:1#2", 40, 4, "SPLIT", 4)[:3] == [1, 40, 36]
    # a plain key draws one; the shares add up to the capacity, never more
    assert sum(check(r, "ip:1", 40, 4, "SPLIT", 4)[0] for _ in range(60)) == 40 - 11
    assert r.dbsize() == 4            # the sub-buckets, under their sub-keys
    # a hash tag keeps the suffix inside it
    check(r, "a{t}b", 8, 1, "SPLIT", 2)
    assert sorted(check(r, f"a{{t#{i}}}b", 8, 1, "COST", 0, "SPLIT", 2)[2]
                  for i in range(2)) == [6, 8]
    assert r.dbsize() == 5


@pytest.mark.parametrize("args, error", [
    (("SPLIT", 0), "ERR SPLIT must be an integer from 1 to 64"),
    (("SPLIT", 65), "ERR SPLIT must be an integer from 1 to 64"),
    (("SPLIT", "x"), "ERR SPLIT must be an integer from 1 to 64"),
    (("SPLIT",), "ERR syntax error: option 'SPLIT' needs a value"),
    (("SPLIT", 11), "ERR SPLIT is more than the capacity: every sub-bucket needs a token"),
    (("PERIOD", 2**31, "SPLIT", 4),
     "ERR SPLIT makes a sub-bucket's period (PERIOD x SPLIT) out of range"),
    (("SPLAT", 2), "ERR syntax error: unknown option 'SPLAT', expected COST, PERIOD, SPLIT or PRIORITY"),
])
def test_cl_check_split_errors(r, args, error):
    with pytest.raises(redis.ResponseError) as e:
        check(r, "k", 10, 1, *args)
    assert str(e.value) == error.removeprefix("ERR ")
    assert r.dbsize() == 0


def test_a_split_rule_over_cl_limit_and_http(hs):
    c = hs.client()
    c.execute_command("CL.RULE", "SET", "hot", json.dumps({**FW, "limit": 100, "split": 4}))
    assert json.loads(c.execute_command("CL.RULE", "GET", "hot"))["split"] == 4
    assert limit_allowed(c, "tenant", "api", 150) <= 100
    status, _, body = hs.post("/v1/check", {"client_key": "tenant", "resource": "api"})
    assert status == 429 or body["allowed"] is False
    status, _, body = hs.post("/v1/check", {"client_key": "other#1", "resource": "api"})
    assert body["allowed"] is True and body["limit"] == 100 and body["remaining"] == 96
    status, _, body = hs.post("/v1/check/bucket", {"key": "b", "capacity": 8,
                                                    "refill_per_sec": 1, "split": 2})
    assert status == 200 and body["limit"] == 8 and body["remaining"] == 6
    status, _, body = hs.post("/v1/check/bucket", {"key": "b", "capacity": 8,
                                                    "refill_per_sec": 1, "split": 99})
    assert status == 400


def test_changing_k_live_keeps_what_was_spent(hs):
    """CL.RULE SET with a new split: the registry gives it the next epoch
    and the old split as history (CL.RULE GET shows both), and the new
    sub-buckets start as full as the old ones were."""
    c = hs.client()
    rule = {**FW, "limit": 1000}
    c.execute_command("CL.RULE", "SET", "hot", json.dumps({**rule, "split": 4}))
    spent = limit_allowed(c, "t", "api", 600)
    assert spent == 600
    for k, epoch, history in [(8, 1, [[0, 4]]), (4, 2, [[1, 8], [0, 4]])]:
        c.execute_command("CL.RULE", "SET", "hot", json.dumps({**rule, "split": k}))
        doc = json.loads(c.execute_command("CL.RULE", "GET", "hot"))
        assert (doc["split"], doc["split_epoch"], doc["split_history"]) == (k, epoch, history)
        got = limit_allowed(c, "t", "api", 100)
        assert got >= 90
        spent += got
    # the same split again changes nothing
    c.execute_command("CL.RULE", "SET", "hot", json.dumps({**rule, "split": 4}))
    assert json.loads(c.execute_command("CL.RULE", "GET", "hot"))["split_epoch"] == 2
    assert spent + limit_allowed(c, "t", "api", 1500) <= 1000


@pytest.mark.parametrize("doc, error", [
    ({"split": 0}, "split: must be an integer from 1 to 64"),
    ({"split": 2000}, "split: must be an integer from 1 to 64"),
    ({"split": 11}, "split: more sub-buckets than the fixed_window has tokens (10)"),
    ({"split": 2, "split_history": [[0]]}, "split_history: must be a list"),
    ({"split": 2, "split_epoch": 256}, "split_epoch: must be an integer from 0 to 255"),
])
def test_bad_split_fields(r, doc, error):
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command("CL.RULE", "SET", "x", json.dumps({**FW, "limit": 10, **doc}))
    assert error in str(e.value)


def test_split_buckets_survive_a_restart(make_server, tmp_path):
    args = ("--manual-clock", "--snapshot-file", str(tmp_path / "s.snap"),
            "--rules-db", str(tmp_path / "rules.db"))
    s = make_server(*args)
    c = s.client()
    c.execute_command("CL.RULE", "SET", "hot", json.dumps({**FW, "limit": 400, "split": 4}))
    assert limit_allowed(c, "t", "api", 300) == 300
    assert s.stop() in (0, -signal.SIGTERM), s.log()
    c = make_server(*args).client()
    assert limit_allowed(c, "t", "api", 200) <= 100
