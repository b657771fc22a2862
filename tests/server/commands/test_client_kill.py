"""CLIENT KILL by address, local address, type and SKIPME, and its old
form (CLIENT KILL <addr:port>), on both fastlimit and a real redis-server:
the same replies, and exactly the connections named are closed.
(CLIENT KILL ID is in test_client_command.py.)
"""

from __future__ import annotations

from wire import Wire


def addr_of(w: Wire) -> tuple[str, str]:
    """(addr, laddr) of a connection as the server names them, once the
    server has the connection (a PING answered)."""
    assert w.call("PING") == b"+PONG\r\n"
    here, there = w.sock.getsockname(), w.sock.getpeername()
    return f"{here[0]}:{here[1]}", f"{there[0]}:{there[1]}"


def test_client_kill_addr_closes_that_connection_only(port):
    with Wire.to(port) as killer, Wire.to(port) as victim, Wire.to(port) as bystander:
        addr, _ = addr_of(victim)
        assert killer.call("CLIENT", "KILL", "ADDR", addr) == b":1\r\n"
        assert victim.read_until_closed(5) == b""
        assert killer.call("CLIENT", "KILL", "ADDR", addr) == b":0\r\n"
        assert bystander.call("PING") == b"+PONG\r\n"


def test_client_kill_old_form_and_its_error(port):
    with Wire.to(port) as killer, Wire.to(port) as victim:
        addr, _ = addr_of(victim)
        assert killer.call("CLIENT", "KILL", addr) == b"+OK\r\n"
        assert victim.read_until_closed(5) == b""
        assert killer.call("CLIENT", "KILL", addr) == b"-ERR No such client\r\n"
        assert killer.call("PING") == b"+PONG\r\n"


def test_client_kill_skipme_no_closes_the_caller_too(make_server):
    # its own server: LADDR names every connection to the server
    port = make_server().port
    with Wire.to(port) as killer, Wire.to(port) as victim:
        _, laddr = addr_of(killer)
        addr_of(victim)
        # LADDR names the server's end, shared by every connection to it
        killer.send(b"*6\r\n$6\r\nCLIENT\r\n$4\r\nKILL\r\n$5\r\nLADDR\r\n$%d\r\n%s\r\n"
                    b"$6\r\nSKIPME\r\n$2\r\nno\r\n" % (len(laddr), laddr.encode()))
        assert victim.read_until_closed(5) == b""
        assert killer.read_until_closed(5) in (b"", b":2\r\n")   # the reply may be lost


def test_client_kill_type_and_bad_filters(port):
    with Wire.to(port) as killer, Wire.to(port) as victim:
        victim_addr, _ = addr_of(victim)
        assert killer.call("CLIENT", "KILL", "TYPE", "pubsub") == b":0\r\n"
        assert killer.call("CLIENT", "KILL", "TYPE", "replica") == b":0\r\n"
        assert killer.call("CLIENT", "KILL", "ADDR", victim_addr, "TYPE", "normal") == b":1\r\n"
        assert victim.read_until_closed(5) == b""
        assert killer.call("CLIENT", "KILL", "ADDR", "x", "SKIPME") == b"-ERR syntax error\r\n"
        assert killer.call("CLIENT", "KILL", "NOSUCH", "x") == b"-ERR syntax error\r\n"
        assert killer.call("CLIENT", "KILL", "ID", "0").startswith(b"-ERR client-id should be")
        assert killer.call("PING") == b"+PONG\r\n"


def test_client_kill_bad_skipme_kills_nothing(port):
    # It used to kill every client, the caller included (issue 16).
    with Wire.to(port) as killer, Wire.to(port) as bystander:
        addr_of(bystander)
        assert killer.call("CLIENT", "KILL", "SKIPME", "yes_or_no") == b"-ERR syntax error\r\n"
        assert killer.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "maybe") \
            == b"-ERR syntax error\r\n"
        assert bystander.call("PING") == b"+PONG\r\n"
        assert killer.call("PING") == b"+PONG\r\n"


def test_client_kill_unknown_type(port):
    with Wire.to(port) as killer:
        assert killer.call("CLIENT", "KILL", "TYPE", "wrong_type") \
            == b"-ERR Unknown client type 'wrong_type'\r\n"
