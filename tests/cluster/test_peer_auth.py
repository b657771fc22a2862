"""Peers prove who they are (cluster/peers.py, CL.PEERAUTH): a node sends no
password to an address of its map and takes no map or rules from it until
it proved it knows cluster-user's password; a node refuses a peer that
does not, either way, and a proof is good for one connection only.  Real
nodes; the impostor is a small real RESP server on 127.0.0.1 that answers
as the adversarial pass's fake did (finding 9)."""

from __future__ import annotations

import hashlib
import json
import socket
import threading

import pytest
import redis
from cluster_rig import (
    CLUSTER_PASSWORD,
    CLUSTER_USER,
    FastlimitCluster,
    cluster_auth_args,
    static_map_text,
)
from servers import ServerProcess
from wire import Wire, command, free_port, wait_until

from fastlimit.cluster.peers import CALLED, CALLER, password_key, proof

LOGIN = {"match": {"resource": "POST /login"}, "capacity": 5, "refill_per_second": 1}
OTHER = json.dumps({"match": {"resource": "GET /x"}, "capacity": 2, "refill_per_second": 1})
REQUIREPASS = "client-secret"
ORIGIN = "f" * 40


def parse_command(buf: bytes) -> tuple[list[bytes], bytes] | None:
    """One RESP multibulk command off the front of buf, or None while
    incomplete (what a node sends is always multibulk)."""
    line, sep, rest = buf.partition(b"\r\n")
    if not sep:
        return None
    args = []
    for _ in range(int(line[1:])):
        head, sep, rest = rest.partition(b"\r\n")
        size = int(head[1:]) if sep else -1
        if size < 0 or len(rest) < size + 2:
            return None
        args.append(rest[:size])
        rest = rest[size + 2:]
    return args, rest


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class FakePeer:
    """Listens at 127.0.0.1 as a node of the map would, keeps every byte it
    is sent, and claims newer rules (version 999: none at all) and a newer
    map (map_text, version 2).  answer_proof(args) answers CL.PEERAUTH
    PROVE: by default +OK, as a fake that knows no password does."""

    def __init__(self, answer_proof=lambda args: b"+OK\r\n"):
        self.answer_proof = answer_proof
        self.map_text = ""
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return            # closed
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            conn.settimeout(10)
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self._lock:
                    self.received += data
                buf += data
                while (parsed := parse_command(buf)) is not None:
                    args, buf = parsed
                    conn.sendall(self.reply(args))

    def reply(self, args: list[bytes]) -> bytes:
        words = [a.upper() for a in args[:2]]
        if words[0] == b"HELLO":
            return b"%2\r\n+server\r\n+fake\r\n+proto\r\n:3\r\n"
        if words == [b"CL.CLUSTER", b"VERSIONS"]:
            return b"*3\r\n:2\r\n:999\r\n" + bulk(ORIGIN.encode())
        if words == [b"CL.CLUSTER", b"MAP"]:
            return bulk(self.map_text.encode())
        if words == [b"CL.CLUSTER", b"RULES"]:
            return b"*3\r\n:999\r\n" + bulk(ORIGIN.encode()) + bulk(b"[]")
        if words == [b"CL.PEERAUTH", b"CHALLENGE"]:
            return bulk(b"the-fake's-challenge")
        if words == [b"CL.PEERAUTH", b"PROVE"]:
            return self.answer_proof(args)
        return b"+OK\r\n"

    def close(self) -> None:
        self.sock.close()


def own_proof(fake: FakePeer, nonce_of):
    """An answer_proof that knows the password: the called side's proof,
    for the exchange's nonce or (a replay) another one."""
    def answer_proof(args: list[bytes]) -> bytes:
        _, _, user, challenge, nonce, _ = args
        return bulk(proof(password_key(CLUSTER_PASSWORD.encode()), CALLED, user.decode(),
                          f"127.0.0.1:{fake.port}", challenge, nonce_of(nonce)))
    return answer_proof


@pytest.fixture
def node_beside(tmp_path):
    """start(fake) -> a node whose map names itself (shard fl-0) and the
    fake (fl-1's primary), with requirepass, the cluster's credentials and
    a login rule from its rules file."""
    started: list = []

    def start(fake: FakePeer) -> ServerProcess:
        port = free_port()
        map_path = tmp_path / "map.toml"
        map_path.write_text(static_map_text([[port], [fake.port]]))
        fake.map_text = static_map_text([[port], [fake.port]], version=2)
        rules = tmp_path / "rules.json"
        rules.write_text(json.dumps({"rules": {"login": LOGIN}}))
        node = ServerProcess("--port", str(port), "--cluster-enabled", "yes",
                             "--cluster-config-file", str(map_path), "--rules-file",
                             str(rules), *cluster_auth_args(str(tmp_path),
                                                            requirepass=REQUIREPASS))
        started.append((node.start(), fake))
        return node

    yield start
    for node, fake in started:
        node.stop()
        fake.close()


