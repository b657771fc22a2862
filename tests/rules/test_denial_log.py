"""Denials by rules reach the log as summary lines at a limited pace.

This test is about real time (the pace of log lines), so it waits on the
wall clock, bounded."""

import json
import re
import time

LINE = re.compile(r"(\d+) requests denied \(or shadow-denied\) by rules in the last")


def denial_lines(srv) -> list[int]:
    return [int(n) for n in LINE.findall(srv.log())]


def test_denials_are_summarised_not_logged_one_by_one(make_server):
    srv = make_server("--manual-clock", "--denial-log-seconds", "1")
    c = srv.client(protocol=2)
    c.execute_command("CL.RULE", "SET", "tiny", json.dumps({"capacity": 1, "refill_per_second": 1}))
    replies = [c.execute_command("CL.LIMIT", "user", "GET /") for _ in range(200)]
    assert [r[0] for r in replies] == [1] + [0] * 199
    deadline = time.monotonic() + 10
    while not denial_lines(srv) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert denial_lines(srv) == [199], srv.log()
    assert "latest: rule tiny, key b'user', cost 1" in srv.log()
    # A quiet second logs nothing more; new denials are summarised again.
    time.sleep(1.5)
    assert denial_lines(srv) == [199]
    c.execute_command("CL.LIMIT", "user", "GET /")
    deadline = time.monotonic() + 10
    while len(denial_lines(srv)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert denial_lines(srv) == [199, 1]
    c.close()
