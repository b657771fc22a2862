"""redis-py 8, unmodified, in every mode it can run in: sync and asyncio,
RESP2 and RESP3 (RESP3 is redis-py 8's default: it opens with HELLO 3),
with hiredis and with redis-py's pure-Python parsers.

How redis-py 8.1 picks a parser: ``redis.connection.DefaultParser`` is
``_HiredisParser`` when hiredis >= 3.2 is importable (``_RESP2Parser``
otherwise); the asyncio side has ``_AsyncHiredisParser`` /
``_AsyncRESP2Parser`` / ``_AsyncRESP3Parser``.  ``parser_class`` is a
connection (pool) argument; with ``protocol=3`` a RESP2 pure-Python parser
is swapped for the RESP3 one.  Every test here asserts which parser class
the pooled connection really ended up with, so the matrix is real.

One body serves both APIs: ``h.run(x)`` awaits ``x`` on the harness's event
loop when it is awaitable and returns it unchanged otherwise.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import pytest
import redis
import redis.asyncio as aredis
from redis._parsers import (_AsyncHiredisParser, _AsyncRESP2Parser, _AsyncRESP3Parser,
                            _HiredisParser, _RESP2Parser, _RESP3Parser)
from redis.utils import HIREDIS_AVAILABLE

from wire import Wire

PARSERS = {
    ("sync", 2, "hiredis"): _HiredisParser,
    ("sync", 3, "hiredis"): _HiredisParser,
    ("sync", 2, "python"): _RESP2Parser,
    ("sync", 3, "python"): _RESP3Parser,
    ("async", 2, "hiredis"): _AsyncHiredisParser,
    ("async", 3, "hiredis"): _AsyncHiredisParser,
    ("async", 2, "python"): _AsyncRESP2Parser,
    ("async", 3, "python"): _AsyncRESP3Parser,
}
MODES = list(PARSERS)


def mode_id(mode) -> str:
    api, proto, parser = mode
    return f"{api}-resp{proto}-{parser}"


class Harness:
    """Makes clients of one mode and runs their calls to completion."""

    def __init__(self, api: str, proto: int, parser: str):
        self.api, self.proto, self.parser = api, proto, parser
        self.parser_class = PARSERS[(api, proto, parser)]
        self.loop = asyncio.new_event_loop() if api == "async" else None
        self._made: list = []

    def run(self, value):
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def gather(self, thunks):
        """Runs the calls concurrently (asyncio) or one after another (sync)."""
        if self.api == "async":
            async def all_of():
                return await asyncio.gather(*(t() for t in thunks))
            return self.run(all_of())
        return [t() for t in thunks]

    def client(self, port: int, **kwargs):
        kwargs.setdefault("socket_timeout", 10)
        module = aredis if self.api == "async" else redis
        pool = module.ConnectionPool(host="127.0.0.1", port=port, protocol=self.proto,
                                     parser_class=self.parser_class, **kwargs)
        client = module.Redis(connection_pool=pool)
        self._made.append((client, pool))
        return client

    def pooled(self, client) -> list:
        return list(client.connection_pool._available_connections)

    def check_parser(self, client) -> None:
        conns = self.pooled(client)
        assert conns, "no pooled connection to inspect"
        for conn in conns:
            assert type(conn._parser) is self.parser_class, (type(conn._parser), self.parser_class)

    def pause(self, seconds: float) -> None:
        """Waits with the client's event loop running (asyncio), so what the
        server sent meanwhile, a FIN included, reaches the client's streams."""
        if self.api == "async":
            self.run(asyncio.sleep(seconds))
        else:
            time.sleep(seconds)

    def close(self):
        for client, pool in self._made:
            if self.api == "async":
                self.run(client.aclose())
                self.run(pool.disconnect())
            else:
                client.close()
                pool.disconnect()
        if self.loop is not None:
            self.loop.close()


