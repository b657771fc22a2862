"""tls-cluster: the cluster knows its nodes by their tls-port, clients are
sent there, and the nodes hand maps and rules to each other over TLS,
each end checking the other's certificate against the CA.  Real nodes,
certificates made at test time (certs.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import redis
from certs import Certs, make_certs
from cluster_rig import cluster_auth_args, static_map_text
from servers import PYTHON, ServerProcess
from wire import Wire, free_ports

from fastlimit._cluster import keyslot

RULE = json.dumps({"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1})


class TlsNode:
    def __init__(self, port: int, tls_port: int, map_path: str, certs: Certs, ca: str):
        self.tls_port = tls_port
        self.certs = certs
        self.proc = ServerProcess(
            "--port", str(port), "--tls-port", str(tls_port), "--tls-cluster", "yes",
            "--tls-cert-file", certs.server.cert, "--tls-key-file", certs.server.key,
            "--tls-ca-cert-file", ca, "--manual-clock", "--cluster-enabled", "yes",
            "--cluster-config-file", map_path,
            *cluster_auth_args(os.path.dirname(map_path))).start()

    def tls_client(self) -> redis.Redis:
        return redis.Redis(port=self.tls_port, ssl=True, ssl_ca_certs=self.certs.ca,
                           ssl_certfile=self.certs.client.cert,
                           ssl_keyfile=self.certs.client.key, socket_timeout=10)


@pytest.fixture
def tls_cluster(tmp_path):
    """Two shards of one primary each, known by their TLS ports; the
    second node trusts the test's CA, or another one."""
    certs = make_certs(str(tmp_path))
    nodes: list[TlsNode] = []

    def start(second_trusts_other_ca: bool = False) -> list[TlsNode]:
        plain, tls = free_ports(2), free_ports(2)
        map_path = os.path.join(str(tmp_path), "map.toml")
        with open(map_path, "w") as f:
            f.write(static_map_text([[p] for p in tls]))
        for i, ca in enumerate((certs.ca, certs.other_ca if second_trusts_other_ca
                                else certs.ca)):
            nodes.append(TlsNode(plain[i], tls[i], map_path, certs, ca))
        return nodes

    yield start
    for node in nodes:
        node.proc.stop()


def key_of_shard(shard: int) -> str:
    return next(k for k in (f"k{i}" for i in range(1000))
                if keyslot(k.encode()) * 2 // 16384 == shard)


def test_clients_are_sent_to_tls_ports_and_rules_go_to_the_other_primary_over_tls(tls_cluster):
    a, b = tls_cluster()
    with a.tls_client() as c:
        slots = c.execute_command("CLUSTER", "SLOTS")
        assert sorted(int(entry[2][1]) for entry in slots) == sorted([a.tls_port, b.tls_port])
        key = key_of_shard(1)
        with pytest.raises(redis.exceptions.MovedError,     # redis-py drops the "MOVED"
                           match=f"^{keyslot(key.encode())} 127.0.0.1:{b.tls_port}$"):
            c.execute_command("CL.CHECK", key, 5, 1)
        assert c.execute_command("CL.RULE", "SET", "x", RULE) == b"OK"
    with b.tls_client() as c:
        assert json.loads(c.execute_command("CL.RULE", "GET", "x"))["capacity"] == 2
        assert c.info("cluster")["cluster_peer_failures"] == 0


def test_a_peer_whose_certificate_this_node_does_not_trust_is_not_reached(tls_cluster):
    a, b = tls_cluster(second_trusts_other_ca=True)
    # b trusts no certificate of a's CA: a rule change made on b cannot
    # reach a, so it is refused, naming a, and nothing changes.
    with Wire.to(b.proc.port) as w:
        message = w.call("CL.RULE", "SET", "x", RULE).decode()
    assert message.startswith("-CLUSTERDOWN rule change refused, nothing changed")
    assert f"127.0.0.1:{a.tls_port}" in message
    with a.tls_client() as c:
        assert c.execute_command("CL.RULE", "GET", "x") is None


def test_tls_cluster_needs_tls_port():
    out = subprocess.run([PYTHON, "-m", "fastlimit.server", "--port", "0", "--tls-cluster",
                          "yes"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "tls-cluster needs tls-port" in out.stderr
