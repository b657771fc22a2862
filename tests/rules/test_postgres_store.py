"""A PostgreSQL rules-store, with a real PostgreSQL (tests/support/
postgres.py) and real nodes: a change through any node or through plain
SQL is in force on every node; rows that do not validate are named and
not applied; the connect order, reconnects, a crash of the database and
a stalled connection, conditional writes from two nodes, bulk changes,
10,000 rules at start, and the start while the database is down.

Real time throughout: propagation is what these tests are about.  Every
wait is bounded (wire.wait_until)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
from http_rules import Node, call
from postgres import PostgresServer
from proxy import Proxy
from servers import readme_block, run_lines
from wire import free_port, wait_until

from fastlimit.rules.postgres import SCHEMA_DDL, TABLE, parse_notification

ROOT = Path(__file__).resolve().parents[2]
RULE = {"match": {"resource": "api/*"}, "capacity": 3, "refill_per_second": 1}
# What a node needs to notice a lost or silent connection quickly here.
QUICK = ("--rules-store-heartbeat", "0.2", "--rules-store-timeout", "1",
         "--rules-store-resync", "30")


@pytest.fixture
def own_pg():
    """A PostgreSQL of the test's own, for tests that stop it."""
    server = PostgresServer().start()
    yield server
    server.remove()


@pytest.fixture
def node(make_server, tmp_path):
    """node(url, *args) -> a server following the store at url, with its
    cache file in tmp_path (one per node) and an HTTP front."""
    count = [0]

    def start(url, *args, cache=None):
        count[0] += 1
        http = free_port()
        server = make_server("--rules-store", url,
                             "--rules-db", cache or str(tmp_path / f"cache{count[0]}.db"),
                             "--http-port", str(http), *QUICK, *args)
        server.http = Node(server, http)
        return server
    return start


def doc(capacity: int, resource: str = "api/*") -> str:
    return json.dumps({"match": {"resource": resource}, "capacity": capacity,
                       "refill_per_second": 1})


def rule_of(server, rule_id: str):
    with server.client() as c:
        found = c.execute_command("CL.RULE", "GET", rule_id)
    return json.loads(found) if found is not None else None


def capacity(server, rule_id: str) -> int | None:
    rule = rule_of(server, rule_id)
    return rule["capacity"] if rule else None


def store_info(server) -> dict:
    with server.client() as c:
        return c.info("rules")


def sql_insert(pg, db: str, rule_id: str, text: str) -> None:
    pg.sql(f"INSERT INTO {TABLE} (id, doc) VALUES ('{rule_id}', '{text}')", db)


def db_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


def all_have(servers, rule_id: str, cap: int | None, timeout: float = 10):
    wait_until(lambda: all(capacity(s, rule_id) == cap for s in servers), timeout,
               f"{rule_id} with capacity {cap} on every node")


# ---- one table, every node ----------------------------------------------------------

def test_a_change_through_any_node_or_plain_sql_is_in_force_on_every_node(pg, node):
    url = pg.create_database()
    nodes = [node(url) for _ in range(3)]
    with nodes[0].client() as c:
        assert c.execute_command("CL.RULE", "SET", "api", json.dumps(RULE)) == b"OK"
        # read-your-writes: in force on the writer as the reply comes
        assert json.loads(c.execute_command("CL.RULE", "GET", "api"))["capacity"] == 3
    all_have(nodes, "api", 3)
    # enforced on another node, not only listed
    with nodes[2].client() as c:
        replies = [c.execute_command("CL.LIMIT", "alice", "api/x")[0] for _ in range(4)]
    assert replies == [1, 1, 1, 0]
    sql_insert(pg, db_of(url), "by-sql", doc(9))
    all_have(nodes, "by-sql", 9)
    pg.sql(f"UPDATE {TABLE} SET doc = jsonb_set(doc, '{{capacity}}', '11') WHERE id = 'by-sql'",
           db_of(url))
    all_have(nodes, "by-sql", 11)
    with nodes[1].client() as c:
        assert c.execute_command("CL.RULE", "DEL", "api") == 1
    all_have(nodes, "api", None)
    pg.sql(f"DELETE FROM {TABLE} WHERE id = 'by-sql'", db_of(url))
    all_have(nodes, "by-sql", None)
    row = pg.sql(f"SELECT count(*) FROM {TABLE}", db_of(url))
    assert row == "0"
    info = store_info(nodes[1])
    assert info["rules_store_state"] == "connected" and info["rules_store_notifications"] >= 4


