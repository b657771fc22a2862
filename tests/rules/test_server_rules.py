"""Named rules through a real server: CL.RULE over the wire with redis-py
(RESP2 and RESP3), durability across a restart and a kill -9 right after
the acknowledgement, the rules file with SIGHUP and CL.RULE RELOAD, a
corrupt database or rules file refusing the start, INFO's rules section,
and rules changed under load without a client seeing an error."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import redis
from wire import longest_ping_while

from fastlimit.rules.files import load_rules_file

TB = {"capacity": 2, "refill_per_second": 1}


@pytest.fixture
def start(make_server, tmp_path, rules_store):
    """start(*args) -> a server with a rules database in tmp_path unless
    args give one, on each rules store (the SQLite rules-db, and a
    PostgreSQL table, of which the rules database is then the cache)."""
    db = str(tmp_path / "rules.db")

    def run(*args):
        if "--rules-db" not in args:
            args = ("--rules-db", db, *args)
        return make_server("--manual-clock", *rules_store, *args)
    run.db = db
    return run


def refused_start(make_server, *args) -> str:
    with pytest.raises(RuntimeError) as e:
        make_server("--manual-clock", *args)
    return str(e.value)


@pytest.mark.parametrize("protocol", [2, 3])
def test_rule_commands(start, protocol):
    c = start().client(protocol=protocol)
    assert c.execute_command("CL.RULE", "SET", "orders", json.dumps(
        {"match": {"resource": "POST /orders"}, **TB})) in (b"OK", "OK", True)
    assert json.loads(c.execute_command("CL.RULE", "GET", "orders")) == {
        "match": {"resource": "POST /orders"}, "algorithm": "token_bucket", "capacity": 2,
        "refill_per_second": 1, "mode": "enforce", "on_failure": "open", "key": "client"}
    assert c.execute_command("CL.RULE", "GET", "nope") is None
    assert c.execute_command("CL.RULE", "LIST") == [b"orders"]
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("CL.RULE", "SET", "orders", '{"capacity": 0, "refill_per_second": 1}')
    assert str(e.value) == ("invalid rule 'orders': capacity: must be an integer from 1 "
                            "to 10^15")
    assert json.loads(c.execute_command("CL.RULE", "GET", "orders"))["capacity"] == 2
    stats = c.execute_command("CL.RULE", "STATS", "orders")
    assert stats in ({b"allowed": 0, b"denied": 0, b"shadow_denied": 0},
                     [b"allowed", 0, b"denied", 0, b"shadow_denied", 0])
    assert c.execute_command("CL.RULE", "DEL", "orders") == 1
    assert c.execute_command("CL.RULE", "DEL", "orders") == 0
    assert c.execute_command("CL.RULE", "LIST") == []


def test_rules_survive_a_restart(start):
    s = start()
    c = s.client()
    c.execute_command("CL.RULE", "SET", "a", json.dumps(TB))
    c.execute_command("CL.RULE", "SET", "b", json.dumps({**TB, "mode": "shadow"}))
    c.execute_command("CL.RULE", "DEL", "a")
    s.stop()
    c = start().client()
    assert c.execute_command("CL.RULE", "LIST") == [b"b"]
    assert json.loads(c.execute_command("CL.RULE", "GET", "b"))["mode"] == "shadow"


def test_kill_9_right_after_the_acknowledgement(start):
    s = start()
    c = s.client()
    for i in range(20):
        c.execute_command("CL.RULE", "SET", f"r{i}", json.dumps({**TB, "capacity": i + 1}))
    s.proc.send_signal(signal.SIGKILL)     # the reply is in; nothing else happens
    s.proc.wait(10)
    c = start().client()
    assert len(c.execute_command("CL.RULE", "LIST")) == 20
    assert json.loads(c.execute_command("CL.RULE", "GET", "r19"))["capacity"] == 20
    assert c.execute_command("CL.LIMIT", "u", "GET /")[0] == 1


def test_a_corrupt_database_refuses_the_start(make_server, tmp_path):
    db = tmp_path / "rules.db"
    db.write_bytes(b"not a database\n" * 100)
    log = refused_start(make_server, "--rules-db", str(db))
    assert f"rules database {db} is unreadable (file is not a database)" in log
    assert db.read_bytes() == b"not a database\n" * 100


def test_a_database_in_use_refuses_the_start(start, make_server):
    start()
    log = refused_start(make_server, "--rules-db", start.db)
    assert f"rules database {start.db} is in use by another process" in log


RULES = """
[rules.orders]
match = { resource = "POST /orders" }
capacity = 20
refill_per_second = 10
"""


def test_rules_file_sighup_and_reload(start, tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    s = start("--rules-file", str(path))
    c = s.client()
    c.execute_command("CL.RULE", "SET", "mine", json.dumps(TB))
    assert c.execute_command("CL.RULE", "LIST") == [b"mine", b"orders"]

    path.write_text(RULES.replace("orders", "search"))
    s.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while c.execute_command("CL.RULE", "LIST") != [b"mine", b"search"]:
        assert time.monotonic() < deadline, s.log()
        time.sleep(0.02)

    path.write_text("[rules.bad]\ncapacity = 0\n")
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("CL.RULE", "RELOAD")
    assert str(e.value) == (f"rules file {path}: invalid rule 'bad': capacity: must be an "
                            "integer from 1 to 10^15")
    s.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "rules reload failed" not in s.log():
        assert time.monotonic() < deadline, s.log()
        time.sleep(0.02)
    assert c.execute_command("CL.RULE", "LIST") == [b"mine", b"search"]


def many_rules(count: int, capacity: int = 20) -> str:
    return "".join(f'[rules.r{i}]\nmatch = {{ resource = "GET /api/{i}/*" }}\n'
                   f"capacity = {capacity if i == 0 else 20}\nrefill_per_second = 10\n"
                   for i in range(count))


@pytest.mark.untraced
def test_the_server_answers_while_a_large_rules_file_is_read_on_sighup(start, tmp_path):
    """The file is read and checked in a thread; only its one changed rule
    is put in force on the loop."""
    path = tmp_path / "rules.toml"
    path.write_text(many_rules(10_000))
    s = start("--rules-db", "", "--rules-file", str(path))
    c = s.client()
    path.write_text(many_rules(10_000, capacity=7))
    began = time.perf_counter()
    load_rules_file(str(path))
    reading = time.perf_counter() - began     # what the loop would have stalled for
    assert reading > 0.2      # long enough that a stall of the loop would show
    longest = longest_ping_while(
        s.port, lambda: s.proc.send_signal(signal.SIGHUP),
        lambda: json.loads(c.execute_command("CL.RULE", "GET", "r0"))["capacity"] == 7,
        "the changed rule")
    assert longest < reading / 4, (longest, reading)
    assert c.info("default")["rules"] == 10_000


def test_a_bad_rules_file_refuses_the_start(make_server, tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("[rules.x]\ncapacity = 5\n")
    log = refused_start(make_server, "--rules-db", "", "--rules-file", str(path))
    assert (f"rules file {path}: invalid rule 'x': refill_per_second: required "
            "(or refill with period_ms)") in log


def test_info_rules_section(start):
    c = start().client()
    c.execute_command("CL.RULE", "SET", "api:orders", json.dumps(TB))
    info = c.info("rules")
    assert info["rules"] == 1 and info["rules_version"] == 1
    assert info["rules_last_change_ms"] > 1_600_000_000_000
    assert info["rule0"] == {"id": "api:orders", "algorithm": "token_bucket",
                             "mode": "enforce", "source": "command", "allowed": 0,
                             "denied": 0, "shadow_denied": 0}
    assert "rules" in c.info()


@pytest.mark.untraced
def test_rules_change_under_load(start):
    s = start()
    admin = s.client()
    stop, errors, checks = threading.Event(), [], [0]

    def load(n):
        c = s.client(protocol=3 if n % 2 else 2)
        while not stop.is_set():
            try:
                pipe = c.pipeline(transaction=False)
                for i in range(50):
                    pipe.execute_command("CL.LIMIT", f"user:{i}", "GET /products/1",
                                         "TIER", "free")
                for reply in pipe.execute():
                    assert len(reply) == 5
                checks[0] += 50
            except Exception as e:       # noqa: BLE001 - any error fails the test
                errors.append(e)
                return

    threads = [threading.Thread(target=load, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(60):
            admin.execute_command("CL.RULE", "SET", f"r{i % 5}", json.dumps(
                {"match": {"resource": "GET /products/*", "tier": "free"},
                 "capacity": 1 + i, "refill_per_second": 1,
                 **({"algorithm": "token_bucket"} if i % 2 else {"mode": "shadow"})}))
            if i % 7 == 0:
                admin.execute_command("CL.RULE", "DEL", f"r{(i + 2) % 5}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[0]
    assert checks[0] > 0
    assert s.alive(), s.log()