def text(value):
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture(params=MODES, ids=mode_id)
def h(request):
    harness = Harness(*request.param)
    yield harness
    harness.close()


@pytest.fixture
def c(h, r, server):
    """A client of the mode under test on the flushed manual-clock server."""
    return h.client(server.port)


def test_hiredis_is_the_default_parser():
    # The matrix assumes both parsers exist and hiredis is redis-py's default.
    from redis.asyncio.connection import DefaultParser as AsyncDefault
    from redis.connection import DefaultParser
    assert HIREDIS_AVAILABLE
    assert DefaultParser is _HiredisParser
    assert AsyncDefault is _AsyncHiredisParser


def test_default_client_speaks_resp3(server, r):
    # redis.Redis() with no protocol argument: HELLO 3 and the hiredis parser.
    client = server.client()
    try:
        assert client.ping() is True
        assert client.execute_command("CL.CHECK", "default", 5, 2) == [1, 5, 4, 0, 500]
        conn = client.connection_pool._available_connections[0]
        assert conn.protocol == 3
        assert type(conn._parser) is _HiredisParser
        my_id = client.client_id()
        (me,) = [e for e in r.client_list() if e["id"] == str(my_id)]
        assert (me["resp"], me["lib-name"]) == ("3", "redis-py")
    finally:
        client.close()


def test_ping_echo_time(h, c, r):
    assert h.run(c.ping()) is True
    h.check_parser(c)
    assert h.run(c.echo("hello")) == b"hello"
    assert h.run(c.echo(b"\x00bin\r\nary")) == b"\x00bin\r\nary"
    assert h.run(c.time()) == (0, 0)
    r.execute_command("DEBUG", "CLOCK", "SET", 1234567)
    assert h.run(c.time()) == (1234, 567000)


def test_cl_check_replies_are_lists_of_ints(h, c, r):
    replies = [h.run(c.execute_command("CL.CHECK", "k", 5, 2)) for _ in range(6)]
    assert replies == [[1, 5, 4, 0, 500], [1, 5, 3, 0, 1000], [1, 5, 2, 0, 1500],
                       [1, 5, 1, 0, 2000], [1, 5, 0, 0, 2500], [0, 5, 0, 500, 2500]]
    assert all(type(v) is int for reply in replies for v in reply)
    r.execute_command("DEBUG", "CLOCK", "ADVANCE", 500)
    assert h.run(c.execute_command("CL.CHECK", "k", 5, 2)) == [1, 5, 0, 0, 2500]
    assert h.run(c.execute_command("CL.CHECK", "k", 5, 2, "COST", 0)) == [1, 5, 0, 0, 2500]
    assert h.run(c.execute_command("CL.CHECK", "big", 5, 2, "COST", 6)) == [0, 5, 5, -1, 0]
    h.check_parser(c)


def test_concurrent_checks_on_one_key(h, c):
    # asyncio: 20 checks in flight at once over the pool; the clock is frozen.
    replies = h.gather([lambda: c.execute_command("CL.CHECK", "hot", 7, 1)] * 20)
    assert sorted(x[0] for x in replies) == [0] * 13 + [1] * 7
    assert sorted(x[2] for x in replies if x[0]) == [0, 1, 2, 3, 4, 5, 6]


def test_client_name_id_and_list(h, c):
    assert h.run(c.client_getname()) is None   # RESP3: the null is `_`
    assert h.run(c.client_setname("fl-test")) is True
    assert text(h.run(c.client_getname())) == "fl-test"   # RESP2 callbacks decode it
    my_id = h.run(c.client_id())
    assert type(my_id) is int and my_id > 0
    entries = h.run(c.client_list())
    mine = [e for e in entries if e["name"] == "fl-test"]
    assert len(mine) == 1
    assert mine[0]["id"] == str(my_id)
    assert mine[0]["resp"] == str(h.proto)
    assert mine[0]["lib-name"] == "redis-py"
    assert mine[0]["lib-ver"] == redis.__version__
    assert h.run(c.client_info())["id"] == my_id
    h.check_parser(c)