def test_a_node_stops_at_once_right_after_its_own_changes(pg, node):
    # Regression: a change's own notification setting the follower's wake
    # event as the stop cancelled its wait was lost by 3.11's wait_for
    # (it returned instead of raising), and the follower never ended: the
    # node hung at SIGTERM in about half of these rounds, until SIGKILL.
    url = pg.create_database()
    for round_ in range(6):
        server = node(url)
        for capacity in (2, 3, 2):
            assert server.http("PUT", "/v1/rules/orders",
                               {**RULE, "capacity": capacity}).status in (200, 201)
        assert server.stop(timeout=5) == 0, f"round {round_}: {server.log()[-2000:]}"
        assert "ready to exit, bye bye" in server.log()


def test_who_and_when_are_recorded_and_every_change_takes_a_higher_version(pg, node):
    url = pg.create_database()
    db = db_of(url)
    n = node(url)

    def row(rule_id):
        return pg.sql(f"SELECT version, source, updated_by, updated_at <= now() FROM {TABLE} "
                      f"WHERE id = '{rule_id}'", db).split("|")
    with n.client() as c:
        c.execute_command("CL.RULE", "SET", "a", doc(1))
        first = int(row("a")[0])
        c.execute_command("CL.RULE", "SET", "a", doc(1))     # the same document: no change
        assert int(row("a")[0]) == first
        c.execute_command("CL.RULE", "SET", "a", doc(2))
    version, source, by, when = row("a")
    assert int(version) > first and source == "command" and when == "t"
    assert re.fullmatch(r"postgres \(fastlimit 127\.0\.0\.1:\d+\)", by), by
    assert store_info(n)["rules_store_version"] == int(version)
    sql_insert(pg, db, "b", doc(3))
    b_version, b_source, b_by, _ = row("b")
    assert int(b_version) > int(version) and (b_source, b_by) == ("sql", "postgres (psql)")
    wait_until(lambda: store_info(n)["rules_store_version"] == int(b_version))
    # a hand UPDATE that sets the version itself still takes a new one
    pg.sql(f"UPDATE {TABLE} SET version = 1 WHERE id = 'b'", db)
    assert int(row("b")[0]) > int(b_version)


def test_a_row_that_does_not_validate_is_named_and_keeps_the_previous_version(pg, node):
    url = pg.create_database()
    db = db_of(url)
    nodes = [node(url), node(url)]
    sql_insert(pg, db, "good", doc(5))
    all_have(nodes, "good", 5)
    pg.sql(f"UPDATE {TABLE} SET doc = '{{\"capacity\": 0}}' WHERE id = 'good'", db)
    sql_insert(pg, db, "never", '{"capacity": "many"}')
    sql_insert(pg, db, "fine", doc(2))
    all_have(nodes, "fine", 2)
    for n in nodes:
        assert capacity(n, "good") == 5            # the previous version stays in force
        assert capacity(n, "never") is None
        info = store_info(n)
        assert info["rules_store_rejected_now"] == 2
        reasons = {v["id"]: v for k, v in info.items() if k.startswith("rejected")}
        assert "capacity: must be an integer from 1 to 10^15" in reasons["good"]["reason"]
        assert "capacity" in reasons["never"]["reason"]
        assert re.search(r"rule good version \d+ not applied, its previous version in force: "
                         r"invalid rule 'good': capacity", n.log())
        metrics = call(n.http.port, "GET", "/metrics").body.decode()
        assert re.search(r'fastlimit_rules_store_rejected_row\{rule="good",version="\d+"\} 1',
                         metrics)
        assert "fastlimit_rules_store_rows_rejected_total 2" in metrics
    # fixed by SQL: applied, and no longer named
    pg.sql(f"UPDATE {TABLE} SET doc = '{doc(6)}' WHERE id = 'good'", db)
    all_have(nodes, "good", 6)
    assert all(store_info(n)["rules_store_rejected_now"] == 1 for n in nodes)


