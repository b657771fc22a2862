"""CONFIG GET and SET (server/commands/config.py) over raw sockets:
exact replies, all or nothing, the changed value in INFO.  The settings
compared with a real redis-server's: tests/server/test_config.py."""

from __future__ import annotations

from resp_values import Raw, info_fields, pairs


def test_config_get_and_set(make_server):
    s = make_server("--manual-clock")
    maxclients = b"*2\r\n$10\r\nmaxclients\r\n"
    with Raw.to(s.port) as conn:
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$5\r\n10000\r\n"
        assert conn.call("CONFIG", "SET", "maxclients", "50") == b"+OK\r\n"
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$2\r\n50\r\n"
        assert info_fields(conn.value("INFO", "clients"))["maxclients"] == "50"
        bad = conn.call("CONFIG", "SET", "maxclients", "lots")
        assert bad.startswith(b"-ERR CONFIG SET failed") and b"maxclients" in bad
        assert conn.call("CONFIG", "SET", "nosuch", "1") == (
            b"-ERR Unknown option or number of arguments for CONFIG SET - 'nosuch'\r\n")
        # all or nothing: a bad pair leaves the good one unapplied
        assert conn.call("CONFIG", "SET", "maxclients", "60", "nosuch", "1")[:1] == b"-"
        assert conn.call("CONFIG", "GET", "maxclients") == maxclients + b"$2\r\n50\r\n"
        assert conn.call("CONFIG", "SET", "save", "") == b"+OK\r\n"        # what it already is
        assert conn.call("CONFIG", "SET", "appendonly", "yes")[:1] == b"-"  # not possible
        got = pairs(conn.value("CONFIG", "GET", "max*"))
        assert got[b"maxclients"] == b"50" and got[b"maxmemory"] == b"0"
        conn.call("HELLO", "3")
        assert conn.value("CONFIG", "GET", "save", "appendonly") == {b"save": b"",
                                                                     b"appendonly": b"no"}