def test_client_name_from_the_connection_arguments(h, server, r):
    client = h.client(server.port, client_name="named-at-connect")
    assert text(h.run(client.client_getname())) == "named-at-connect"
    names = [e["name"] for e in r.client_list()]
    assert "named-at-connect" in names


def test_info_has_redis_sections_and_names(h, c, server):
    info = h.run(c.info())
    assert isinstance(info, dict)
    # one field of each default section, by its Redis name
    assert info["redis_version"] == "7.0.0"
    assert info["redis_mode"] == "standalone"
    assert info["tcp_port"] == server.port
    assert info["connected_clients"] >= 2
    assert isinstance(info["used_memory"], int) and info["used_memory"] > 0
    assert isinstance(info["total_commands_processed"], int)
    assert info["role"] == "master"
    assert "db0" not in info
    for section, field in [("server", "process_id"), ("clients", "maxclients"),
                           ("memory", "used_memory_human"), ("stats", "total_connections_received"),
                           ("persistence", "aof_enabled"), ("replication", "role")]:
        assert field in h.run(c.info(section)), section
    assert h.run(c.info("server"))["process_id"] == server.proc.pid
    assert "used_memory" not in h.run(c.info("server"))
    assert h.run(c.info("keyspace")) == {}
    for key in ("a", "b", "c"):
        h.run(c.execute_command("CL.CHECK", key, 5, 2))
    assert h.run(c.info("keyspace")) == {"db0": {"keys": 3, "expires": 3, "avg_ttl": 0}}
    assert h.run(c.info())["db0"]["keys"] == 3


def test_config_get_save_and_appendonly(h, c):
    assert h.run(c.config_get("save")) == {"save": ""}
    assert h.run(c.config_get("appendonly")) == {"appendonly": "no"}
    assert h.run(c.config_get("nosuchsetting")) == {}


def test_config_get_matches_redis_server(h, c, redis_server):
    real = h.client(redis_server.port)
    for name in ("save", "appendonly"):
        assert h.run(c.config_get(name)) == h.run(real.config_get(name))


def test_dbsize_flushall_select(h, c):
    assert h.run(c.dbsize()) == 0
    for key in ("a", "b", "c", "d"):
        h.run(c.execute_command("CL.CHECK", key, 5, 2))
    h.run(c.execute_command("CL.CHECK", "full", 5, 2, "COST", 0))   # full: not stored
    assert h.run(c.dbsize()) == 4
    assert h.run(c.flushall()) is True
    assert h.run(c.dbsize()) == 0
    assert h.run(c.select(0)) is True
    with pytest.raises(redis.ResponseError) as e:
        h.run(c.select(1))
    assert str(e.value) == "DB index is out of range"
    assert h.run(c.ping()) is True


def test_transaction_pipeline(h, c):
    assert h.run(c.config_resetstat()) is True
    pipe = c.pipeline(transaction=True)
    for _ in range(3):
        pipe.execute_command("CL.CHECK", "tx", 2, 1)
    pipe.ping()
    pipe.echo("x")
    pipe.dbsize()
    assert h.run(pipe.execute()) == [[1, 2, 1, 0, 1000], [1, 2, 0, 0, 2000],
                                     [0, 2, 0, 1000, 2000], True, b"x", 1]
    # The transaction ran as MULTI ... EXEC.
    stats = h.run(c.info("commandstats"))
    assert stats["cmdstat_multi"]["calls"] == 1
    assert stats["cmdstat_exec"]["calls"] == 1
    h.check_parser(c)


