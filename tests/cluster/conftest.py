"""Real redis-server cluster nodes, the reference for hash slots and for
the CLUSTER reply shapes: one cluster-enabled node (CLUSTER KEYSLOT works
without slots assigned) and a 3-master cluster with one replica, made by
redis-cli --cluster on free loopback ports, bounded in time."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest
import redis
from cluster_rig import FastlimitCluster, raw_reply, wait_for
from servers import stop_process
from wire import free_port


class RedisClusterNode:
    """A cluster-enabled redis-server, persistence off, in its own folder."""

    def __init__(self, root: str):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix=f"node-{self.port}-", dir=root)
        # The bus port is given: port + 10000 may be past 65535.
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
             "--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)
        wait_for(self._pings, "redis-server to start")

    def _pings(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited")
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def raw(self, *args, protocol: int = 2):
        return raw_reply(self.port, *args, protocol=protocol)

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.proc)


def redis_cli(*args: str) -> None:
    subprocess.run(["redis-cli", *args], check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def cluster_root():
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.fail("redis-server and redis-cli are not installed (make test installs them)")
    root = tempfile.mkdtemp(prefix="redis-cluster-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_cluster_node(cluster_root):
    node = RedisClusterNode(cluster_root)
    yield node
    node.stop()


@pytest.fixture(scope="session")
def redis_cluster(cluster_root):
    """[master, master, master, replica of the first], state ok, the replica
    listed in the first master's CLUSTER SLOTS."""
    nodes: list[RedisClusterNode] = []
    try:
        nodes += [RedisClusterNode(cluster_root) for _ in range(4)]
        redis_cli("--cluster", "create", *(n.addr for n in nodes[:3]), "--cluster-yes")
        master_id = nodes[0].raw("CLUSTER", "MYID").decode()
        redis_cli("--cluster", "add-node", nodes[3].addr, nodes[0].addr,
                  "--cluster-slave", "--cluster-master-id", master_id)

        replica_id = nodes[3].raw("CLUSTER", "MYID").decode()

        def gossip_done(node) -> bool:
            """Every link connected, and the replica known as the first
            master's: each node learns that from gossip on its own."""
            lines = [line.split() for line in node.raw("CLUSTER", "NODES").decode().splitlines()]
            return all(f[7] == "connected" for f in lines) and any(
                f[0] == replica_id and "slave" in f[2] and f[3] == master_id for f in lines)

        def settled() -> bool:
            infos = [n.raw("CLUSTER", "INFO") for n in nodes]
            slots = nodes[0].raw("CLUSTER", "SLOTS")
            return (all(b"cluster_state:ok" in i and b"cluster_known_nodes:4" in i
                        for i in infos)
                    and any(len(entry) == 4 for entry in slots)
                    and all(gossip_done(n) for n in nodes))
        wait_for(settled, "the cluster to settle with its replica")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="module")
def fl_cluster(tmp_path_factory):
    """Three shards of a primary and one standby."""
    cluster = FastlimitCluster(str(tmp_path_factory.mktemp("fl-cluster")))
    yield cluster
    cluster.stop()
