"""The log's bound: each kind of line gets a burst per window, the rest
are counted and summarised, so no client can grow the log at network
speed."""

from __future__ import annotations

import logging
import socket

import pytest

from fastlimit.server.logs import BURST, RepeatLimit


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("fastlimit", logging.WARNING, __file__, 1, msg, (), None)


@pytest.mark.parametrize("sent, passed, left_out", [
    (1, 1, 0), (BURST, BURST, 0), (BURST + 1, BURST, 1), (1000, BURST, 1000 - BURST)])
def test_one_kind_of_line_gets_a_burst_per_window(sent, passed, left_out):
    limit = RepeatLimit(window_s=60, clock=ManualClock())
    assert sum(limit.filter(record("closing client id=%d")) for _ in range(sent)) == passed
    assert limit.suppressed_total == left_out


def test_the_first_line_of_the_next_window_says_how_many_were_left_out():
    clock = ManualClock()
    limit = RepeatLimit(burst=2, window_s=60, clock=clock)
    for _ in range(7):
        limit.filter(record("closing client id=%d"))
    clock.now = 61
    line = record("closing client id=%d")
    assert limit.filter(line)
    assert line.msg.startswith("(5 more like the next line left out in the last 61 s)")


def test_kinds_are_limited_apart():
    limit = RepeatLimit(burst=1, window_s=60, clock=ManualClock())
    assert limit.filter(record("a %d")) and limit.filter(record("b %d"))
    assert not limit.filter(record("a %d"))


def test_refused_replica_links_write_a_bounded_number_of_lines(make_server):
    server = make_server()
    for _ in range(60):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"CL.SYNC\r\nPING\r\n")
            while s.recv(65536):
                pass
    client = server.client()
    suppressed = client.info("stats")["log_lines_suppressed"]
    lines = [l for l in server.log().splitlines() if "WARNING" in l]
    assert suppressed > 0
    # One burst for each kind of line a refused link causes, at most.
    assert len(lines) <= 4 * BURST, "\n".join(lines)