def test_transaction_pipeline_with_a_failing_command(h, c):
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("CL.CHECK", "tx2", 5, 2)
    pipe.execute_command("CL.CHECK", "tx2", "abc", 2)   # queued, fails when run
    pipe.execute_command("CL.CHECK", "tx2", 5, 2)
    results = h.run(pipe.execute(raise_on_error=False))
    assert results[0] == [1, 5, 4, 0, 500]
    assert isinstance(results[1], redis.ResponseError)
    assert "capacity is not an integer or out of range" in str(results[1])
    assert results[2] == [1, 5, 3, 0, 1000]
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("CL.CHECK", "tx2", 5, 2)
    pipe.execute_command("CL.CHECK", "tx2", 0, 2)
    with pytest.raises(redis.ResponseError):
        h.run(pipe.execute())
    assert h.run(c.execute_command("CL.CHECK", "tx2", 5, 2, "COST", 0)) == [1, 5, 2, 0, 1500]


def test_plain_pipeline(h, c):
    assert h.run(c.config_resetstat()) is True
    pipe = c.pipeline(transaction=False)
    for _ in range(100):
        pipe.execute_command("CL.CHECK", "pl", 10, 1)
    pipe.ping()
    results = h.run(pipe.execute())
    assert results[-1] is True
    checks = results[:-1]
    assert [x[0] for x in checks] == [1] * 10 + [0] * 90
    assert checks[9] == [1, 10, 0, 0, 10000]
    assert checks[10] == [0, 10, 0, 1000, 10000]
    stats = h.run(c.info("commandstats"))
    assert "cmdstat_multi" not in stats


def test_errors_raise_response_error_with_the_text(h, c):
    cases = [
        (("CL.CHECK", "k", "abc", 2), "capacity is not an integer or out of range"),
        (("CL.CHECK", "k", 0, 2), "capacity must be an integer from 1 to 10^15"),
        (("CL.CHECK", "k", 5, 0), "refill_per_sec must be an integer from 1 to 10^15"),
        (("CL.CHECK", "k", 5, 2, "COST", -1), "COST must be an integer from 0 to 10^15"),
        (("CL.CHECK", "k", 5), "wrong number of arguments for 'cl.check' command"),
        (("NOPE", "x"), "unknown command 'NOPE', with args beginning with: 'x' "),
    ]
    for args, text in cases:
        with pytest.raises(redis.ResponseError) as e:
            h.run(c.execute_command(*args))
        assert str(e.value) == text, args
    # the connection goes on, and nothing was spent
    assert h.run(c.execute_command("CL.CHECK", "k", 5, 2)) == [1, 5, 4, 0, 500]
    assert len(h.pooled(c)) == 1


def test_connection_pool_reuse(h, c, server, r):
    ids = {h.run(c.client_id()) for _ in range(10)}
    for _ in range(20):
        h.run(c.execute_command("CL.CHECK", "reuse", 100, 1))
    ids.add(h.run(c.client_id()))
    assert len(ids) == 1
    assert len(h.pooled(c)) == 1
    (only,) = ids
    mine = [e for e in r.client_list() if e["id"] == str(only)]
    assert len(mine) == 1 and mine[0]["resp"] == str(h.proto)


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("proto", [2, 3])
def test_password(make_server, api, proto):
    s = make_server("--requirepass", "pw")
    h = Harness(api, proto, "hiredis")
    try:
        good = h.client(s.port, password="pw")
        assert h.run(good.ping()) is True
        assert h.run(good.execute_command("CL.CHECK", "k", 5, 2))[0] == 1
        assert h.run(good.client_getname()) is None
        with pytest.raises(redis.AuthenticationError) as e:
            h.run(h.client(s.port, password="wrong").ping())
        assert "invalid username-password pair" in str(e.value)
        with pytest.raises(redis.AuthenticationError):
            h.run(h.client(s.port).ping())
        named = h.client(s.port, password="pw", username="default", client_name="authed")
        assert text(h.run(named.client_getname())) == "authed"
    finally:
        h.close()
    assert s.alive(), s.log()


def _entry(r, client_id: int):
    return [e for e in r.client_list() if e["id"] == str(client_id)]