def test_a_notification_for_a_row_that_no_longer_exists_changes_nothing(pg, node):
    url = pg.create_database()
    n = node(url)
    ghost = json.dumps({"id": "ghost", "v": 9, "op": "update"})
    pg.sql(f"SELECT pg_notify('fastlimit_rules', '{ghost}');"
           "SELECT pg_notify('fastlimit_rules', 'not json at all')", db_of(url))
    wait_until(lambda: store_info(n)["rules_store_notifications"] == 2)
    sql_insert(pg, db_of(url), "real", doc(4))
    all_have([n], "real", 4)
    with n.client() as c:
        assert c.execute_command("CL.RULE", "LIST") == [b"real"]
    assert store_info(n)["rules_store_full_reads"] >= 2     # the garbled one asked for a full read


def test_the_readme_gives_the_ddl_and_a_table_made_by_hand_is_used(pg, node):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```sql\n(.*?)```", readme[readme.index("## Rules for a fleet"):], re.S)
    assert block is not None and block.group(1).strip() == SCHEMA_DDL.strip()
    url = pg.create_database()
    pg.sql(block.group(1), db_of(url))          # a DBA creates it first
    sql_insert(pg, db_of(url), "made", doc(3))
    n = node(url)
    assert capacity(n, "made") == 3


def test_the_readmes_fleet_lines_work_with_a_real_postgresql(pg, tmp_path):
    """As written, but for the database: the README's 127.0.0.1:5432 is the
    test's PostgreSQL, reached by its socket (the lines run in a network
    namespace of their own, where its port is not)."""
    lines = readme_block("### Rules for a fleet from PostgreSQL")
    assert [line.split()[0] for line in lines] == [
        "fastlimit-server", "fastlimit-server", "redis-cli", "psql", "sleep", "redis-cli"]
    url = pg.create_database()
    here = f"postgresql://postgres@/{db_of(url)}?host={pg.dir}&port={pg.port}"
    lines = [line.replace("postgresql://postgres@127.0.0.1:5432/postgres", shlex.quote(here))
             for line in lines]
    seen = run_lines(tmp_path, lines)
    assert all(s["alive"] for s in seen["servers"]), seen
    assert [c["rc"] for c in seen["commands"]] == [0, 0, 0, 0], seen
    assert seen["commands"][0]["out"] == "OK\n"
    assert json.loads(seen["commands"][-1]["out"])["capacity"] == 30


# ---- conditional writes -----------------------------------------------------------

def test_two_writers_with_one_etag_on_two_nodes_exactly_one_wins(pg, node):
    url = pg.create_database()
    a, b = node(url), node(url)
    assert a.http("PUT", "/v1/rules/shared", RULE).status == 201
    all_have([a, b], "shared", 3)
    etag = a.http("GET", "/v1/rules/shared").headers["etag"]
    assert b.http("GET", "/v1/rules/shared").headers["etag"] == etag
    replies = {}

    def put(name, n, cap):
        replies[name] = n.http("PUT", "/v1/rules/shared", {**RULE, "capacity": cap},
                               {"If-Match": etag})
    threads = [threading.Thread(target=put, args=("a", a, 10)),
               threading.Thread(target=put, args=("b", b, 20))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r.status for r in replies.values()) == [200, 412]
    winner = 10 if replies["a"].status == 200 else 20
    all_have([a, b], "shared", winner)
    loser = replies["b" if winner == 10 else "a"]
    assert "another writer changed the rule first" in loser.problem()["detail"] or \
        "the current ETag is" in loser.problem()["detail"]
    # the same on one node: the second writer of the old tag loses
    etag = a.http("GET", "/v1/rules/shared").headers["etag"]
    assert a.http("PUT", "/v1/rules/shared", {**RULE, "capacity": 7},
                  {"If-Match": etag}).status == 200
    assert a.http("PUT", "/v1/rules/shared", {**RULE, "capacity": 8},
                  {"If-Match": etag}).status == 412
    assert a.http("PUT", "/v1/rules/shared", RULE, {"If-None-Match": "*"}).status == 412
    assert a.http("DELETE", "/v1/rules/shared", headers={"If-Match": etag}).status == 412
    # read-your-writes on the writer; the other node follows within its bound
    assert capacity(a, "shared") == 7
    all_have([a, b], "shared", 7)


