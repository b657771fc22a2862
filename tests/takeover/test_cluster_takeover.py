"""A cluster node taken over (src/fastlimit/takeover/ in cluster mode):
the new process is the same node to its peers, its standby and the
cluster's clients (its address, the map, its buckets, the replication id),
and none of them sees an error.  Real processes on loopback, the manual
clock."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from cluster_rig import cluster_auth_args, info, static_map_text, wait_for
from redis.cluster import RedisCluster
from servers import PYTHON, ServerProcess, stop_process
from takeover_kit import hello_answer
from wire import Wire, command, free_ports

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster.py"
_spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT)
local_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(local_cluster)

LOAD_CAPACITY = 10**12
KEYS = 200
RULE = json.dumps({"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1})


class ClusterChecks(threading.Thread):
    """redis-py's RedisCluster checking KEYS keys spread over every shard,
    in a loop; an error of any kind is kept (the test fails on it)."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.rc = RedisCluster(host="127.0.0.1", port=port, socket_timeout=10)
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.spent = 0

    def run(self) -> None:
        try:
            while not self.done.is_set():
                for i in range(KEYS):
                    reply = self.rc.execute_command("CL.CHECK", f"c:{i}", LOAD_CAPACITY, 1)
                    assert reply[0] == 1, reply
                    self.spent += 1
        except BaseException as e:       # the test asserts there were none
            self.errors.append(e)

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        self.rc.close()
        assert not self.errors, self.errors


@pytest.fixture
def cluster(tmp_path):
    """Two shards, the first of a primary with a takeover-socket and a
    standby, the second of a primary; [[p0, s0], [p1]] and the settings of
    p0 (for its successor)."""
    p0, s0, p1 = free_ports(3)
    root = str(tmp_path)
    map_path = tmp_path / "map.toml"
    map_path.write_text(static_map_text([[p0, s0], [p1]]))
    common = ["--manual-clock", "--cluster-enabled", "yes", "--cluster-config-file",
              str(map_path), *cluster_auth_args(root)]
    p0_args = ["--port", str(p0), *common, "--takeover-socket", str(tmp_path / "tk.sock")]
    started: list[ServerProcess] = []
    try:
        for args in (p0_args, ["--port", str(p1), *common],
                     ["--port", str(s0), *common, "--replicaof", "127.0.0.1", str(p0)]):
            started.append(ServerProcess(*args).start())
        wait_for(lambda: info(started[2], "replication").get("master_link_status") == "up",
                 "the standby to link")
        yield started, p0_args
    finally:
        for node in started:
            node.stop()


@pytest.mark.untraced
def test_a_cluster_node_taken_over_is_one_uninterrupted_node_to_clients_peers_and_standby(
        cluster):
    (old, other, standby), p0_args = cluster
    sock = p0_args[-1]
    with old.client() as r:
        assert r.execute_command("CL.RULE", "SET", "x", RULE) == b"OK"   # handed to the other
        slots_before = r.execute_command("CLUSTER", "SLOTS")
        versions = r.execute_command("CL.CLUSTER", "VERSIONS")
    replid = info(old, "replication")["master_replid"]
    load = ClusterChecks(old.port)
    load.start()
    wait_for(lambda: load.spent > KEYS or load.errors, "the load to run")
    new = ServerProcess(*p0_args, "--takeover", sock).start()
    try:
        assert old.proc.wait(20) == 0, old.log()
        at_exit = load.spent
        wait_for(lambda: load.spent > at_exit + 2 * KEYS or load.errors,
                 "the load on the new process", 10)
        load.stop()

        with new.client() as r:
            assert r.execute_command("CLUSTER", "SLOTS") == slots_before
            assert r.info("server")["takeover_from_pid"] == old.proc.pid
            # the cluster rules' version goes on: the rules the stream
            # brought are not a change of this node's to hand out again
            assert r.execute_command("CL.CLUSTER", "VERSIONS") == versions
            time.sleep(1.2)       # a cron or so, in which a change would be handed out
            assert r.execute_command("CL.CLUSTER", "VERSIONS") == versions
        with other.client() as r:
            assert r.execute_command("CL.CLUSTER", "VERSIONS") == versions
        assert info(new, "replication")["master_replid"] == replid
        wait_for(lambda: info(standby, "replication").get("master_link_status") == "up",
                 "the standby to follow the new process", 10)
        assert info(standby, "replication")["master_replid"] == replid
        with RedisCluster(host="127.0.0.1", port=other.port, socket_timeout=10) as rc:
            spent = sum(LOAD_CAPACITY - rc.execute_command(
                "CL.CHECK", f"c:{i}", LOAD_CAPACITY, 1, "COST", 0)[2] for i in range(KEYS))
        assert spent == load.spent
    finally:
        new.stop()


