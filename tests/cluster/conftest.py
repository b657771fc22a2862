"""Real redis-server cluster nodes, the reference for hash slots and for
the CLUSTER reply shapes: one cluster-enabled node (CLUSTER KEYSLOT works
without slots assigned) and a 3-master cluster with one replica, made by
redis-cli --cluster on free loopback ports, bounded in time."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import pytest
import redis
from cluster_rig import FastlimitCluster
from wire import free_port

START_TIMEOUT = 20.0


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
        """A reply as redis-py's parser reads it, without the command
        callbacks that turn CLUSTER replies into dicts."""
        conn = redis.Connection(host="127.0.0.1", port=self.port, protocol=protocol,
                                socket_timeout=10)
        try:
            conn.send_command(*args)
            return conn.read_response()
        finally:
            conn.disconnect()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for(predicate, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


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

        def settled() -> bool:
            infos = [n.raw("CLUSTER", "INFO") for n in nodes]
            slots = nodes[0].raw("CLUSTER", "SLOTS")
            return (all(b"cluster_state:ok" in i and b"cluster_known_nodes:4" in i
                        for i in infos)
                    and any(len(entry) == 4 for entry in slots))
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
