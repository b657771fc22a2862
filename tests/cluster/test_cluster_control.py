"""Slot maps and rules handed between real cluster nodes: a map pushed to
every node, stale and unusable maps refused with the running one kept,
one rule set for the whole cluster, and nodes that were away catching
up."""

from __future__ import annotations

import json
import signal

import pytest
import redis
from cluster_rig import FastlimitCluster, info, static_map_text
from servers import ServerProcess
from wire import Wire

from fastlimit.cluster import slot_map as clustermap

RULE = json.dumps({"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1})


@pytest.fixture
def cluster(tmp_path):
    """Three shards of one primary each."""
    c = FastlimitCluster(str(tmp_path), 3, 0)
    yield c
    c.stop()


def call(node, *args):
    with node.client(socket_timeout=10) as c:
        return c.execute_command(*args)


def error_of(node, *args) -> str:
    with pytest.raises(redis.ResponseError) as e:
        call(node, *args)
    return str(e.value)


def moved_map(cluster, version: int) -> str:
    """The running map with slot 0's range given to the last shard."""
    m = clustermap.load(cluster.map_path)
    first, *rest = m.shards
    last = rest[-1]
    new_first = clustermap.Shard(first.name, (clustermap.SlotRange(101, first.slots[0].end),),
                                 primary=first.primary, standbys=first.standbys)
    new_last = clustermap.Shard(last.name, (*last.slots, clustermap.SlotRange(0, 100)),
                                primary=last.primary, standbys=last.standbys)
    return clustermap.dumps(clustermap.SlotMap.build(
        version, [new_first, *rest[:-1], new_last]))


def reply_bytes(node, *args) -> bytes:
    with Wire.to(node.port) as w:
        return w.call(*args)


def versions(node) -> list:
    return call(node, "CL.CLUSTER", "VERSIONS")


# ---- the slot map ---------------------------------------------------------------------

def test_a_pushed_map_is_in_force_on_every_node_and_kept_in_its_file(cluster):
    a, b, c = cluster.primaries
    assert call(b, "CL.CLUSTER", "PUSH", moved_map(cluster, 2)) == b"OK"
    for node in cluster.primaries:
        assert versions(node)[0] == 2
        assert [0, 100] in [e[:2] for e in call(node, "CLUSTER", "SLOTS")]
    # "{06S}" hashes to slot 0: now the last shard's
    assert reply_bytes(a, "CL.CHECK", "{06S}", "10", "1") == \
        f"-MOVED 0 127.0.0.1:{c.port}\r\n".encode()
    assert call(c, "CL.CHECK", "{06S}", 10, 1)[0] == 1
    assert clustermap.load(cluster.map_path).version == 2


@pytest.mark.parametrize("change,reason", [
    (lambda text: text.replace("standbys = []", 'standbys = ["127.0.0.1:1"]', 1),
     "is not newer than the running version 1"),
    (lambda text: text.replace("version = 1", "version = 0"), "not newer"),
    (lambda text: text.replace('"0-5460"', '"0-5000"').replace("version = 1", "version = 9"),
     "not covered by any shard"),
    (lambda text: text.replace('"0-5460"', '"0-6000"').replace("version = 1", "version = 9"),
     "overlap"),
    (lambda text: "version = [", "TOML"),
])
def test_a_stale_or_unusable_map_is_refused_and_the_running_one_stays(cluster, change, reason):
    a = cluster.primaries[0]
    with open(cluster.map_path) as f:
        text = f.read()
    before = call(a, "CLUSTER", "SLOTS")
    for command in ("SETMAP", "PUSH"):
        message = error_of(a, "CL.CLUSTER", command, change(text))
        assert reason.lower() in message.lower()
        assert call(a, "CLUSTER", "SLOTS") == before and versions(a)[0] == 1
    with open(cluster.map_path) as f:
        assert f.read() == text


def test_the_running_map_sent_again_changes_nothing(cluster):
    with open(cluster.map_path) as f:
        text = f.read()
    before = info(cluster.primaries[0], "cluster")["cluster_route_updates"]
    for command in ("SETMAP", "PUSH"):
        assert call(cluster.primaries[0], "CL.CLUSTER", command, text) == b"OK"
    assert info(cluster.primaries[0], "cluster")["cluster_route_updates"] == before


def test_a_map_pushed_while_a_node_is_down_names_it_and_it_catches_up(cluster):
    a, b, c = cluster.primaries
    c.stop()
    message = error_of(a, "CL.CLUSTER", "PUSH", moved_map(cluster, 2))
    assert f"127.0.0.1:{c.port} (no answer)" in message
    assert versions(a)[0] == versions(b)[0] == 2
    # c's own file still says version 1: it restarts on it and catches up at once
    with open(cluster.map_path + ".c", "w") as f:
        f.write(static_map_text(cluster.ports))
    again = ServerProcess("--port", str(c.port), "--manual-clock", "--cluster-enabled", "yes",
                          "--cluster-config-file", cluster.map_path + ".c", *cluster.auth).start()
    cluster.nodes[2][0] = again
    assert versions(again)[0] == 2
    assert reply_bytes(a, "CL.CHECK", "{06S}", "10", "1") == \
        f"-MOVED 0 127.0.0.1:{c.port}\r\n".encode()


# ---- one rule set --------------------------------------------------------------------

def test_a_rule_set_on_one_primary_is_in_force_on_every_primary_before_the_reply(cluster):
    a, b, c = cluster.primaries
    assert call(b, "CL.RULE", "SET", "x", RULE) == b"OK"
    for node in cluster.primaries:
        assert json.loads(call(node, "CL.RULE", "GET", "x"))["capacity"] == 2
        assert info(node, "cluster")["cluster_rules_version"] == 1
    assert call(c, "CL.RULE", "DEL", "x") == 1
    for node in cluster.primaries:
        assert call(node, "CL.RULE", "GET", "x") is None
        assert call(node, "CLUSTER", "INFO").decode().count("rules_version:2") == 1


def test_a_rule_change_while_a_primary_is_down_is_refused_naming_it(cluster):
    a, b, c = cluster.primaries
    c.proc.send_signal(signal.SIGSTOP)
    try:
        message = reply_bytes(a, "CL.RULE", "SET", "x", RULE).decode()
    finally:
        c.proc.send_signal(signal.SIGCONT)
    assert message.startswith("-CLUSTERDOWN rule change refused, nothing changed")
    assert f"127.0.0.1:{c.port}" in message
    for node in cluster.primaries:
        assert call(node, "CL.RULE", "GET", "x") is None


def test_a_primary_that_was_away_catches_up_on_the_rules_before_it_answers(cluster):
    a, b, c = cluster.primaries
    assert call(a, "CL.RULE", "SET", "x", RULE) == b"OK"
    c.stop()
    # c's rules were in memory only: it comes back with none, and must
    # take the cluster's at start, before it listens.
    again = ServerProcess("--port", str(c.port), "--manual-clock", "--cluster-enabled", "yes",
                          "--cluster-config-file", cluster.map_path, *cluster.auth).start()
    cluster.nodes[2][0] = again
    assert json.loads(call(again, "CL.RULE", "GET", "x"))["capacity"] == 2
    assert call(again, "CL.LIMIT", "foo", "GET /x")[:3] == [1, 2, 1]


def test_cluster_commands_need_cluster_mode(r):
    for args in (["CL.CLUSTER", "VERSIONS"], ["CL.CLUSTER", "MAP"]):
        with pytest.raises(redis.ResponseError, match="cluster support disabled"):
            r.execute_command(*args)


def test_a_rule_change_cannot_wait_on_other_nodes_inside_multi(cluster):
    with Wire.to(cluster.primaries[0].port) as w:
        assert w.call("MULTI") == b"+OK\r\n"
        assert w.call("CL.RULE", "SET", "x", RULE) == b"+QUEUED\r\n"
        assert w.call("EXEC") == (b"*1\r\n-ERR this command waits on other nodes, which it "
                                  b"cannot do inside MULTI\r\n")
    assert call(cluster.primaries[1], "CL.RULE", "GET", "x") is None
