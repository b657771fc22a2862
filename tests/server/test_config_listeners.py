"""CONFIG SET port and bind at runtime, as Redis 7: the new listeners
serve, the old ones stop accepting, the connections already open stay;
an address that cannot be bound leaves everything as it was and answers
Redis's error, compared with a real redis-server (issue 16)."""

from __future__ import annotations

import socket

import pytest

from wire import Wire, free_port, wait_until

PORT_ERROR = (b"-ERR CONFIG SET failed (possibly related to argument 'port') - "
              b"Unable to listen on this port. Check server logs.\r\n")
BIND_ERROR = (b"-ERR CONFIG SET failed (possibly related to argument 'bind') - "
              b"Failed to bind to specified addresses.\r\n")


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_port_moves_and_open_connections_stay(make_server):
    srv = make_server()
    old = srv.port
    new = free_port()
    with Wire.to(old) as c:
        assert c.call("CONFIG", "SET", "port", new) == b"+OK\r\n"
        assert c.call("PING") == b"+PONG\r\n"            # its connection stays
        with Wire.to(new) as d:
            assert d.call("CONFIG", "GET", "port") == b"*2\r\n$4\r\nport\r\n$%d\r\n%d\r\n" % (
                len(str(new)), new)
        wait_until(lambda: refuses(old), what="the old port closed")
        assert c.call("PING") == b"+PONG\r\n"
        # and back: the same port again is no change
        assert c.call("CONFIG", "SET", "port", new, "bind", "127.0.0.1") == b"+OK\r\n"
        with Wire.to(new) as d:
            assert d.call("PING") == b"+PONG\r\n"


@pytest.fixture(params=["fastlimit", "redis"])
def port(request, server, redis_server):
    return server.port if request.param == "fastlimit" else redis_server.port


def test_port_in_use_changes_nothing(port):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        with Wire.to(port) as c:
            hz = c.call("CONFIG", "GET", "hz")
            assert c.call("CONFIG", "SET", "hz", "37", "port", taken.getsockname()[1]) \
                == PORT_ERROR
            assert c.call("CONFIG", "GET", "hz") == hz          # rolled back
            with Wire.to(port) as d:                            # still listening
                assert d.call("PING") == b"+PONG\r\n"
    finally:
        taken.close()


def test_bind_to_a_foreign_address_changes_nothing(port):
    with Wire.to(port) as c:
        bind = c.call("CONFIG", "GET", "bind")
        # 192.0.2.1 (TEST-NET-1) is no address of this machine: bind fails at once
        assert c.call("CONFIG", "SET", "bind", "192.0.2.1") == BIND_ERROR
        assert c.call("CONFIG", "GET", "bind") == bind
        with Wire.to(port) as d:
            assert d.call("PING") == b"+PONG\r\n"
