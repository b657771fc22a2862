"""One client's big command never holds the others: a command whose work
grows with its arguments (CONFIG GET with many patterns) is answered in
slices, with other clients served in between.  Checked by the order of
events, not by time.  (bench/soak.py measures the latency this keeps.)"""

from __future__ import annotations

import time

import pytest

from wire import Wire, command, wait_until

pytestmark = pytest.mark.untraced


def test_config_get_with_many_patterns_lets_others_in_between_its_slices(make_server):
    server = make_server()
    big = command("CONFIG", "GET", *[f"*zz{i}*" for i in range(200_000)])
    with Wire.to(server.port) as slow, Wire.to(server.port) as other:
        slow.send(command("CLIENT", "ID"))
        slow_id = int(slow.read_reply()[1:-2])

        def slow_is_running_config():
            other.send(command("CLIENT", "LIST", "ID", slow_id))
            return b" cmd=config" in other.read_reply()

        slow.send(big + command("PING"))
        # Another client is answered while the big command runs (it is the
        # slow client's last command, and its reply has not come)...
        wait_until(slow_is_running_config, what="CONFIG GET to be running")
        other.send(command("PING"))
        assert other.read_reply() == b"+PONG\r\n"
        assert not slow.fill(time.monotonic() + 0.005) and slow.buf == b""
        # ...and the slow client's own later command waits for its reply.
        assert slow.read_reply() == b"*0\r\n"      # no setting has "zz" in its name
        assert slow.read_reply() == b"+PONG\r\n"
