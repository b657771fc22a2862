"""CLIENT (server/commands/client.py): ID, LIST, INFO and KILL ID over raw
sockets, the error texts compared with a real redis-server's.  KILL's
other filters, LIST's buffer fields and REPLY are in test_client_kill.py,
test_client_list_fields.py and test_client_reply.py beside this file."""

from __future__ import annotations

from resp_values import Raw, Verbatim, decode, run_sequence


def _fields(line: bytes) -> dict:
    return dict(part.split("=", 1) for part in line.decode().split())


def test_client_id_list_info(server, r):
    with Raw.to(server.port) as a, Raw.to(server.port) as b:
        id_a, id_b = a.value("CLIENT", "ID"), b.value("CLIENT", "ID")
        assert isinstance(id_a, int) and id_b > id_a
        assert a.call("CLIENT", "SETNAME", "alpha") == b"+OK\r\n"
        assert a.call("CLIENT", "SETINFO", "LIB-NAME", "mylib") == b"+OK\r\n"
        assert a.call("CLIENT", "SETINFO", "LIB-VER", "9.9") == b"+OK\r\n"
        listing = a.value("CLIENT", "LIST")
        assert isinstance(listing, bytes) and listing.endswith(b"\n")
        rows = {int(f["id"]): f for f in map(_fields, listing.splitlines())}
        assert {id_a, id_b} <= set(rows)
        me = rows[id_a]
        assert (me["name"], me["lib-name"], me["lib-ver"], me["resp"], me["db"]) == (
            "alpha", "mylib", "9.9", "2", "0")
        assert me["addr"] == "%s:%d" % a.sock.getsockname()
        assert me["laddr"] == "127.0.0.1:%d" % server.port
        only_b = a.value("CLIENT", "LIST", "ID", id_b)
        assert [int(_fields(x)["id"]) for x in only_b.splitlines()] == [id_b]
        assert a.value("CLIENT", "LIST", "TYPE", "normal").count(b"\n") == listing.count(b"\n")
        info = a.value("CLIENT", "INFO")
        assert info.endswith(b"\n") and info.count(b"\n") == 1
        assert _fields(info)["id"] == str(id_a)
        assert _fields(info)["name"] == "alpha"
        b.call("HELLO", "3")
        verbatim = b.call("CLIENT", "INFO")
        assert verbatim.startswith(b"=") and b"\r\ntxt:id=%d " % id_b in verbatim
        assert isinstance(decode(verbatim), Verbatim)


def test_client_info_names_the_subcommand_like_redis(server, redis_server):
    # Redis 7 reports cmd=client|info (the full subcommand name).
    def cmd_field(port):
        with Raw.to(port) as conn:
            return _fields(decode(conn.call("CLIENT", "INFO")))["cmd"]
    assert cmd_field(redis_server.port) == "client|info"
    assert cmd_field(server.port) == "client|info"


def test_client_kill_id(server, r):
    with Raw.to(server.port) as killer, Raw.to(server.port) as victim:
        victim_id = victim.value("CLIENT", "ID")
        killer_id = killer.value("CLIENT", "ID")
        assert killer.call("CLIENT", "KILL", "ID", victim_id) == b":1\r\n"
        assert victim.read_until_closed(5) == b""
        assert killer.call("CLIENT", "KILL", "ID", victim_id) == b":0\r\n"
        # SKIPME yes (the default) spares the caller
        assert killer.call("CLIENT", "KILL", "ID", killer_id) == b":0\r\n"
        assert killer.call("PING") == b"+PONG\r\n"
        ids = [int(_fields(x)["id"]) for x in killer.value("CLIENT", "LIST").splitlines()]
        assert victim_id not in ids and killer_id in ids
    assert server.alive()


def test_client_id_error_texts_like_redis(server, redis_server):
    commands = [("CLIENT", "KILL", "ID", "x"), ("CLIENT", "KILL", "ID", "0"),
                ("CLIENT", "LIST", "ID", "x")]
    assert run_sequence(server.port, commands) == run_sequence(redis_server.port, commands)
