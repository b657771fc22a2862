"""Denials by rules reach the log as summary lines at a limited pace.

This test is about real time (the pace of log lines), so it waits on the
wall clock, bounded."""

import json
import re
import time

from wire import wait_until

LINE = re.compile(r"(\d+) requests denied \(or shadow-denied\) by rules in the last")


def denial_lines(srv) -> list[int]:
    return [int(n) for n in LINE.findall(srv.log())]


def test_denials_are_summarised_not_logged_one_by_one(make_server):
    srv = make_server("--manual-clock", "--denial-log-seconds", "1")
    c = srv.client(protocol=2)
    c.execute_command("CL.RULE", "SET", "tiny", json.dumps({"capacity": 1, "refill_per_second": 1}))
    pipe = c.pipeline(transaction=False)
    for _ in range(200):
        pipe.execute_command("CL.LIMIT", "user", "GET /")
    assert [r[0] for r in pipe.execute()] == [1] + [0] * 199
    # The summary is written by the once-a-second cron, which may fall
    # between two of the checks: then the 199 are told in two lines.
    wait_until(lambda: sum(denial_lines(srv)) == 199, 10, "199 denials in the log")
    summarised = denial_lines(srv)
    assert len(summarised) <= 2, srv.log()
    assert "latest: rule tiny, key b'user', cost 1" in srv.log()
    # A quiet second logs nothing more; new denials are summarised again.
    time.sleep(1.5)
    assert denial_lines(srv) == summarised
    c.execute_command("CL.LIMIT", "user", "GET /")
    wait_until(lambda: len(denial_lines(srv)) > len(summarised), 10, "the next summary")
    assert denial_lines(srv) == summarised + [1]
    c.close()
