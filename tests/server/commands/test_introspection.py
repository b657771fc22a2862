"""COMMAND (server/commands/introspection.py): INFO, DOCS, COUNT and LIST
in Redis 7's reply shapes in RESP2 and RESP3, read by hiredis, and the
key specs redis-py's cluster clients route by."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aredis
from redis._parsers import CommandsParser
from redis._parsers.commands import AsyncCommandsParser
from resp_values import RSet, Simple, as_map, decode, well_formed

# Key-spec flags as Redis 7 spells them (src/server.c, addReplyFlagsForKeyArgs).
REDIS_KEY_SPEC_FLAGS = {"RO", "RW", "OW", "RM", "access", "update", "insert", "delete",
                        "not_key", "incomplete", "variable_flags"}
REQUIRED_COMMANDS = {"cl.check", "cl.reset", "ping", "echo", "auth", "hello", "select", "client",
                     "command", "info", "config", "dbsize", "flushall", "time", "quit", "reset",
                     "shutdown", "multi", "exec", "discard", "debug"}


def _check_entry(entry, proto: int):
    assert isinstance(entry, list) and len(entry) == 10, entry
    name, arity, flags, first, last, step, acl, tips, specs, subs = entry
    assert isinstance(name, bytes) and isinstance(arity, int)
    assert all(isinstance(f, Simple) for f in flags)
    assert all(isinstance(x, int) for x in (first, last, step))
    assert all(isinstance(c, Simple) and c.startswith("@") for c in acl)
    if proto == 3:
        assert isinstance(flags, RSet) and isinstance(acl, RSet)
    assert isinstance(tips, list) and isinstance(specs, list) and isinstance(subs, list)
    for sub in subs:
        _check_entry(sub, proto)
        assert sub[0].startswith(name + b"|")


@pytest.mark.parametrize("proto", [2, 3])
def test_command_info_cl_check(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND", "INFO", "cl.check")
    well_formed(data)
    (entry,) = decode(data)
    _check_entry(entry, proto)
    name, arity, flags, first, last, step, acl, tips, specs, subs = entry
    assert (name, arity, first, last, step) == (b"cl.check", -4, 1, 1, 1)
    assert {"write", "denyoom", "fast"} <= set(flags)
    assert "@write" in acl
    assert tips == [] and subs == []
    (spec,) = specs
    spec = as_map(spec, proto)
    assert as_map(spec[b"begin_search"], proto)[b"type"] == b"index"
    assert as_map(as_map(spec[b"begin_search"], proto)[b"spec"], proto) == {b"index": 1}
    find_keys = as_map(spec[b"find_keys"], proto)
    assert find_keys[b"type"] == b"range"
    assert as_map(find_keys[b"spec"], proto) == {b"lastkey": 0, b"keystep": 1, b"limit": 0}
    key_flags = set(spec[b"flags"])
    assert "RW" in key_flags
    assert key_flags <= REDIS_KEY_SPEC_FLAGS, key_flags - REDIS_KEY_SPEC_FLAGS


@pytest.mark.parametrize("proto", [2, 3])
def test_command_and_count(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND")
    well_formed(data)
    entries = decode(data)
    for entry in entries:
        _check_entry(entry, proto)
    names = {e[0].decode() for e in entries}
    assert REQUIRED_COMMANDS <= names
    assert raw.value("COMMAND", "COUNT") == len(entries)
    assert sorted(raw.value("COMMAND", "LIST")) == sorted(e[0] for e in entries)
    (client,) = raw.value("COMMAND", "INFO", "client")
    assert {b"client|id", b"client|setname", b"client|getname", b"client|list",
            b"client|info", b"client|kill", b"client|setinfo"} <= {s[0] for s in client[9]}
    info = raw.value("COMMAND", "INFO", "ping", "nope", "CL.CHECK")
    assert info[0][0] == b"ping" and info[1] is None and info[2][0] == b"cl.check"


@pytest.mark.parametrize("proto", [2, 3])
def test_command_docs_cl_check(raw, proto):
    raw.call("HELLO", proto)
    data = raw.call("COMMAND", "DOCS", "cl.check")
    hiredis_view = well_formed(data)
    docs = as_map(decode(data), proto)
    assert list(docs) == [b"cl.check"]
    doc = as_map(docs[b"cl.check"], proto)
    for field in (b"summary", b"since", b"group", b"complexity"):
        assert isinstance(doc[field], bytes) and doc[field], field
    args = [as_map(a, proto) for a in doc[b"arguments"]]
    assert [a[b"name"] for a in args] == [b"key", b"capacity", b"refill_per_sec", b"cost",
                                          b"period", b"split", b"priority"]
    assert args[0][b"type"] == b"key" and args[0][b"key_spec_index"] == 0
    assert [a.get(b"token") for a in args[3:]] == [b"COST", b"PERIOD", b"SPLIT", b"PRIORITY"]
    assert all("optional" in a[b"flags"] for a in args[3:])
    assert hiredis_view   # hiredis reads it too
    # the whole table, as redis-cli asks for it at start
    everything = raw.call("COMMAND", "DOCS")
    well_formed(everything)
    assert set(as_map(decode(everything), proto)) >= {n.encode() for n in REQUIRED_COMMANDS}


@pytest.mark.parametrize("proto", [2, 3])
def test_cluster_client_finds_the_key(server, proto):
    # RedisCluster routes a command by CommandsParser over the COMMAND reply.
    client = server.client(protocol=proto)
    try:
        parser = CommandsParser(client)
        assert parser.get_keys(client, "CL.CHECK", "mykey", 5, 2) == ["mykey"]
        assert parser.get_keys(client, "CL.CHECK", "{user:1}:k", 5, 2, "COST", 3) == ["{user:1}:k"]
        assert parser.get_keys(client, "CL.RESET", "gone") == ["gone"]
        assert parser.get_keys(client, "PING") is None
        policies = parser.get_command_policies()
        assert policies["cl"]["check"].request_policy.value == "default_keyed"
    finally:
        client.close()
    assert redis.cluster.key_slot(b"{user:1}:k") == redis.cluster.key_slot(b"user:1")


def test_async_cluster_client_finds_the_key(server):
    async def main():
        client = aredis.Redis(host="127.0.0.1", port=server.port)
        try:
            parser = AsyncCommandsParser()
            await parser.initialize(client)
            return await parser.get_keys("CL.CHECK", "mykey", 5, 2)
        finally:
            await client.aclose()
    assert list(asyncio.run(main())) == ["mykey"]