def test_the_cluster_rules_version_goes_on_when_no_peer_answers_the_new_process(cluster):
    """The cluster rules' version crosses at the pause: a new process that
    could not take it from a peer at its start does not start over from
    version 0 (its next rule change would be refused by peers as old)."""
    (old, other, standby), p0_args = cluster
    with old.client() as r:
        assert r.execute_command("CL.RULE", "SET", "x", RULE) == b"OK"
        versions = r.execute_command("CL.CLUSTER", "VERSIONS")
    assert versions[1] == 1
    other.stop()
    standby.stop()
    new = ServerProcess(*p0_args, "--takeover", p0_args[-1]).start()
    try:
        assert old.proc.wait(20) == 0, old.log()
        with new.client() as r:
            assert r.execute_command("CL.CLUSTER", "VERSIONS") == versions
    finally:
        new.stop()


def move_state(node) -> bytes:
    with node.client() as r:
        return r.execute_command("CL.CLUSTER", "MOVESTATUS")[b"state"]


def test_a_node_moving_slots_refuses_to_be_taken_over(cluster):
    (old, other, _), p0_args = cluster
    other.proc.send_signal(signal.SIGSTOP)       # the move waits on its target
    mover = threading.Thread(daemon=True, target=lambda: old.client(socket_timeout=30)
                             .execute_command("CL.CLUSTER", "MOVE", "0-10", "fl-1"))
    try:
        mover.start()
        wait_for(lambda: move_state(old) != b"none", "the move to begin", 10)
        answer = hello_answer(p0_args[-1])
        assert answer["kind"] == "refused" and "slot move" in answer["reason"], answer
    finally:
        other.proc.send_signal(signal.SIGCONT)
        mover.join(30)


def catch_ups_answered(node) -> int:
    """CL.CLUSTER VERSIONS calls node answered (a node asks its peers at start)."""
    return info(node, "commandstats").get("cmdstat_cl.cluster|versions", {}).get("calls", 0)


def fill(port: int, n: int) -> None:
    """n buckets, by a raw pipeline (so that the copy takes a while)."""
    with Wire.to(port) as wire:
        for start in range(0, n, 10_000):
            wire.send(b"".join(command("CL.CHECK", f"b:{i}", 10, 1)
                               for i in range(start, min(start + 10_000, n))))
            for _ in range(start, min(start + 10_000, n)):
                wire.read_reply()


@pytest.mark.untraced
def test_a_slot_map_installed_during_the_copy_is_the_new_process_s_at_the_flip(
        cluster):
    """The new process read the map before the running node installed a
    newer one (into cluster-config-file): it takes it at the pause, so it
    routes as the old one did from its first command on."""
    (old, other, standby), p0_args = cluster
    fill(old.port, 500_000)
    asked = catch_ups_answered(other)
    new = ServerProcess(*p0_args, "--takeover", p0_args[-1])
    starting = threading.Thread(target=new.start, daemon=True)   # ready after its flip
    starting.start()
    try:
        wait_for(lambda: catch_ups_answered(other) > asked, "the new process to read the map",
                 10)
        ports = [[old.port, standby.port], [other.port]]
        with old.client() as r:      # on this node only: the others stay at version 1
            assert r.execute_command("CL.CLUSTER", "SETMAP", static_map_text(ports, 2)) == b"OK"
        assert "handed over to pid" not in old.log()      # installed before the flip
        assert old.proc.wait(20) == 0, old.log()
        starting.join(20)
        with new.client() as r:
            assert r.execute_command("CL.CLUSTER", "VERSIONS")[0] == 2
    finally:
        starting.join(20)
        new.stop()


@pytest.mark.untraced
def test_a_sentinel_shard_s_primary_taken_over_while_its_sentinels_are_down_routes_as_before(
        tmp_path):
    """What Sentinel said crosses at the pause: the new process, which
    finds no sentinel at its start, serves and redirects as the old one
    did rather than answer CLUSTERDOWN until a sentinel is back."""
    with local_cluster.LocalCluster(tmp_path / "rig", shards=2, python=PYTHON,
                                    extra=["--takeover-socket", "takeover.sock"]) as rig:
        rig.wait_state_ok()
        old = rig.shards["fl-0"][0]
        with old.client() as r:
            slots = r.execute_command("CLUSTER", "SLOTS")
        for sentinel in rig.ha.sentinels:
            sentinel.stop()
        with open(tmp_path / "new.log", "wb") as log:
            new = subprocess.Popen([*old.command(), "--takeover", "takeover.sock"], cwd=old.dir,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            assert old.proc.wait(20) == 0, old.log()
            with old.client() as r:          # its port, the new process's now
                assert r.info("server")["process_id"] == new.pid
                assert r.execute_command("CLUSTER", "SLOTS") == slots
                assert local_cluster.cluster_state(old.port) == "ok"
        finally:
            stop_process(new)