def map_version(node) -> int:
    with node.client(password=REQUIREPASS) as c:
        return c.execute_command("CL.CLUSTER", "VERSIONS")[0]


def rule_ids(node) -> list[str]:
    with node.client(password=REQUIREPASS) as c:
        return sorted(rule.decode() for rule in c.execute_command("CL.RULE", "LIST"))


def change_a_rule(node) -> str:
    with Wire.to(node.port) as w:
        assert w.call("AUTH", REQUIREPASS) == b"+OK\r\n"
        return w.call("CL.RULE", "SET", "other", OTHER).decode()


def secrets_in(data: bytes) -> list[bytes]:
    """Which of the passwords, or their SHA-256 (hex or raw: what an ACL
    keeps), data holds."""
    found = []
    for secret in (REQUIREPASS.encode(), CLUSTER_PASSWORD.encode()):
        digest = hashlib.sha256(secret)
        found += [s for s in (secret, digest.hexdigest().encode(), digest.digest())
                  if s in data]
    return found


def test_a_fake_peer_in_the_map_learns_no_password_and_changes_no_rule(node_beside):
    fake = FakePeer()
    node = node_beside(fake)       # caught up at start: the fake was asked first
    assert rule_ids(node) == ["login"]
    assert map_version(node) == 1
    # a rule change asks every primary for its rules first: the fake's
    # newer (empty) ones are not taken, and the change is refused
    message = change_a_rule(node)
    assert message.startswith("-CLUSTERDOWN rule change refused, nothing changed")
    assert f"127.0.0.1:{fake.port}" in message
    assert rule_ids(node) == ["login"]
    assert fake.connections >= 2
    assert secrets_in(bytes(fake.received)) == []
    assert b"CL.CLUSTER" not in fake.received and b"HELLO" not in fake.received
    assert b"CL.PEERAUTH" in fake.received
    assert f"cluster: peer 127.0.0.1:{fake.port} refused: it did not prove it knows the " \
           f"password of cluster-user '{CLUSTER_USER}'" in node.log()
    with node.client(password=REQUIREPASS) as c:
        assert c.info("cluster")["cluster_peer_refusals"] >= 2


def test_a_peer_replaying_an_answer_to_another_nonce_is_refused(node_beside):
    fake = FakePeer()
    fake.answer_proof = own_proof(fake, lambda nonce: b"an-earlier-nonce")
    node = node_beside(fake)
    assert change_a_rule(node).startswith("-CLUSTERDOWN rule change refused")
    assert rule_ids(node) == ["login"]
    assert map_version(node) == 1
    assert b"CL.CLUSTER" not in fake.received


def test_a_peer_that_answers_the_challenge_is_believed(node_beside):
    """The same fake, knowing the password: its newer map and rules are
    taken at start (so the refusals above are the proofs', not the fake's
    replies')."""
    fake = FakePeer()
    fake.answer_proof = own_proof(fake, lambda nonce: nonce)
    node = node_beside(fake)
    assert rule_ids(node) == []
    assert map_version(node) == 2
    assert b"CL.CLUSTER" in fake.received
    assert secrets_in(bytes(fake.received)) == []


def test_a_peer_with_the_wrong_cluster_password_is_refused_both_ways(tmp_path):
    ports = [free_port(), free_port()]
    map_path = tmp_path / "map.toml"
    map_path.write_text(static_map_text([[p] for p in ports]))
    a, b = (ServerProcess("--port", str(port), "--manual-clock", "--cluster-enabled", "yes",
                          "--cluster-config-file", str(map_path),
                          *cluster_auth_args(str(tmp_path), password)).start()
            for port, password in zip(ports, (CLUSTER_PASSWORD, "a-wrong-one"), strict=True))
    try:
        for version, (here, there) in enumerate(((a, b), (b, a)), 2):
            with Wire.to(here.port) as w:
                message = w.call("CL.RULE", "SET", "x", OTHER).decode()
                assert message.startswith("-CLUSTERDOWN rule change refused")
                assert f"127.0.0.1:{there.port}" in message
                newer_map = static_map_text([[p] for p in ports], version=version)
                assert w.call("CL.CLUSTER", "PUSH", newer_map).startswith(b"-ERR slot map")
            with there.client() as c:
                assert c.execute_command("CL.RULE", "GET", "x") is None
                assert c.execute_command("CL.CLUSTER", "VERSIONS")[0] < version
                entry = c.acl_log()[0]
                assert (entry["username"], entry["object"]) == (CLUSTER_USER, "cl.peerauth")
            wait_until(lambda here=here, there=there: f"cluster: peer 127.0.0.1:{there.port} "
                       "refused: it refused this node's proof" in here.log(),
                       what="the refusal in the log")
    finally:
        a.stop()
        b.stop()


