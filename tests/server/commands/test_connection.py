"""The connection's own commands (server/commands/connection.py): HELLO
with each protocol, AUTH and SETNAME, and QUIT, over raw sockets."""

from __future__ import annotations

import pytest
from resp_values import Raw, as_map, decode, well_formed

HELLO_KEYS = {b"server", b"version", b"proto", b"id", b"mode", b"role", b"modules"}


@pytest.mark.parametrize("proto", [2, 3])
def test_hello(raw, proto):
    my_id = raw.value("CLIENT", "ID")
    data = raw.call("HELLO", proto)
    assert data[:1] == (b"%" if proto == 3 else b"*")
    hello = as_map(decode(data), proto)
    assert HELLO_KEYS <= set(hello)
    assert hello[b"proto"] == proto
    assert hello[b"id"] == my_id
    assert hello[b"mode"] == b"standalone"
    assert hello[b"role"] == b"master"
    assert hello[b"modules"] == []
    assert hello[b"version"] == b"7.0.0"
    assert well_formed(data)
    # the connection now speaks that protocol
    assert raw.call("CLIENT", "GETNAME") == (b"_\r\n" if proto == 3 else b"$-1\r\n")
    info = decode(raw.call("CLIENT", "INFO"))
    assert f" resp={proto} ".encode() in info


def test_hello_without_version_keeps_the_protocol(raw):
    assert as_map(raw.value("HELLO"), 2)[b"proto"] == 2
    raw.call("HELLO", "3")
    assert raw.value("HELLO")[b"proto"] == 3


def test_hello_setname_and_auth(raw):
    hello = raw.value("HELLO", "3", "AUTH", "default", "anything", "SETNAME", "hello-name")
    assert hello[b"proto"] == 3
    assert raw.call("CLIENT", "GETNAME") == b"$10\r\nhello-name\r\n"


def test_hello_with_password(make_server):
    s = make_server("--requirepass", "sekret")
    with Raw.to(s.port) as conn:
        assert conn.call("CL.CHECK", "k", "5", "2") == b"-NOAUTH Authentication required.\r\n"
        assert conn.call("HELLO", "3", "AUTH", "default", "nope") == (
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
        assert conn.call("HELLO", "3", "AUTH", "default", "sekret")[:1] == b"%"
        assert conn.call("CL.CHECK", "k", "5", "2") == b"*5\r\n:1\r\n:5\r\n:4\r\n:0\r\n:500\r\n"
    with Raw.to(s.port) as conn:
        assert conn.call("AUTH", "nope") == (
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n")
        assert conn.call("AUTH", "sekret") == b"+OK\r\n"
        assert conn.call("PING") == b"+PONG\r\n"
        assert conn.call("RESET") == b"+RESET\r\n"     # RESET logs the connection out
        assert conn.call("PING") == b"-NOAUTH Authentication required.\r\n"


def test_quit_closes_only_that_connection(raw, server):
    with Raw.to(server.port) as conn:
        assert conn.call("QUIT") == b"+OK\r\n"
        assert conn.read_until_closed(5) == b""
    assert raw.call("PING") == b"+PONG\r\n"
