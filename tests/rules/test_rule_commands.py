"""CL.RULE's handlers, through the container command the table will hold,
with the registry reached as conn.core.app.rules (as in the server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fastlimit._resp import ReplyError, SimpleString
from fastlimit.server.commands.table import rule_container

TB = b'{"capacity": 20, "refill_per_second": 10}'


@pytest.fixture
def reg(fake_engine, store, registry_factory):
    return registry_factory(fake_engine, store)


@pytest.fixture
def call(reg):
    command = rule_container()
    standalone = SimpleNamespace(enabled=False)
    no_rls = SimpleNamespace(path=None)       # no rls-config: RELOAD is the rules file's
    app = SimpleNamespace(rules=reg, cluster=standalone, rls=no_rls, rules_store=None)
    conn = SimpleNamespace(core=SimpleNamespace(app=app,
                                                readonly=False), last_subcommand=None)

    def run(*args):
        return command.handler(conn, [b"CL.RULE", *[a if isinstance(a, bytes) else a.encode()
                                                    for a in args]])
    return run


def error(call, *args) -> str:
    with pytest.raises(ReplyError) as e:
        call(*args)
    return str(e.value)


def test_the_container():
    command = rule_container()
    assert command.name == "cl.rule" and command.arity == -2
    assert sorted(command.subcommands) == [b"del", b"denials", b"get", b"help", b"list",
                                           b"reload", b"set", b"stats"]
    arities = {name: c.arity for name, c in command.subcommands.items()}
    assert arities == {b"set": 4, b"get": 3, b"del": 3, b"list": 2, b"reload": 2,
                       b"stats": -2, b"denials": -2, b"help": 2}
    assert "write" in command.subcommands[b"set"].flags
    assert "readonly" in command.subcommands[b"get"].flags


def test_set_get_del_list(call):
    assert call("SET", "orders", TB) == SimpleString("OK")
    assert call("set", "a:b", '{"algorithm": "gcra", "burst": 1, "count": 2, "period_ms": 1000}') \
        == SimpleString("OK")
    assert call("GET", "orders") == (b'{"match":{},"algorithm":"token_bucket","capacity":20,'
                                     b'"refill_per_second":10,"mode":"enforce",'
                                     b'"on_failure":"open","key":"client"}')
    assert call("GET", "nope") is None
    assert call("LIST") == [b"a:b", b"orders"]
    assert call("DEL", "orders") == 1
    assert call("DEL", "orders") == 0
    assert call("LIST") == [b"a:b"]


def test_errors(call):
    assert error(call, "SET", "orders", '{"capacity": 0, "refill_per_second": 1}') == \
        "ERR invalid rule 'orders': capacity: must be an integer from 1 to 10^15"
    assert error(call, "SET", "bad id", TB) == \
        "ERR invalid rule id 'bad id': must be 1 to 128 characters of A-Z a-z 0-9 _ . : / -"
    assert error(call, "SET", b"caf\xe9", TB) == \
        "ERR invalid rule id 'caf\\ufffd': must be 1 to 128 characters of A-Z a-z 0-9 _ . : / -"
    assert error(call, "SET", "x", "{") == ("ERR invalid rule 'x': not valid JSON: Expecting "
                                            "property name enclosed in double quotes: "
                                            "line 1 column 2 (char 1)")
    assert error(call, "SET", "x") == "ERR wrong number of arguments for 'cl.rule|set' command"
    assert error(call, "GET") == "ERR wrong number of arguments for 'cl.rule|get' command"
    assert error(call, "NOPE") == "ERR unknown subcommand 'NOPE'. Try CL.RULE HELP."
    assert error(call, "RELOAD") == "ERR no rules file is configured (rules-file)"
    assert error(call, "STATS", "a", "b") == "ERR syntax error: CL.RULE STATS [<id>]"
    assert error(call, "DENIALS", "0") == "ERR count must be a positive integer"
    assert error(call, "DENIALS", "x") == "ERR count must be a positive integer"
    assert call("LIST") == []


def test_reload(call, reg, tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("[rules.f]\ncapacity = 1\nrefill_per_second = 1\n")
    reg.rules_file = str(path)
    assert call("RELOAD") == SimpleString("OK")
    assert call("LIST") == [b"f"]
    path.write_text("[rules.f]\ncapacity = 0\nrefill_per_second = 1\n")
    assert error(call, "RELOAD") == (f"ERR rules file {path}: invalid rule 'f': capacity: "
                                     "must be an integer from 1 to 10^15")
    assert call("LIST") == [b"f"]


def test_stats_and_denials(call, reg, fake_engine):
    call("SET", "a", TB)
    call("SET", "b", TB)
    fake_engine.counts[reg.num_by_id["a"]] = {"allowed": 4, "denied": 1, "shadow_denied": 0}
    assert call("STATS", "a") == {"allowed": 4, "denied": 1, "shadow_denied": 0}
    assert call("STATS", "nope") is None
    assert call("STATS") == {"a": {"allowed": 4, "denied": 1, "shadow_denied": 0},
                             "b": {"allowed": 0, "denied": 0, "shadow_denied": 0}}
    fake_engine.recent = [(10, reg.num_by_id["a"], b"user:1", 1),
                          (20, reg.num_by_id["b"], b"user:2", 3)]
    assert call("DENIALS") == [[20, b"b", b"user:2", 3], [10, b"a", b"user:1", 1]]
    assert call("DENIALS", "1") == [[20, b"b", b"user:2", 3]]


def test_help_lists_every_subcommand(call):
    lines = [str(line) for line in call("HELP")]
    assert lines[0].startswith("CL.RULE <subcommand>")
    assert [line.split(" -- ")[0] for line in lines[1:]] == [
        "SET", "GET", "DEL", "LIST", "RELOAD", "STATS", "DENIALS", "HELP"]
