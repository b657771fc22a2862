"""The HTTP rules API in cluster mode (real nodes, tests/support/cluster_rig.py):
a change over HTTP is in force on every primary before the reply, a
precondition is checked against the cluster's rules, and a change with
a primary away is a 503 CLUSTERDOWN problem that changes nothing, its
reply keeping its place among pipelined ones."""

from __future__ import annotations

import json
import signal

import pytest
from cluster_rig import FastlimitCluster
from http_rules import RULE, Node, pipelined
from servers import ServerProcess
from wire import free_port


class HttpCluster(FastlimitCluster):
    """The test rig's cluster with an HTTP port on every node."""

    def node_args(self, port: int) -> list[str]:
        self.http_ports = getattr(self, "http_ports", {})
        self.http_ports[port] = free_port()
        return [*super().node_args(port), "--http-port", str(self.http_ports[port])]

    def node(self, process: ServerProcess) -> Node:
        return Node(process, self.http_ports[process.port])


@pytest.fixture
def cluster(tmp_path):
    c = HttpCluster(str(tmp_path), 3, 0)
    yield c
    c.stop()


def test_in_cluster_mode_a_put_is_in_force_on_every_primary_before_the_reply(cluster):
    a, b, c = (cluster.node(p) for p in cluster.primaries)
    put = b("PUT", "/v1/rules/orders", RULE)
    assert put.status == 201
    for node in (a, b, c):
        assert node.resp("CL.RULE", "GET", "orders") == put.body
        assert node("GET", "/v1/rules/orders").headers["etag"] == put.headers["etag"]
    # A precondition is checked against the cluster's rules, wherever it is sent.
    assert a("PUT", "/v1/rules/orders", RULE, {"If-None-Match": "*"}).status == 412
    assert c("DELETE", "/v1/rules/orders", headers={"If-Match": put.headers["etag"]}
             ).status == 204
    for node in (a, b, c):
        assert node.resp("CL.RULE", "GET", "orders") is None


def test_in_cluster_mode_a_change_with_a_primary_away_is_a_503_and_changes_nothing(cluster):
    a, b, c = (cluster.node(p) for p in cluster.primaries)
    cluster.primaries[2].proc.send_signal(signal.SIGSTOP)
    try:
        # The GET behind the waiting PUT on one connection is answered after it.
        refused, listing = pipelined(a.port, ("PUT", "/v1/rules/orders",
                                              json.dumps(RULE).encode()),
                                     ("GET", "/v1/rules", b""))
    finally:
        cluster.primaries[2].proc.send_signal(signal.SIGCONT)
    assert refused.status == 503
    problem = refused.problem()
    assert problem["code"] == "CLUSTERDOWN"
    assert problem["detail"].startswith("rule change refused, nothing changed: primaries "
                                        "not reachable: ")
    assert f"127.0.0.1:{c.process.port}" in problem["detail"]
    assert listing.json()["rules"] == []
    for node in (a, b, c):
        assert node.resp("CL.RULE", "GET", "orders") is None

