"""INFO with several section names: the union of the sections named, and
the default, all and everything groups, as Redis 7.0 (issue 16); the
section titles compared with a real redis-server's where both have them."""

from __future__ import annotations

import pytest
from wire import Wire


def titles(port: int, *names: str) -> list[str]:
    with Wire.to(port) as w:
        reply = w.call("INFO", *names)
    body = reply.split(b"\r\n", 1)[1].decode()
    return [line[2:] for line in body.split("\r\n") if line.startswith("# ")]


@pytest.mark.parametrize("names, expected", [
    (("cpu",), ["CPU"]),
    (("cpu", "sentinel"), ["CPU"]),                 # unknown names add nothing
    (("CPU", "Server"), ["Server", "CPU"]),         # any case, in INFO's order
    (("cpu", "cpu", "clients"), ["Clients", "CPU"]),
])
def test_named_sections_as_redis(server, redis_server, names, expected):
    assert titles(server.port, *names) == expected
    assert titles(redis_server.port, *names) == expected


def test_groups_and_their_unions(server):
    default = titles(server.port)
    assert titles(server.port, "default") == default
    assert "Commandstats" not in default and "CPU" in default
    everything = titles(server.port, "all")
    assert titles(server.port, "everything") == everything
    assert set(everything) > set(default) and "Commandstats" in everything
    # a group with a section already in it: each section once
    assert titles(server.port, "cpu", "default") == default
    assert titles(server.port, "cpu", "all") == everything
    assert titles(server.port, "commandstats", "default") == [
        t for t in everything if t in default or t == "Commandstats"]
    with Wire.to(server.port) as w:
        assert w.call("INFO", "cpu", "all").count(b"used_cpu_user:") == 1