def test_a_write_whose_version_changed_in_the_table_meanwhile_is_refused(pg, node):
    """The precondition holds against the node's own copy, and the table's
    row changes while the write waits for it: the conditional update
    finds another version and refuses, and the node catches up."""
    url = pg.create_database()
    a = node(url)
    assert a.http("PUT", "/v1/rules/r", RULE).status == 201
    etag = a.http("GET", "/v1/rules/r").headers["etag"]
    holder = subprocess.Popen(
        ["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres",
         "-d", db_of(url)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        holder.stdin.write(f"BEGIN; UPDATE {TABLE} SET doc = '{doc(30)}' WHERE id = 'r';\n"
                           "SELECT pg_sleep(0.5);\nCOMMIT;\n")
        holder.stdin.flush()
        wait_until(lambda: pg.sql("SELECT count(*) FROM pg_locks WHERE mode = "
                                  "'RowExclusiveLock' AND granted", db_of(url)) != "0", 10)
        reply = a.http("PUT", "/v1/rules/r", {**RULE, "capacity": 4}, {"If-Match": etag})
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert reply.status == 412, reply.body
    assert "another writer changed the rule first" in reply.problem()["detail"]
    all_have([a], "r", 30)
    assert reply.headers["etag"] == a.http("GET", "/v1/rules/r").headers["etag"]


# ---- outages ----------------------------------------------------------------------

def test_checks_go_on_through_a_crash_of_the_database_and_every_node_converges(own_pg, node):
    pg = own_pg
    url = pg.create_database()
    db = db_of(url)
    nodes = [node(url), node(url)]
    with nodes[0].client() as c:
        c.execute_command("CL.RULE", "SET", "api", doc(1000))
    all_have(nodes, "api", 1000)
    stop = threading.Event()
    failures, checks = [], [0]

    def check():
        with nodes[1].client() as c:
            while not stop.is_set():
                try:
                    c.execute_command("CL.LIMIT", "bob", "api/x")
                    checks[0] += 1
                except redis.RedisError as e:
                    failures.append(e)
                time.sleep(0.002)
    checker = threading.Thread(target=check)
    checker.start()
    try:
        pg.stop("immediate")
        wait_until(lambda: all(store_info(n)["rules_store_state"] != "connected"
                               for n in nodes), 10, "every node to see the database gone")
        with nodes[0].client() as c, pytest.raises(redis.RedisError) as e:
            c.execute_command("CL.RULE", "SET", "api", doc(5))
        assert "rules store postgresql://postgres@127.0.0.1" in str(e.value)
        assert "nothing changed" in str(e.value)
        refused = nodes[1].http("PUT", "/v1/rules/api", json.loads(doc(5)))
        assert refused.status == 503 and refused.problem()["code"] == "TRYAGAIN"
        assert all(capacity(n, "api") == 1000 for n in nodes)
        assert nodes[0].http("GET", "/readyz").status == 200
        before = checks[0]
        wait_until(lambda: checks[0] > before + 50, 10, "checks while the database is down")
        pg.start()
        pg.sql(f"UPDATE {TABLE} SET doc = '{doc(77)}' WHERE id = 'api'", db)
        all_have(nodes, "api", 77, timeout=20)
    finally:
        stop.set()
        checker.join(10)
    assert failures == []
    assert all(store_info(n)["rules_store_state"] == "connected" for n in nodes)
    assert all(store_info(n)["rules_store_connects"] >= 2 for n in nodes)


def test_a_stalled_connection_is_found_by_the_heartbeat(pg, node):
    url = pg.create_database()
    proxy = Proxy(pg.port)
    try:
        n = node(pg.url_for(db_of(url), port=proxy.port))
        direct = node(url)
        with n.client() as c:
            c.execute_command("CL.RULE", "SET", "api", doc(3))
        proxy.stall()
        wait_until(lambda: store_info(n)["rules_store_state"] != "connected", 10,
                   "the heartbeat to find the stall")
        with n.client() as c:
            assert c.execute_command("CL.LIMIT", "carol", "api/x")[0] == 1
            with pytest.raises(redis.RedisError, match="unavailable"):
                c.execute_command("CL.RULE", "SET", "api", doc(4))
        with direct.client() as c:
            c.execute_command("CL.RULE", "SET", "api", doc(12))
        proxy.restore()
        all_have([n, direct], "api", 12, timeout=20)
    finally:
        proxy.close()


def test_a_killed_listener_reconnects_and_reads_what_it_missed(pg, node):
    url = pg.create_database()
    db = db_of(url)
    n = node(url)
    for i in range(5):
        wait_until(lambda i=i: store_info(n)["rules_store_connects"] == i + 1, 10,
                   "the node to be connected")
        terminated = pg.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            f"WHERE datname = '{db}' AND application_name LIKE 'fastlimit%'", db)
        assert int(terminated) == 2        # the listener and the worker
        sql_insert(pg, db, f"r{i}", doc(i + 1))     # while it is away
    all_have([n], "r4", 5, timeout=20)
    with n.client() as c:
        assert c.execute_command("CL.RULE", "LIST") == [f"r{i}".encode() for i in range(5)]
    assert store_info(n)["rules_store_connects"] >= 2


def test_a_node_started_while_the_database_is_down_runs_with_its_cache(own_pg, node,
                                                                     make_server, tmp_path):
    pg = own_pg
    url = pg.create_database()
    cache = str(tmp_path / "kept.db")
    first = node(url, cache=cache)
    with first.client() as c:
        c.execute_command("CL.RULE", "SET", "cached", doc(6))
    first.stop()
    pg.stop("immediate")
    again = node(url, "--rules-store-required", "yes", cache=cache)
    assert capacity(again, "cached") == 6
    assert store_info(again)["rules_store_state"] == "down"
    with pytest.raises(RuntimeError, match="cannot be reached .* no cached rules "
                                           r"\(rules-store-required yes\)"):
        node(url, "--rules-store-required", "yes")
    stale = node(url, "--rules-store-max-staleness", "0.2")
    assert stale.http("GET", "/readyz").status == 503
    assert "rules-store-max-staleness" in stale.http("GET", "/readyz?verbose").body.decode()
    pg.start()
    wait_until(lambda: stale.http("GET", "/readyz").status == 200, 20)
    wait_until(lambda: store_info(again)["rules_store_state"] == "connected", 20)


# ---- volume -----------------------------------------------------------------------

def test_ten_thousand_rules_at_start_and_a_thousand_changes_in_one_transaction(pg, node):
    url = pg.create_database()
    db = db_of(url)
    n = node(url)           # makes the table
    pg.sql(f"INSERT INTO {TABLE} (id, doc) SELECT 'bulk' || i, "
           "jsonb_build_object('match', jsonb_build_object('resource', 'r' || i), "
           "'capacity', 5, 'refill_per_second', 1) FROM generate_series(1, 10000) i", db)
    wait_until(lambda: store_info(n)["rules"] == 10_000, 30)
    began = time.monotonic()
    late = node(url)
    assert store_info(late)["rules"] == 10_000, time.monotonic() - began
    pg.sql(f"BEGIN; UPDATE {TABLE} SET doc = jsonb_set(doc, '{{capacity}}', '9') "
           "WHERE id IN (SELECT 'bulk' || i FROM generate_series(1, 1000) i); COMMIT;", db)
    for s in (n, late):
        wait_until(lambda s=s: capacity(s, "bulk1000") == 9 and capacity(s, "bulk1") == 9, 30)
        assert capacity(s, "bulk1001") == 5
    queue = float(pg.sql("SELECT pg_notification_queue_usage()", db))
    assert queue < 0.01


# ---- roles ------------------------------------------------------------------------

def test_a_primary_and_its_replica_both_follow_the_store(pg, node):
    url = pg.create_database()
    primary = node(url)
    replica = node(url, "--replicaof", "127.0.0.1", str(primary.port))
    sql_insert(pg, db_of(url), "both", doc(8))
    all_have([primary, replica], "both", 8)
    with replica.client() as c, pytest.raises(redis.ReadOnlyError):
        c.execute_command("CL.RULE", "SET", "both", doc(9))


def test_the_stores_password_never_leaves_the_node(node):
    n = node("postgresql://fleet:hunter2@127.0.0.1:1/rules")
    info = store_info(n)
    assert info["rules_store"] == "postgresql://fleet:***@127.0.0.1:1/rules"
    assert info["rules_store_state"] == "down" and info["rules_store_last_error"]
    with n.client() as c, pytest.raises(redis.RedisError) as e:
        c.execute_command("CL.RULE", "SET", "x", doc(1))
    shown = [str(e.value), n.log(), call(n.http.port, "GET", "/metrics").body.decode(),
             json.dumps(call(n.http.port, "GET", "/v1/info").json())]
    assert all("hunter2" not in text for text in shown)
    assert "postgresql://fleet:***@127.0.0.1:1/rules" in str(e.value)


@pytest.mark.parametrize(("payload", "parsed"), [
    ('{"id": "a", "v": 3, "op": "update", "at": 17}', ("a", 17)),
    ('{"id": "a", "v": 3, "op": "delete"}', ("a", None)),
    ('{"op": "resync", "at": 5}', (None, 5)),          # TRUNCATE: read everything
    ('{"op": "probe", "nonce": "x"}', None),           # another node's probe: nothing
    ('{"id": 7, "op": "update"}', (None, None)),       # not ours: read everything
    ("[1, 2]", (None, None)),
    ("not json", (None, None)),
])
def test_notifications_as_a_node_reads_them(payload, parsed):
    assert parse_notification(payload) == parsed


def test_a_hot_standby_is_refused_with_the_reason(pg, node):
    """LISTEN is not accepted on a hot standby: a node pointed at one says
    so and stays down rather than silently hearing nothing."""
    url = pg.create_database()
    node(url).stop()                    # makes the table on the primary
    sql_insert(pg, db_of(url), "x", doc(3))
    standby = PostgresServer(standby_of=pg).start()
    try:
        wait_until(lambda: standby.sql(f"SELECT count(*) FROM {TABLE}", db_of(url)) == "1", 20)
        n = node(pg.url_for(db_of(url), port=standby.port))
        info = store_info(n)
        assert info["rules_store_state"] == "down"
        assert "hot standby" in info["rules_store_last_error"], info["rules_store_last_error"]
        assert capacity(n, "x") is None
    finally:
        standby.remove()


def test_changes_made_through_repeated_reconnects_all_arrive(pg, node):
    """A writer changes rules without pause while the nodes' connections
    are killed again and again: when it stops, every node holds exactly
    what the table holds."""
    url = pg.create_database()
    db = db_of(url)
    nodes = [node(url), node(url)]
    stop = threading.Event()

    def write():
        i = 0
        while not stop.is_set() and i < 400:
            pg.sql(f"INSERT INTO {TABLE} (id, doc) VALUES ('w{i % 20}', '{doc(i + 1)}') "
                   "ON CONFLICT (id) DO UPDATE SET doc = excluded.doc", db)
            i += 1
    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(10):
            time.sleep(0.15)
            pg.sql("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                   f"WHERE datname = '{db}' AND application_name LIKE 'fastlimit%'", db)
    finally:
        stop.set()
        writer.join(60)
    table = dict(line.split("|") for line in pg.sql(
        f"SELECT id, doc->>'capacity' FROM {TABLE}", db).splitlines())
    for n in nodes:
        wait_until(lambda n=n: all(capacity(n, rule_id) == int(cap)
                                   for rule_id, cap in table.items()), 20,
                   "every node to hold what the table holds")
        with n.client() as c:
            assert sorted(c.execute_command("CL.RULE", "LIST")) == sorted(
                rule_id.encode() for rule_id in table)
        assert store_info(n)["rules_store_connects"] >= 3
        assert "unexpected" not in n.log(), n.log()     # every failure was foreseen
