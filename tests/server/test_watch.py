"""WATCH and UNWATCH on bucket keys, against a real redis-server where
the commands are the same: EXEC answers the null array once a write
named a watched key after WATCH (issue 16).  Redis's side writes with
SET, fastlimit's with CL.CHECK; the replies compared are MULTI/EXEC's."""

from __future__ import annotations

import pytest

from wire import Wire, wait_until

WRITES = {"fastlimit": ("CL.CHECK", "wk", 10, 1), "redis": ("SET", "wk", "v")}


@pytest.fixture(params=["fastlimit", "redis"])
def side(request, server, redis_server):
    port = server.port if request.param == "fastlimit" else redis_server.port
    with Wire.to(port) as w:
        assert w.call("FLUSHALL") == b"+OK\r\n"
    return port, WRITES[request.param]


def transaction(w: Wire) -> bytes:
    assert w.call("MULTI") == b"+OK\r\n"
    assert w.call("PING") == b"+QUEUED\r\n"
    return w.call("EXEC")


def test_exec_runs_when_the_watched_key_is_untouched(side):
    port, _ = side
    with Wire.to(port) as w:
        assert w.call("WATCH", "wk", "other") == b"+OK\r\n"
        assert transaction(w) == b"*1\r\n+PONG\r\n"


def test_exec_aborts_after_another_client_writes(side):
    port, write = side
    with Wire.to(port) as w, Wire.to(port) as other:
        assert w.call("WATCH", "a", "wk", "b") == b"+OK\r\n"
        other.call(*write)
        assert transaction(w) == b"*-1\r\n"
        # the watch ended with EXEC: the next one runs
        other.call(*write)
        assert transaction(w) == b"*1\r\n+PONG\r\n"


def test_exec_aborts_in_resp3_with_its_null(side):
    port, write = side
    with Wire.to(port) as w, Wire.to(port) as other:
        assert w.call("HELLO", "3").startswith(b"%")
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        other.call(*write)
        assert transaction(w) == b"_\r\n"


def test_unwatch_and_discard_forget_the_keys(side):
    port, write = side
    with Wire.to(port) as w, Wire.to(port) as other:
        assert w.call("UNWATCH") == b"+OK\r\n"
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        assert w.call("UNWATCH") == b"+OK\r\n"
        other.call(*write)
        assert transaction(w) == b"*1\r\n+PONG\r\n"
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        other.call(*write)
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("DISCARD") == b"+OK\r\n"
        assert transaction(w) == b"*1\r\n+PONG\r\n"


def test_watch_inside_multi_is_refused(side):
    port, _ = side
    with Wire.to(port) as w:
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("WATCH", "wk") == b"-ERR WATCH inside MULTI is not allowed\r\n"
        assert w.call("EXEC") == b"*0\r\n"
        assert w.call("WATCH") == b"-ERR wrong number of arguments for 'watch' command\r\n"


def test_flushall_touches_a_watched_key(side):
    port, write = side
    with Wire.to(port) as w:
        w.call(*write)
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        assert w.call("FLUSHALL") == b"+OK\r\n"
        assert transaction(w) == b"*-1\r\n"


def test_own_write_and_cl_reset_touch(server):
    with Wire.to(server.port) as w, Wire.to(server.port) as other:
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        assert w.call("CL.CHECK", "wk", 10, 1).startswith(b"*5")   # its own write counts too
        assert transaction(w) == b"*-1\r\n"
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        assert other.call("CL.RESET", "wk") == b":1\r\n"
        assert transaction(w) == b"*-1\r\n"
        # a write to another key, and a write queued in the transaction itself
        assert w.call("WATCH", "wk") == b"+OK\r\n"
        assert other.call("CL.CHECK", "elsewhere", 10, 1).startswith(b"*5")
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("CL.CHECK", "wk", 10, 1) == b"+QUEUED\r\n"
        assert w.call("EXEC").startswith(b"*1\r\n*5\r\n")


def test_watches_are_counted_in_info_and_forgotten_on_close(server):
    def fields():
        with Wire.to(server.port) as c:
            info = c.call("INFO", "clients").decode()
        return {k: v for k, _, v in (line.partition(":") for line in info.split("\r\n"))}

    w = Wire.to(server.port)
    assert w.call("WATCH", "x1", "x2", "x1") == b"+OK\r\n"
    got = fields()
    assert got["watching_clients"] == "1" and got["total_watched_keys"] == "2"
    w.close()
    wait_until(lambda: fields()["total_watched_keys"] == "0", what="the watches gone")


def test_a_connection_watches_at_most_max_multibulk_len_keys(make_server):
    srv = make_server("--max-multibulk-len", "1024")
    with Wire.to(srv.port) as w:
        assert w.call("WATCH", *range(1000)) == b"+OK\r\n"
        assert w.call("WATCH", *range(990, 1024)) == b"+OK\r\n"   # 10 already watched
        assert w.call("WATCH", "one-more") \
            == b"-ERR a connection watches at most 1024 keys (max-multibulk-len)\r\n"
        assert w.call("UNWATCH") == b"+OK\r\n"
        assert w.call("WATCH", "one-more") == b"+OK\r\n"
