"""A cluster whose rules come from a PostgreSQL rules-store (README's
"Rules for a fleet from PostgreSQL": "In cluster mode and on replicas the
store is the only way rules travel"): three shards of a primary and a
standby (tests/support/cluster_rig.py), every node following one
database (tests/support/postgres.py) with a cache file of its own.

A change through any node (CL.RULE, the HTTP rules API) or plain SQL is
in force on every node and enforced away from its writer; a change no
longer needs every primary to answer (without a store it is refused
with CLUSTERDOWN, tests/cluster/test_cluster_control.py); and the
primary-to-primary hand-out is not used, so the cluster's own rules
counter (CL.CLUSTER VERSIONS) stays where it was.

Real time throughout; every wait is bounded (wire.wait_until)."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import redis
from cluster_rig import FastlimitCluster, info
from http_rules import Node
from servers import failed
from wire import Wire, free_port, wait_until

from fastlimit._cluster import keyslot
from fastlimit.rules.postgres import TABLE

SHARDS = 3
# What a node needs to notice a lost or silent connection quickly here.
QUICK = ("--rules-store-heartbeat", "0.2", "--rules-store-timeout", "1",
         "--rules-store-resync", "30")
CONVERGE_S = 10.0


class StoreCluster(FastlimitCluster):
    """The rig's cluster with every node following the store at url, with
    its own rules-db cache in root and an HTTP port."""

    def __init__(self, root: str, url: str, standbys: int = 1):
        self.root, self.url, self.http_ports = root, url, {}
        super().__init__(root, SHARDS, standbys)

    def node_args(self, port: int) -> list[str]:
        self.http_ports[port] = free_port()
        return [*super().node_args(port), "--rules-store", self.url,
                "--rules-db", f"{self.root}/cache-{port}.db",
                "--http-port", str(self.http_ports[port]), *QUICK]

    def http(self, process) -> Node:
        return Node(process, self.http_ports[process.port])


@pytest.fixture
def cluster(pg, tmp_path, request):
    url = pg.create_database()
    c = StoreCluster(str(tmp_path), url)
    c.db = url.rsplit("/", 1)[1]
    yield c
    if failed(request):
        for n in c.every_node:
            print(f"---- node {n.port} ----\n{n.log()}")
    c.stop()


def doc(capacity: int, resource: str) -> str:
    return json.dumps({"match": {"resource": resource}, "capacity": capacity,
                       "refill_per_second": 1})


def call(node, *args):
    with node.client() as c:
        return c.execute_command(*args)


def capacity(node, rule_id: str) -> int | None:
    found = call(node, "CL.RULE", "GET", rule_id)
    return json.loads(found)["capacity"] if found is not None else None


def all_have(nodes, rule_id: str, cap: int | None) -> None:
    wait_until(lambda: all(capacity(n, rule_id) == cap for n in nodes), CONVERGE_S,
               f"{rule_id} with capacity {cap} on every node")


def key_in(shard: int, prefix: str) -> str:
    """A client key whose slot the given shard of the rig's even split owns."""
    return next(k for k in (f"{prefix}:{i}" for i in range(100_000))
                if keyslot(k.encode()) * SHARDS // 16384 == shard)


def allowed(node, client: str, resource: str, times: int) -> list[int]:
    """CL.LIMIT's allowed flag, `times` calls in a row (manual clock: no refill)."""
    with node.client() as c:
        return [c.execute_command("CL.LIMIT", client, resource)[0] for _ in range(times)]


def versions(node) -> list:
    return call(node, "CL.CLUSTER", "VERSIONS")


def rules_counters(cluster) -> dict:
    """Each node's view of the cluster's own rule set: CL.CLUSTER VERSIONS'
    counter and origin, CLUSTER INFO's rules_version, INFO's
    cluster_rules_version."""
    out = {}
    for n in cluster.every_node:
        cluster_info = call(n, "CLUSTER", "INFO").decode()
        line = next(x for x in cluster_info.splitlines() if x.startswith("rules_version:"))
        out[n.port] = (*versions(n)[1:], line, info(n, "cluster")["cluster_rules_version"])
    return out


def reply_bytes(node, *args) -> bytes:
    with Wire.to(node.port) as w:
        return w.call(*args)


# ---- a change through any node is in force on every node -----------------------------

def test_a_change_through_any_node_or_sql_is_in_force_and_enforced_on_every_node(cluster, pg):
    p0, p1, p2 = cluster.primaries
    everyone = cluster.every_node
    # CL.RULE SET on one primary: in force there as it replies, then everywhere,
    # and enforced on the primary of another shard.
    assert call(p0, "CL.RULE", "SET", "cmd", doc(2, "cmd/*")) == b"OK"
    assert capacity(p0, "cmd") == 2
    all_have(everyone, "cmd", 2)
    assert allowed(p1, key_in(1, "a"), "cmd/x", 3) == [1, 1, 0]
    # PUT on another primary's HTTP front.
    put = cluster.http(p1)("PUT", "/v1/rules/web", doc(3, "web/*"))
    assert put.status == 201, put.body
    all_have(everyone, "web", 3)
    assert allowed(p2, key_in(2, "b"), "web/x", 4) == [1, 1, 1, 0]
    for standby in (shard[1] for shard in cluster.nodes):   # standbys still refuse writes
        with pytest.raises(redis.ReadOnlyError):
            call(standby, "CL.RULE", "SET", "cmd", doc(9, "cmd/*"))
        assert cluster.http(standby)("PUT", "/v1/rules/cmd", doc(9, "cmd/*")).status == 503
    # Plain SQL: timed from its COMMIT to the last node showing it.
    committed_ms, seen_ms = sql_update_timed(cluster, pg, "cmd", 4)
    assert allowed(p2, key_in(2, "c"), "cmd/x", 5) == [1, 1, 1, 1, 0]
    lags = {port: seen - committed_ms for port, seen in seen_ms.items()}
    store_lags = {n.port: info(n, "rules")["rules_store_lag_ms"] for n in everyone}
    print(f"SQL COMMIT to in force on the last of {len(everyone)} nodes: "
          f"{max(lags.values()):.1f} ms (seen by polling; per node: "
          f"{', '.join(f'{p}={v:.1f}' for p, v in sorted(lags.items()))}); the nodes' own "
          f"rules_store_lag_ms: {sorted(store_lags.values())}")
    # DEL through the third primary, seen everywhere.
    assert call(p2, "CL.RULE", "DEL", "web") == 1
    all_have(everyone, "web", None)


def sql_update_timed(cluster, pg, rule_id: str, cap: int) -> tuple[float, dict[int, float]]:
    """Sets rule_id's capacity with plain SQL while a thread per node
    polls for it on a connection of its own; the wall time (ms) just
    after COMMIT (PostgreSQL's clock_timestamp in psql's next statement,
    the same host's clock, so a node may show it a little before) and
    when each node was first seen with it."""
    seen: dict[int, float] = {}
    go = threading.Barrier(len(cluster.every_node) + 1)
    deadline = time.monotonic() + CONVERGE_S

    def poll(node):
        with node.client() as c:
            c.ping()                # connected before the clock starts
            go.wait(10)
            while time.monotonic() < deadline:
                found = c.execute_command("CL.RULE", "GET", rule_id)
                if found is not None and json.loads(found)["capacity"] == cap:
                    seen[node.port] = time.time() * 1000
                    return
    threads = [threading.Thread(target=poll, args=(n,)) for n in cluster.every_node]
    for t in threads:
        t.start()
    go.wait(10)
    out = pg.sql(f"BEGIN; UPDATE {TABLE} SET doc = jsonb_set(doc, '{{capacity}}', '{cap}') "
                 f"WHERE id = '{rule_id}'; COMMIT; "
                 "SELECT extract(epoch FROM clock_timestamp()) * 1000", cluster.db)
    for t in threads:
        t.join(CONVERGE_S + 5)
    assert sorted(seen) == sorted(n.port for n in cluster.every_node), \
        f"{rule_id} with capacity {cap} seen only on {sorted(seen)}"
    return float(out.splitlines()[-1]), seen


# ---- a change no longer needs every primary to answer --------------------------------

def test_without_a_store_a_change_with_a_primary_stopped_is_refused(tmp_path):
    """The contrast (as tests/cluster/test_cluster_control.py asserts it):
    without a store the hand-out needs every primary."""
    plain = FastlimitCluster(str(tmp_path), SHARDS, 0)
    try:
        stopped = plain.primaries[2]
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            message = reply_bytes(plain.primaries[0], "CL.RULE", "SET", "x",
                                  doc(2, "x/*")).decode()
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
        assert message.startswith("-CLUSTERDOWN rule change refused, nothing changed")
        assert f"127.0.0.1:{stopped.port}" in message
    finally:
        plain.stop()


def test_with_a_store_a_change_with_a_primary_stopped_succeeds_and_it_catches_up(cluster):
    p0, p1, p2 = cluster.primaries
    running = [n for n in cluster.every_node if n is not p2]
    p2.proc.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert reply_bytes(p0, "CL.RULE", "SET", "away", doc(2, "away/*")) == b"+OK\r\n"
        took = time.monotonic() - began
        put = cluster.http(p1)("PUT", "/v1/rules/away2", doc(3, "away2/*"))
        assert put.status == 201, put.body
        all_have(running, "away", 2)          # p2's standby included: it follows the store
        all_have(running, "away2", 3)
        assert allowed(p1, key_in(1, "d"), "away/x", 3) == [1, 1, 0]
    finally:
        p2.proc.send_signal(signal.SIGCONT)
    print(f"CL.RULE SET with a primary stopped replied in {took * 1000:.1f} ms")
    all_have([p2], "away", 2)
    all_have([p2], "away2", 3)
    assert allowed(p2, key_in(2, "e"), "away2/x", 4) == [1, 1, 1, 0]


# ---- the hand-out between primaries is not used --------------------------------------

def test_store_changes_do_not_move_the_clusters_own_rules_version(cluster, pg):
    p0, p1, p2 = cluster.primaries
    before = rules_counters(cluster)
    assert all(v[0] == 0 for v in before.values()), before
    assert call(p0, "CL.RULE", "SET", "v", doc(2, "v/*")) == b"OK"
    assert cluster.http(p1)("PUT", "/v1/rules/v2", doc(3, "v2/*")).status == 201
    pg.sql(f"UPDATE {TABLE} SET doc = jsonb_set(doc, '{{capacity}}', '5') WHERE id = 'v'",
           cluster.db)
    assert call(p2, "CL.RULE", "DEL", "v2") == 1
    all_have(cluster.every_node, "v", 5)
    all_have(cluster.every_node, "v2", None)
    # A rule set handed out by hand, newer than any, is not taken either.
    assert call(p1, "CL.CLUSTER", "SETRULES", 99, "x" * 40, "[]") == 0
    assert capacity(p1, "v") == 5
    # A second: ten cron ticks (hz 10), where a change not made through a
    # command would be handed out if rules travelled between primaries.
    time.sleep(1.0)
    assert rules_counters(cluster) == before
    assert all(capacity(n, "v") == 5 for n in cluster.every_node)
