"""A fastlimit cluster on loopback for tests: static shards of real
server processes (tests import it; tests/cluster/conftest.py has the
fixture)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import redis
from servers import ServerProcess
from wire import free_ports

from fastlimit.cluster.peers import LINK_PERMISSIONS

START_TIMEOUT = 20.0
CLUSTER_USER = "fl-cluster"
CLUSTER_PASSWORD = "rig-cluster-secret"


def wait_for(predicate, what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cluster_acl(root: str, password: str, requirepass: str | None) -> str:
    """An aclfile in root: the default user (open, as without an aclfile,
    unless requirepass is given), and the cluster's link user with the
    password and just the permissions a link needs."""
    path = os.path.join(root, f"cluster-{password}-{requirepass}.acl")
    default = f">{requirepass}" if requirepass else "nopass"
    with open(path, "w") as f:
        f.write(f"user default on {default} ~* &* +@all\n"
                f"user {CLUSTER_USER} on >{password} {' '.join(LINK_PERMISSIONS)}\n")
    return path


def cluster_auth_args(root: str, password: str = CLUSTER_PASSWORD,
                      requirepass: str | None = None) -> list[str]:
    """A node's settings for proving itself to the others (the same on every
    node of a cluster)."""
    return ["--aclfile", cluster_acl(root, password, requirepass), "--cluster-user",
            CLUSTER_USER, "--cluster-password", password]


class FastlimitCluster:
    """A static-map fastlimit cluster on loopback: shards of a primary and
    standbys (replicating), every node on the manual clock, the map in
    root/map.toml.  Slots are split evenly in shard order."""

    def __init__(self, root: str, shards: int = 3, standbys: int = 1, *extra: str):
        picked = iter(free_ports(shards * (1 + standbys)))
        self.ports = [[next(picked) for _ in range(1 + standbys)] for _ in range(shards)]
        self.map_path = os.path.join(root, f"map-{self.ports[0][0]}.toml")
        self.auth = cluster_auth_args(root)
        with open(self.map_path, "w") as f:
            f.write(static_map_text(self.ports))
        self.nodes: list[list] = []
        try:
            for ports in self.ports:
                primary = ServerProcess(*self.node_args(ports[0]), *extra).start()
                replicas = [ServerProcess(*self.node_args(p), "--replicaof", "127.0.0.1",
                                          str(ports[0]), *extra).start() for p in ports[1:]]
                self.nodes.append([primary, *replicas])
            wait_for(self._replicas_linked, "the standbys to link")
        except BaseException:
            self.stop()
            raise

    def node_args(self, port: int) -> list[str]:
        return ["--port", str(port), "--manual-clock", "--cluster-enabled", "yes",
                "--cluster-config-file", self.map_path, *self.auth]

    def _replicas_linked(self) -> bool:
        return all(info(r, "replication").get("master_link_status") == "up"
                   for shard in self.nodes for r in shard[1:])

    @property
    def primaries(self) -> list:
        return [shard[0] for shard in self.nodes]

    @property
    def every_node(self) -> list:
        return [n for shard in self.nodes for n in shard]

    def stop(self) -> None:
        for n in self.every_node:
            n.stop()


def info(node, section: str) -> dict:
    with node.client() as c:
        return c.info(section)


def static_map_text(ports: list[list[int]], version: int = 1) -> str:
    """A map giving shard i slots i*16384/N .. (i+1)*16384/N - 1, primary
    ports[i][0] and standbys ports[i][1:]."""
    n = len(ports)
    lines = [f"version = {version}"]
    for i, shard in enumerate(ports):
        standbys = ", ".join(f'"127.0.0.1:{p}"' for p in shard[1:])
        lines += ["", "[[shard]]", f'name = "fl-{i}"',
                  f'slots = ["{i * 16384 // n}-{(i + 1) * 16384 // n - 1}"]',
                  f'primary = "127.0.0.1:{shard[0]}"', f"standbys = [{standbys}]"]
    return "\n".join(lines) + "\n"


def raw_reply(port: int, *args, protocol: int = 2):
    """A reply as redis-py's parser reads it, without the command
    callbacks that turn CLUSTER replies into dicts."""
    conn = redis.Connection(host="127.0.0.1", port=port, protocol=protocol, socket_timeout=10)
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        conn.disconnect()


def ruled_servers(root: Path, rules: dict) -> tuple[FastlimitCluster, ServerProcess]:
    """Three shards of one primary and one standalone server, the same
    rules file on each, to compare their answers."""
    path = root / "rules.json"
    path.write_text(json.dumps(rules))
    cluster = FastlimitCluster(str(root), 3, 0, "--rules-file", str(path))
    try:
        return cluster, ServerProcess("--manual-clock", "--rules-file", str(path)).start()
    except BaseException:
        cluster.stop()
        raise