def test_nodes_that_know_the_cluster_password_hand_rules_and_maps_across(tmp_path):
    cluster = FastlimitCluster(str(tmp_path), 2, 0)
    try:
        a, b = cluster.primaries
        with a.client() as c:
            assert c.execute_command("CL.RULE", "SET", "x", OTHER) == b"OK"
            assert c.execute_command("CL.CLUSTER", "PUSH", static_map_text(
                cluster.ports, version=2)) == b"OK"
        with b.client() as c:
            assert json.loads(c.execute_command("CL.RULE", "GET", "x"))["capacity"] == 2
            assert c.execute_command("CL.CLUSTER", "VERSIONS")[0] == 2
            links = [line for line in c.execute_command("CLIENT", "LIST").splitlines()
                     if b" user=fl-cluster " in line]
            assert links         # a's calls run as the link user
            assert c.info("cluster")["cluster_peer_refusals"] == 0
    finally:
        cluster.stop()


def prove(w: Wire, port: int, challenge: bytes, address: str | None = None) -> bytes:
    nonce = b"the-caller's-nonce"
    given = proof(password_key(CLUSTER_PASSWORD.encode()), CALLER, CLUSTER_USER,
                  address or f"127.0.0.1:{port}", challenge, nonce)
    return w.call("CL.PEERAUTH", "PROVE", CLUSTER_USER, challenge, nonce, given)


def challenge_of(w: Wire) -> bytes:
    reply = w.call("CL.PEERAUTH", "CHALLENGE")
    return reply.split(b"\r\n")[1]


def test_a_proof_is_good_for_its_own_connection_and_node_only(fl_one_node):
    node = fl_one_node
    with Wire.to(node.port) as first, Wire.to(node.port) as second:
        challenge = challenge_of(first)
        answer = prove(first, node.port, challenge)
        expected = proof(password_key(CLUSTER_PASSWORD.encode()), CALLED, CLUSTER_USER,
                         f"127.0.0.1:{node.port}", challenge, b"the-caller's-nonce")
        assert answer == bulk(expected)
        # it runs as the link user: its commands, and nothing else
        assert first.call("CL.CLUSTER", "VERSIONS").startswith(b"*3\r\n")
        assert first.call("ACL", "WHOAMI").startswith(b"-NOPERM")
        # replayed on another connection: the old challenge, or the old
        # proof for that connection's own challenge
        second.send(command("CL.PEERAUTH", "PROVE", CLUSTER_USER, challenge,
                            b"the-caller's-nonce", answer.split(b"\r\n")[1]))
        assert second.read_reply().startswith(b"-WRONGPASS")
        assert prove(second, node.port, challenge).startswith(b"-WRONGPASS")
        fresh = challenge_of(second)
        assert prove(second, node.port, fresh, address="127.0.0.1:1").startswith(b"-WRONGPASS")
        assert second.call("ACL", "WHOAMI") == bulk(b"default")


@pytest.fixture
def fl_one_node(tmp_path):
    cluster = FastlimitCluster(str(tmp_path), 1, 0)
    yield cluster.primaries[0]
    cluster.stop()


def test_cluster_mode_off_loopback_needs_the_cluster_password(tmp_path):
    map_path = tmp_path / "map.toml"
    map_path.write_text(static_map_text([[free_port()]]))
    # 192.0.2.1 (TEST-NET-1) is no address of this host: nothing is bound
    node = ServerProcess("--bind", "192.0.2.1", "--cluster-enabled", "yes",
                         "--cluster-config-file", str(map_path))
    with pytest.raises(RuntimeError, match="needs cluster-user and cluster-password"):
        node.start()


def test_without_the_cluster_password_a_node_stays_on_loopback_and_says_so(tmp_path):
    port = free_port()
    map_path = tmp_path / "map.toml"
    map_path.write_text(static_map_text([[port]]))
    node = ServerProcess("--port", str(port), "--cluster-enabled", "yes",
                         "--cluster-config-file", str(map_path)).start()
    try:
        assert "cluster: no cluster-user and cluster-password" in node.log()
        with node.client() as c, pytest.raises(redis.ResponseError, match="cluster-user"):
            c.execute_command("CONFIG", "SET", "bind", "127.0.0.1 192.0.2.1")
    finally:
        node.stop()
