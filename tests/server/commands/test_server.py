"""The server's administration (server/commands/server.py): INFO's
sections and default fields, the manual clock refused without
--manual-clock, and SHUTDOWN.  INFO with several section names is in
test_info_sections.py beside this file."""

from __future__ import annotations

import time

import pytest
from resp_values import Raw, decode, info_fields
from wire import command

SECTIONS = ["server", "clients", "memory", "persistence", "stats", "replication", "cpu",
            "keyspace", "commandstats", "errorstats"]
DEFAULT_FIELDS = ["redis_version", "redis_mode", "process_id", "run_id", "tcp_port",
                  "uptime_in_seconds", "connected_clients", "maxclients", "used_memory",
                  "used_memory_human", "used_memory_rss", "used_memory_peak", "maxmemory",
                  "loading", "aof_enabled", "total_connections_received",
                  "total_commands_processed", "instantaneous_ops_per_sec",
                  "total_net_input_bytes", "total_net_output_bytes", "rejected_connections",
                  "expired_keys", "role", "connected_slaves", "used_cpu_sys"]


@pytest.mark.parametrize("section", SECTIONS)
def test_info_section(raw, server, section):
    text = raw.value("INFO", section)
    assert isinstance(text, bytes)
    lines = text.split(b"\r\n")
    assert lines[0].lower() == b"# " + section.encode()
    assert text.endswith(b"\r\n")
    assert all(b":" in line for line in lines[1:-1]), lines
    assert text.count(b"# ") == 1   # only the section asked for


def test_info_section_headers_like_redis(server, redis_server):
    def headers(port):
        with Raw.to(port) as conn:
            return [decode(conn.call("INFO", s)).split(b"\r\n")[0] for s in SECTIONS]
    assert headers(server.port) == headers(redis_server.port)


def test_info_default(raw, server):
    text = raw.value("INFO")
    fields = info_fields(text)
    for name in DEFAULT_FIELDS:
        assert name in fields, name
    assert fields["tcp_port"] == str(server.port)
    assert fields["process_id"] == str(server.proc.pid)
    assert fields["role"] == "master"
    assert int(fields["connected_clients"]) >= 2
    headers = [line for line in text.decode().split("\r\n") if line.startswith("# ")]
    for section in ("server", "clients", "memory", "stats", "keyspace"):
        assert f"# {section}" in [h.lower() for h in headers]
    assert info_fields(raw.value("INFO", "all")).keys() >= fields.keys() - {"db0"}


def test_info_keyspace(raw):
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\n"
    for key in ("k1", "k2", "k3"):
        raw.call("CL.CHECK", key, "5", "2")
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\ndb0:keys=3,expires=3,avg_ttl=0\r\n"
    assert info_fields(raw.value("INFO"))["db0"] == "keys=3,expires=3,avg_ttl=0"
    raw.call("CL.RESET", "k2")
    assert raw.value("DBSIZE") == 2
    assert raw.value("INFO", "keyspace") == b"# Keyspace\r\ndb0:keys=2,expires=2,avg_ttl=0\r\n"


def test_info_stats_count(raw):
    assert raw.call("CONFIG", "RESETSTAT") == b"+OK\r\n"
    for _ in range(3):
        raw.call("CL.CHECK", "s", "5", "2")
    raw.call("NOPE")
    stats = info_fields(raw.value("INFO", "commandstats"))
    assert stats["cmdstat_cl.check"].startswith("calls=3,")
    assert int(info_fields(raw.value("INFO", "stats"))["total_error_replies"]) == 1


# ---- manual clock, SHUTDOWN ----------------------------------------------------------

def test_debug_clock_refused_without_manual_clock(make_server):
    s = make_server()
    with Raw.to(s.port) as conn:
        refused = b"-ERR DEBUG CLOCK SET/ADVANCE need the server started with --manual-clock\r\n"
        assert conn.call("DEBUG", "CLOCK", "SET", "5") == refused
        assert conn.call("DEBUG", "CLOCK", "ADVANCE", "5") == refused
        now = conn.value("DEBUG", "CLOCK", "GET")
        assert abs(now - time.time() * 1000) < 60_000    # the wall clock, in ms
        secs, usecs = conn.value("TIME")
        assert abs(int(secs) - time.time()) < 60 and 0 <= int(usecs) < 1_000_000


def test_shutdown(make_server):
    s = make_server("--manual-clock")
    with Raw.to(s.port) as other, Raw.to(s.port) as conn:
        assert other.call("PING") == b"+PONG\r\n"
        conn.send(command("SHUTDOWN"))
        assert conn.read_until_closed() == b""   # as Redis: no reply, the connection closes
        assert other.read_until_closed() == b""
    assert s.proc.wait(10) == 0
    assert "Traceback" not in s.log()


def test_shutdown_bad_option_keeps_running(make_server):
    s = make_server()
    with Raw.to(s.port) as conn:
        assert conn.call("SHUTDOWN", "FOO") == b"-ERR syntax error\r\n"
        assert conn.call("SHUTDOWN", "ABORT") == b"-ERR No shutdown in progress.\r\n"
        assert conn.call("PING") == b"+PONG\r\n"
    assert s.alive()