def _outcome(h, thunk):
    try:
        return ("ok", h.run(thunk()))
    except redis.RedisError as e:
        return ("error", type(e).__name__)


def test_reset(h, c, r):
    assert h.run(c.client_setname("before-reset")) is True
    my_id = h.run(c.client_id())
    (entry,) = _entry(r, my_id)
    assert (entry["name"], entry["resp"]) == ("before-reset", str(h.proto))
    reply = h.run(c.execute_command("RESET"))
    assert text(reply) == "RESET"   # RESP2's callback decodes it, RESP3's does not
    (entry,) = _entry(r, my_id)     # same connection, back to RESP2, no name
    assert (entry["name"], entry["resp"]) == ("", "2")
    if h.proto == 2:
        assert h.run(c.client_getname()) is None
        assert h.run(c.execute_command("CL.CHECK", "after-reset", 5, 2)) == [1, 5, 4, 0, 500]
        assert h.run(c.client_id()) == my_id
    # On a RESP3 client the connection now speaks RESP2 behind redis-py's
    # back (as with Redis); what happens next is compared in test_reset_like_redis.


def test_reset_like_redis(h, server, r, redis_server):
    def scenario(port):
        # 1 s: with the pure-Python RESP3 parser the read after RESET times out,
        # against Redis as against fastlimit
        client = h.client(port, socket_timeout=1)
        h.run(client.client_setname("x"))
        return (_outcome(h, lambda: client.execute_command("RESET")),
                _outcome(h, lambda: client.client_getname()))
    assert scenario(server.port) == scenario(redis_server.port)


def test_quit(h, c, r, server):
    first = h.run(c.client_id())
    assert h.run(c.execute_command("QUIT")) is True
    for _ in range(100):   # the server closes it right after the +OK
        if not _entry(r, first):
            break
        time.sleep(0.01)
    assert _entry(r, first) == []
    assert server.alive()
    fresh = h.client(server.port)
    assert h.run(fresh.ping()) is True
    assert h.run(fresh.client_id()) > first


def test_quit_like_redis(h, server, r, redis_server):
    """What redis-py does on the connection after QUIT, as with Redis (once
    the server has really closed it: before that it is a race)."""
    def scenario(port, admin):
        client = h.client(port, socket_timeout=5)   # bounds a hang; a traced server may lag
        my_id = h.run(client.client_id())
        result = [_outcome(h, lambda: client.execute_command("QUIT"))]
        for _ in range(200):
            if not _entry(admin, my_id):
                break
            time.sleep(0.01)
        # The FIN after the server dropped the client must reach the client
        # before its next command: with asyncio only a running loop reads it,
        # so a blocking sleep left it unread and the outcome a race.
        h.pause(0.3)
        result += [_outcome(h, lambda: client.ping()), _outcome(h, lambda: client.ping())]
        return result
    real = redis_server.client(protocol=2)
    try:
        assert scenario(server.port, r) == scenario(redis_server.port, real)
    finally:
        real.close()


def test_resp3_null_and_replies_on_the_wire(server, r):
    with Wire.to(server.port) as w:
        w.send(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
        hello = w.read_reply()
        assert hello.startswith(b"%8\r\n$6\r\nserver\r\n")
        assert b"$5\r\nproto\r\n:3\r\n" in hello
        w.send(b"CLIENT GETNAME\r\n")
        assert w.read_reply() == b"_\r\n"
        w.send(b"*4\r\n$8\r\nCL.CHECK\r\n$2\r\nkk\r\n$1\r\n5\r\n$1\r\n2\r\n*1\r\n$4\r\nPING\r\n")
        assert w.read_reply() == b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n"
        assert w.read_reply() == b"+PONG\r\n"
        w.send(b"HELLO 2\r\nCLIENT GETNAME\r\n")
        assert w.read_reply().startswith(b"*16\r\n$6\r\nserver\r\n")
        assert w.read_reply() == b"$-1\r\n"
